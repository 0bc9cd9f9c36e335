package io.dstl.flink.it;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * A Flink session cluster of separate JVMs, started from flink-dist's entry points the way the
 * distribution's scripts would: one JobManager ({@code StandaloneSessionClusterEntrypoint}) and
 * TaskManagers ({@code TaskManagerRunner}) sharing one {@code conf/config.yaml}. The classpath
 * is flink-dist and log4j only; plugins come from {@code plugins/} in the working directory
 * (also named by {@code FLINK_PLUGINS_DIR}), just as in a real deployment. The cluster is
 * driven through its REST API.
 */
final class StandaloneCluster implements AutoCloseable {

    private static final ObjectMapper JSON = new ObjectMapper();

    /** What bin/config.sh would pass to a Java 17 JVM (Flink's default env.java.opts.all). */
    static final List<String> JVM_OPENS = List.of(
            "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
            "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
            "--add-opens=java.base/java.lang=ALL-UNNAMED",
            "--add-opens=java.base/java.net=ALL-UNNAMED",
            "--add-opens=java.base/java.io=ALL-UNNAMED",
            "--add-opens=java.base/java.nio=ALL-UNNAMED",
            "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
            "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
            "--add-opens=java.base/java.text=ALL-UNNAMED",
            "--add-opens=java.base/java.time=ALL-UNNAMED",
            "--add-opens=java.base/java.util=ALL-UNNAMED",
            "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
            "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
            "--add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED");

    private final Path workDir;
    private final Path confDir;
    private final Path logDir;
    private final String classpath;
    private final int restPort;
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private Process jobManager;
    private final Map<String, Process> taskManagers = new LinkedHashMap<>();
    private final Thread shutdownHook = new Thread(this::destroyAll, "standalone-cluster-shutdown");

    private StandaloneCluster(Path workDir, String classpath, int restPort) {
        this.workDir = workDir;
        this.confDir = workDir.resolve("conf");
        this.logDir = workDir.resolve("log");
        this.classpath = classpath;
        this.restPort = restPort;
    }

    /**
     * Writes the configuration, installs {@code pluginJar} (if any) as {@code plugins/dstl/},
     * and starts the JobManager.
     */
    static StandaloneCluster create(Path workDir, Path flinkLib, Path pluginJar, Map<String, String> config)
            throws IOException {
        List<Path> jars = new ArrayList<>();
        jars.add(flinkLib.resolve("flink-dist-2.3.0.jar"));
        try (Stream<Path> s = Files.list(flinkLib)) {
            s.filter(f -> f.getFileName().toString().matches("log4j-(api|core|slf4j-impl|1\\.2-api)-.*\\.jar"))
                    .sorted()
                    .forEach(jars::add);
        }
        for (Path j : jars) {
            if (!Files.isRegularFile(j)) {
                throw new IOException("missing " + j);
            }
        }
        String cp = jars.stream().map(Path::toString).collect(Collectors.joining(java.io.File.pathSeparator));
        int rpcPort = freePort(-1);
        int restPort = freePort(rpcPort);
        StandaloneCluster c = new StandaloneCluster(workDir, cp, restPort);
        Files.createDirectories(c.confDir);
        Files.createDirectories(c.logDir);
        if (pluginJar != null) {
            Path dstl = Files.createDirectories(workDir.resolve("plugins").resolve("dstl"));
            Files.copy(pluginJar, dstl.resolve(pluginJar.getFileName()));
        } else {
            Files.createDirectories(workDir.resolve("plugins"));
        }

        Map<String, String> conf = new LinkedHashMap<>();
        // Everything on loopback; the ports the test does not need to know are picked when bound.
        for (String key : List.of("jobmanager.rpc.address", "jobmanager.bind-host", "taskmanager.bind-host",
                "taskmanager.host", "rest.address", "rest.bind-address")) {
            conf.put(key, "localhost");
        }
        conf.put("jobmanager.rpc.port", String.valueOf(rpcPort));
        conf.put("rest.port", String.valueOf(restPort));
        for (String key : List.of("blob.server.port", "taskmanager.rpc.port", "taskmanager.data.port",
                "metrics.internal.query-service.port")) {
            conf.put(key, "0");
        }
        conf.put("jobmanager.memory.process.size", "1024m");
        // What taskmanager.sh derives from taskmanager.memory.process.size; TaskManagerRunner
        // started directly needs the components spelled out (and the JVM sized to match).
        conf.put("taskmanager.cpu.cores", "2");
        conf.put("taskmanager.memory.framework.heap.size", "128m");
        conf.put("taskmanager.memory.task.heap.size", "384m");
        conf.put("taskmanager.memory.managed.size", "128m");
        conf.put("taskmanager.memory.framework.off-heap.size", "128m");
        conf.put("taskmanager.memory.task.off-heap.size", "64m");
        conf.put("taskmanager.memory.network.min", "64m");
        conf.put("taskmanager.memory.network.max", "64m");
        conf.put("taskmanager.memory.jvm-metaspace.size", "256m");
        conf.put("taskmanager.memory.jvm-overhead.min", "192m");
        conf.put("taskmanager.memory.jvm-overhead.max", "192m");
        // A killed TaskManager is noticed within seconds, not after the default 50 s.
        conf.put("heartbeat.interval", "1000");
        conf.put("heartbeat.timeout", "5000");
        conf.put("cluster.evenly-spread-out-slots", "true");
        // The REST API caches job and checkpoint statistics for 3 s by default; the test polls
        // them to decide when to kill a TaskManager.
        conf.put("rest.cache.checkpoint-statistics.timeout", "200ms");
        conf.put("rest.cache.execution-graph.timeout", "200ms");
        conf.put("web.refresh-interval", "200ms");
        conf.putAll(config);
        StringBuilder yaml = new StringBuilder("# written by the dstl integration tests\n");
        conf.forEach((k, v) -> yaml.append(k).append(": ").append(yamlValue(v)).append('\n'));
        Files.writeString(c.confDir.resolve("config.yaml"), yaml.toString());
        Files.writeString(c.confDir.resolve("log4j.properties"), String.join("\n",
                "rootLogger.level = INFO",
                "rootLogger.appenderRef.file.ref = file",
                "appender.file.type = File",
                "appender.file.name = file",
                "appender.file.fileName = ${sys:log.file}",
                "appender.file.layout.type = PatternLayout",
                "appender.file.layout.pattern = %d{HH:mm:ss,SSS} %-5p %-60c [%t] %m%n",
                ""));

        Runtime.getRuntime().addShutdownHook(c.shutdownHook);
        c.jobManager = c.startJvm("jobmanager", List.of("-Xmx512m", "-Xms512m"),
                "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint", List.of());
        return c;
    }

    /** Starts one TaskManager JVM whose resource id (as the REST API shows it) is {@code id}. */
    void startTaskManager(String id) throws IOException {
        // -Xmx = framework + task heap, direct memory = framework + task off-heap + network.
        Process p = startJvm(id,
                List.of("-Xmx512m", "-Xms512m", "-XX:MaxDirectMemorySize=256m", "-XX:MaxMetaspaceSize=256m"),
                "org.apache.flink.runtime.taskexecutor.TaskManagerRunner",
                List.of("-Dtaskmanager.resource-id=" + id));
        taskManagers.put(id, p);
    }

    private Process startJvm(String name, List<String> memory, String mainClass, List<String> args)
            throws IOException {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        cmd.addAll(memory);
        cmd.addAll(JVM_OPENS);
        // A temporary directory per process inside the cluster's directory: whatever a killed
        // process leaves behind (it cannot clean up after SIGKILL) goes away with the test.
        cmd.add("-Djava.io.tmpdir=" + Files.createDirectories(tmpDir(name)));
        cmd.add("-Dlog.file=" + logDir.resolve(name + ".log"));
        cmd.add("-Dlog4j.configurationFile=" + confDir.resolve("log4j.properties").toUri());
        cmd.add("-cp");
        cmd.add(classpath);
        cmd.add(mainClass);
        cmd.add("--configDir");
        cmd.add(confDir.toString());
        cmd.addAll(args);
        ProcessBuilder pb = new ProcessBuilder(cmd)
                .directory(workDir.toFile())
                .redirectErrorStream(true)
                .redirectOutput(logDir.resolve(name + ".out").toFile());
        pb.environment().put("FLINK_CONF_DIR", confDir.toString());
        pb.environment().put("FLINK_PLUGINS_DIR", workDir.resolve("plugins").toString());
        pb.environment().put("FLINK_LOG_DIR", logDir.toString());
        return pb.start();
    }

    /** Waits until {@code taskManagers} TaskManagers with {@code slots} slots in total are registered. */
    void awaitTaskManagers(int count, int slots, Duration timeout) throws Exception {
        awaitJson("/overview", o -> o.path("taskmanagers").asInt() == count && o.path("slots-total").asInt() == slots,
                timeout, "cluster with " + count + " TaskManagers and " + slots + " slots");
    }

    /** Uploads {@code jar} and runs {@code mainClass} with {@code args}; returns the job id. */
    String submit(Path jar, String mainClass, List<String> args, int parallelism) throws Exception {
        String boundary = "----dstl" + UUID.randomUUID();
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        writeAscii(body, "--" + boundary + "\r\nContent-Disposition: form-data; name=\"jarfile\"; filename=\""
                + jar.getFileName() + "\"\r\nContent-Type: application/x-java-archive\r\n\r\n");
        body.write(Files.readAllBytes(jar));
        writeAscii(body, "\r\n--" + boundary + "--\r\n");
        JsonNode upload = request(HttpRequest.newBuilder(uri("/jars/upload"))
                .header("Content-Type", "multipart/form-data; boundary=" + boundary)
                .POST(HttpRequest.BodyPublishers.ofByteArray(body.toByteArray())), 200);
        String filename = upload.path("filename").asText();
        String jarId = Path.of(filename).getFileName().toString();

        Map<String, Object> run = new LinkedHashMap<>();
        run.put("entryClass", mainClass);
        run.put("programArgsList", args);
        run.put("parallelism", parallelism);
        JsonNode started = request(HttpRequest.newBuilder(uri("/jars/" + jarId + "/run"))
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(JSON.writeValueAsString(run))), 200);
        return started.path("jobid").asText();
    }

    JsonNode get(String path) throws Exception {
        return request(HttpRequest.newBuilder(uri(path)).GET(), 200);
    }

    /** Polls {@code path} until {@code done} holds; fails after {@code timeout} with the last answer. */
    JsonNode awaitJson(String path, Predicate<JsonNode> done, Duration timeout, String what) throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        String last = "(no answer)";
        while (System.nanoTime() < deadline) {
            assertJobManagerAlive();
            try {
                JsonNode n = get(path);
                last = n.toString();
                if (done.test(n)) {
                    return n;
                }
            } catch (IOException | IllegalStateException e) {
                last = e.toString(); // not up yet
            }
            Thread.sleep(200);
        }
        throw new AssertionError("timed out after " + timeout + " waiting for " + what + "; last " + path + ": "
                + abbreviate(last) + "\n" + logTails());
    }

    /** SIGKILL: the JVM gets no chance to clean up, as when a machine dies. */
    void killTaskManager(String id) throws InterruptedException {
        Process p = taskManagers.get(id);
        p.destroyForcibly();
        if (!p.waitFor(30, TimeUnit.SECONDS)) {
            throw new AssertionError("TaskManager " + id + " survived SIGKILL");
        }
    }

    boolean isAlive(String id) {
        return taskManagers.get(id).isAlive();
    }

    List<String> taskManagerIds() {
        return new ArrayList<>(taskManagers.keySet());
    }

    private void assertJobManagerAlive() {
        if (!jobManager.isAlive()) {
            throw new AssertionError("the JobManager process exited with " + jobManager.exitValue() + "\n"
                    + logTails());
        }
    }

    /** The last lines of every process's output and log, for failure messages. */
    String logTails() {
        StringBuilder sb = new StringBuilder();
        try (Stream<Path> s = Files.list(logDir)) {
            for (Path f : s.sorted().collect(Collectors.toList())) {
                List<String> lines = Files.readAllLines(f, StandardCharsets.UTF_8);
                List<String> interesting = lines.stream()
                        .filter(l -> l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("Exception")
                                || l.startsWith("Caused by"))
                        .collect(Collectors.toList());
                List<String> tail = interesting.subList(Math.max(0, interesting.size() - 15), interesting.size());
                sb.append("--- ").append(f).append(" (").append(lines.size()).append(" lines; last warnings/errors):\n");
                tail.forEach(l -> sb.append("    ").append(abbreviate(l)).append('\n'));
            }
        } catch (IOException e) {
            sb.append("(logs unavailable: ").append(e).append(")\n");
        }
        return sb.toString();
    }

    /** The {@code java.io.tmpdir} of process {@code name} ("jobmanager", a TaskManager id). */
    Path tmpDir(String name) {
        return workDir.resolve("tmp").resolve(name);
    }

    Path logDir() {
        return logDir;
    }

    /** Whether any line of the log of {@code process} ("jobmanager", a TaskManager id) contains {@code text}. */
    boolean logContains(String process, String text) throws IOException {
        Path log = logDir.resolve(process + ".log");
        if (!Files.exists(log)) {
            return false;
        }
        try (Stream<String> lines = Files.lines(log, StandardCharsets.UTF_8)) {
            return lines.anyMatch(l -> l.contains(text));
        }
    }

    /**
     * Copies the logs to {@code -Ddstl.it.log-dir}/{@code name} if that property is set (by
     * flink/test.sh), so that they outlive the temporary directory.
     */
    void keepLogs(String name) {
        String target = System.getProperty("dstl.it.log-dir");
        if (target == null) {
            return;
        }
        try {
            Path dest = Files.createDirectories(Path.of(target).resolve(name.replaceAll("[^A-Za-z0-9._-]+", "_")));
            try (Stream<Path> s = Files.list(logDir)) {
                for (Path f : s.collect(Collectors.toList())) {
                    Files.copy(f, dest.resolve(f.getFileName()), java.nio.file.StandardCopyOption.REPLACE_EXISTING);
                }
            }
            Files.copy(confDir.resolve("config.yaml"), dest.resolve("config.yaml"),
                    java.nio.file.StandardCopyOption.REPLACE_EXISTING);
        } catch (IOException e) {
            System.err.println("could not keep the cluster logs: " + e);
        }
    }

    /** Stops every process: SIGTERM, then SIGKILL for those still alive after 15 s. */
    @Override
    public void close() {
        destroyAll();
        try {
            Runtime.getRuntime().removeShutdownHook(shutdownHook);
        } catch (IllegalStateException shuttingDown) {
            // the hook is running or has run
        }
    }

    private void destroyAll() {
        List<Process> all = new ArrayList<>(taskManagers.values());
        if (jobManager != null) {
            all.add(jobManager);
        }
        all.forEach(Process::destroy);
        for (Process p : all) {
            try {
                if (!p.waitFor(15, TimeUnit.SECONDS)) {
                    p.destroyForcibly();
                    p.waitFor(15, TimeUnit.SECONDS);
                }
            } catch (InterruptedException e) {
                p.destroyForcibly();
                Thread.currentThread().interrupt();
            }
        }
    }

    /** Processes of this cluster that are still alive (should be none after {@link #close}). */
    List<Long> alivePids() {
        List<Process> all = new ArrayList<>(taskManagers.values());
        if (jobManager != null) {
            all.add(jobManager);
        }
        return all.stream().filter(Process::isAlive).map(Process::pid).collect(Collectors.toList());
    }

    private JsonNode request(HttpRequest.Builder b, int expectedStatus) throws Exception {
        HttpResponse<String> r = http.send(b.timeout(Duration.ofSeconds(30)).build(),
                HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() != expectedStatus) {
            throw new IllegalStateException("HTTP " + r.statusCode() + " from " + r.uri() + ": "
                    + abbreviate(r.body()));
        }
        return JSON.readTree(r.body());
    }

    private URI uri(String path) {
        return URI.create("http://localhost:" + restPort + path);
    }

    private static void writeAscii(OutputStream out, String s) {
        try {
            out.write(s.getBytes(StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private static String yamlValue(String v) {
        // Quote anything YAML could read as something other than a plain string.
        return v.matches("[A-Za-z0-9_./:,-]+") && !v.contains(": ") ? v : "'" + v.replace("'", "''") + "'";
    }

    private static String abbreviate(String s) {
        return s.length() > 2000 ? s.substring(0, 2000) + "..." : s;
    }

    /**
     * A free loopback port other than {@code except}, below the kernel's ephemeral range. The
     * JobManager binds its REST port only after its RPC port, while the TaskManagers already
     * connect; a port from the ephemeral range can meanwhile become the local end of one of
     * those connections, and the JobManager then fails with a BindException.
     */
    static int freePort(int except) throws IOException {
        int below = 32768;
        try {
            String[] range = Files.readString(Path.of("/proc/sys/net/ipv4/ip_local_port_range")).trim().split("\\s+");
            below = Integer.parseInt(range[0]);
        } catch (IOException | RuntimeException e) {
            // Not Linux, or an unreadable range: keep the usual lower bound.
        }
        // Above the block Seaweed picks its ports from (21000..23000).
        int low = 24000;
        if (below - low < 1000) {
            try (ServerSocket s = new ServerSocket(0)) {
                return s.getLocalPort();
            }
        }
        for (int attempt = 0; attempt < 1000; attempt++) {
            int p = low + ThreadLocalRandom.current().nextInt(below - low);
            if (p == except) {
                continue;
            }
            try (ServerSocket s = new ServerSocket()) {
                s.bind(new InetSocketAddress("127.0.0.1", p));
                return p;
            } catch (IOException e) {
                // Taken; try another.
            }
        }
        throw new IOException("no free port in " + low + ".." + below);
    }
}
