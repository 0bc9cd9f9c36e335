package io.dstl.flink.it;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Predicate;

/**
 * An HTTP proxy in front of an S3-compatible server that counts requests and, while told to,
 * fails the ones a rule picks with {@code 503 Slow Down} (what S3 answers when it throttles): a
 * store that fails requests for a while. Requests are passed on byte for byte (the client signs
 * the Host header it sent, which the server checks as received), one upstream connection each.
 * Requests are counted by method, and apart for keys under a {@code changelog/} prefix (a dstl
 * storage's lease objects, {@code changelog/<job>/leases/}, apart from those).
 *
 * <p>{@link #main} runs one on its own for {@code bench/flink-job.sh --store s3}.
 */
public final class S3Proxy implements AutoCloseable {
    /** A request as the rules see it. */
    static final class Request {
        final String method;
        final String target;

        Request(String method, String target) {
            this.method = method;
            this.target = target;
        }

        @Override
        public String toString() {
            return method + " " + target;
        }
    }

    private final ServerSocket server;
    private final String upstreamHost;
    private final int upstreamPort;
    private final Thread acceptor;
    private volatile Predicate<Request> failing = r -> false;
    private final Map<String, AtomicLong> passed = new ConcurrentHashMap<>();
    private final AtomicLong failed = new AtomicLong();
    private volatile boolean closed;

    private S3Proxy(ServerSocket server, String upstream) {
        this.server = server;
        URI u = URI.create(upstream);
        this.upstreamHost = u.getHost();
        this.upstreamPort = u.getPort();
        this.acceptor = new Thread(this::accept, "s3-proxy");
        this.acceptor.setDaemon(true);
    }

    /** A proxy on a free loopback port in front of {@code upstream} ({@code http://host:port}). */
    static S3Proxy start(String upstream) throws IOException {
        S3Proxy proxy = new S3Proxy(new ServerSocket(0, 64, InetAddress.getLoopbackAddress()), upstream);
        proxy.acceptor.start();
        return proxy;
    }

    String endpoint() {
        return "http://127.0.0.1:" + server.getLocalPort();
    }

    /** From now on, requests {@code rule} picks fail with 503 until {@link #heal}. */
    void failWhile(Predicate<Request> rule) {
        failing = rule;
    }

    void heal() {
        failing = r -> false;
    }

    /** Requests passed on, by method. */
    long passed(String method) {
        AtomicLong n = passed.get(method);
        return n == null ? 0 : n.get();
    }

    /** Requests passed on for keys under a {@code changelog/} prefix (leases aside), by method. */
    long passedChangelog(String method) {
        AtomicLong n = passed.get(method + " changelog");
        return n == null ? 0 : n.get();
    }

    /**
     * {@code S3Proxy UPSTREAM PORT_FILE COUNTS_FILE}: proxies to {@code UPSTREAM}, writes its
     * endpoint to {@code PORT_FILE} once listening, and its counts as one JSON object to
     * {@code COUNTS_FILE} when the process is told to stop (SIGTERM).
     */
    public static void main(String[] args) throws Exception {
        S3Proxy proxy = start(args[0]);
        java.nio.file.Path counts = java.nio.file.Path.of(args[2]);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            StringBuilder json = new StringBuilder("{");
            String sep = "";
            for (Map.Entry<String, AtomicLong> e : new java.util.TreeMap<>(proxy.passed).entrySet()) {
                json.append(sep).append('"').append(e.getKey()).append("\":").append(e.getValue().get());
                sep = ",";
            }
            json.append('}');
            try {
                java.nio.file.Files.writeString(counts, json.toString());
            } catch (IOException e) {
                System.err.println("[s3-proxy] cannot write the counts: " + e);
            }
        }));
        java.nio.file.Files.writeString(java.nio.file.Path.of(args[1]), proxy.endpoint());
        Thread.currentThread().join();
    }

    long failed() {
        return failed.get();
    }

    private void accept() {
        while (!closed) {
            try {
                Socket client = server.accept();
                Thread t = new Thread(() -> serve(client), "s3-proxy-connection");
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                if (!closed) {
                    System.err.println("[s3-proxy] accept failed: " + e);
                }
                return;
            }
        }
    }

    private void serve(Socket client) {
        try (client) {
            InputStream in = client.getInputStream();
            OutputStream out = client.getOutputStream();
            while (!closed) {
                byte[] head = readHead(in);
                if (head == null) {
                    return;
                }
                String text = new String(head, StandardCharsets.ISO_8859_1);
                String[] lines = text.split("\r\n");
                String[] requestLine = lines[0].split(" ");
                Request request = new Request(requestLine[0], requestLine.length > 1 ? requestLine[1] : "/");
                long length = 0;
                boolean chunked = false;
                List<String> headers = new ArrayList<>();
                for (int i = 1; i < lines.length; i++) {
                    String line = lines[i];
                    if (line.isEmpty()) {
                        continue;
                    }
                    String lower = line.toLowerCase(Locale.ROOT);
                    if (lower.startsWith("content-length:")) {
                        length = Long.parseLong(line.substring(15).trim());
                    } else if (lower.startsWith("transfer-encoding:") && lower.contains("chunked")) {
                        chunked = true;
                    }
                    if (!lower.startsWith("connection:")) {
                        headers.add(line);
                    }
                }
                byte[] body = chunked ? readChunked(in) : in.readNBytes((int) length);
                if (failing.test(request)) {
                    failed.incrementAndGet();
                    byte[] error = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>"
                            + "<Message>injected by the test proxy</Message></Error>").getBytes(StandardCharsets.UTF_8);
                    out.write(("HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: "
                            + error.length + "\r\n\r\n").getBytes(StandardCharsets.ISO_8859_1));
                    out.write(error);
                    out.flush();
                    continue;
                }
                passed.computeIfAbsent(request.method, m -> new AtomicLong()).incrementAndGet();
                if (request.target.contains("/changelog/") && request.target.contains("/leases/")) {
                    // A dstl storage's lease on its job (written at open, refreshed every 30 s).
                    passed.computeIfAbsent(request.method + " lease", m -> new AtomicLong()).incrementAndGet();
                } else if (request.target.contains("/changelog/")) {
                    passed.computeIfAbsent(request.method + " changelog", m -> new AtomicLong()).incrementAndGet();
                }
                try (Socket upstream = new Socket(upstreamHost, upstreamPort)) {
                    OutputStream up = upstream.getOutputStream();
                    StringBuilder forward = new StringBuilder(lines[0]).append("\r\n");
                    for (String h : headers) {
                        forward.append(h).append("\r\n");
                    }
                    forward.append("Connection: close\r\n\r\n");
                    up.write(forward.toString().getBytes(StandardCharsets.ISO_8859_1));
                    up.write(body);
                    up.flush();
                    // The server closes after its response: pass everything on, then end this
                    // connection too (the response says Connection: close).
                    upstream.getInputStream().transferTo(out);
                    out.flush();
                }
                return;
            }
        } catch (IOException e) {
            // The client or the server went away: so does this connection.
        }
    }

    /** The bytes up to and including the blank line, or null at the end of the stream. */
    private static byte[] readHead(InputStream in) throws IOException {
        ByteArrayOutputStream head = new ByteArrayOutputStream();
        int matched = 0;
        while (true) {
            int b = in.read();
            if (b < 0) {
                return head.size() == 0 ? null : head.toByteArray();
            }
            head.write(b);
            matched = (b == "\r\n\r\n".charAt(matched)) ? matched + 1 : (b == '\r' ? 1 : 0);
            if (matched == 4) {
                return head.toByteArray();
            }
        }
    }

    /** A chunked body, re-encoded with its chunk framing (passed on as it came). */
    private static byte[] readChunked(InputStream in) throws IOException {
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        while (true) {
            StringBuilder size = new StringBuilder();
            int b;
            while ((b = in.read()) >= 0 && b != '\n') {
                size.append((char) b);
            }
            body.write((size + "\n").getBytes(StandardCharsets.ISO_8859_1));
            int n = Integer.parseInt(size.toString().trim().split(";")[0], 16);
            body.write(in.readNBytes(n + 2));
            if (n == 0) {
                return body.toByteArray();
            }
        }
    }

    @Override
    public void close() throws IOException {
        closed = true;
        server.close();
    }
}
