package io.dstl.flink.it;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.jar.Attributes;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import java.util.jar.Manifest;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * (f) A real deployment: JobManager and two TaskManagers in their own JVMs, the plugin loaded
 * from {@code plugins/dstl/} by Flink's plugin class loader, the job submitted as a jar through
 * the REST API and running in the TaskManagers' user-code class loaders. After some
 * checkpoints one TaskManager is killed with SIGKILL; the job must restore on the survivor
 * (2 slots, enough for parallelism 2) and finish with exact state.
 */
@Timeout(300)
class ProcessClusterTest extends JobTest {

    @EachStorage
    void jobSurvivesKilledTaskManager(String storage) throws Exception {
        String label = "(f) process cluster, TaskManager killed, " + storage;
        // Long enough that the kill and the failover (noticed within the heartbeat timeout)
        // happen well before the input ends.
        ChangelogTestJob.Params p = params(600, 600);
        Map<String, String> config = changelog(storage);
        config.put("taskmanager.numberOfTaskSlots", "2");
        Path jar = buildJobJar(dir.resolve("dstl-test-job.jar"));
        Path plugin = storage.equals(TestSettings.DSTL) ? TestSettings.pluginJar() : null;

        long start = System.nanoTime();
        StandaloneCluster cluster = StandaloneCluster.create(dir.resolve("cluster"), TestSettings.flinkLib(), plugin,
                config);
        try {
            cluster.startTaskManager("tm-1");
            cluster.startTaskManager("tm-2");
            cluster.awaitTaskManagers(2, 4, Duration.ofSeconds(90));
            Scenarios.note(label, String.format("cluster up after %.1f s", (System.nanoTime() - start) / 1e9));

            String job = cluster.submit(jar, ChangelogTestJob.class.getName(), p.toArgs(), 2);
            String checkpointsPath = "/jobs/" + job + "/checkpoints";
            awaitCompletedCheckpoints(cluster, job, 4, Duration.ofSeconds(90));
            Scenarios.assertChangelogWritten(config, label);

            String victim = taskManagerRunning(cluster, job, "state-updater");
            long killedAt = System.nanoTime();
            cluster.killTaskManager(victim);
            Scenarios.note(label, "killed " + victim + " (SIGKILL) after "
                    + cluster.get(checkpointsPath).path("counts").path("completed").asInt() + " checkpoints");

            JsonNode done = cluster.awaitJson("/jobs/" + job, j -> terminal(j.path("state").asText()),
                    Duration.ofSeconds(180), "job " + job + " to terminate");
            String exceptions = rootExceptions(cluster, job);
            if (!"FINISHED".equals(done.path("state").asText())) {
                throw new AssertionError(label + ": job ended as " + done.path("state").asText() + "\n" + exceptions
                        + cluster.logTails());
            }
            JsonNode counts = cluster.get(checkpointsPath).path("counts");
            Scenarios.note(label, String.format("job finished %.1f s after the kill; checkpoints completed=%d"
                            + " failed=%d restored=%d; failovers:%n%s", (System.nanoTime() - killedAt) / 1e9,
                    counts.path("completed").asInt(), counts.path("failed").asInt(),
                    counts.path("restored").asInt(), exceptions));
            List<String> unrelated = failoversNotCausedBy(cluster, job, victim);
            if (!unrelated.isEmpty()) {
                throw new AssertionError(label + ": failovers other than the loss of " + victim + ":\n"
                        + String.join("\n", unrelated));
            }
            if (counts.path("restored").asInt() < 1) {
                throw new AssertionError(label + ": the job finished without restoring a checkpoint\n" + exceptions);
            }
            if (!cluster.isAlive(survivor(cluster, victim))) {
                throw new AssertionError(label + ": the surviving TaskManager died too\n" + cluster.logTails());
            }
            if (storage.equals(TestSettings.DSTL)) {
                // The classpath has no dstl classes: this line proves plugins/dstl/ was used.
                boolean opened = false;
                for (String tm : cluster.taskManagerIds()) {
                    opened |= cluster.logContains(tm, "dstl changelog storage for job " + job);
                }
                if (!opened) {
                    throw new AssertionError(label + ": no TaskManager log shows dstl opening a storage for " + job
                            + ", so the job did not use the plugin from plugins/dstl/\n" + cluster.logTails());
                }
            }
            ExpectedResults.verify(p, Path.of(p.outputDir), label);
        } finally {
            cluster.close();
            cluster.keepLogs("process-cluster-" + storage);
            List<Long> alive = cluster.alivePids();
            if (!alive.isEmpty()) {
                throw new AssertionError(label + ": processes still alive after shutdown: " + alive);
            }
        }
        // Not an assertion: what each TaskManager left in its temporary directory after the
        // cluster stopped (the killed one could not clean up).
        for (String tm : cluster.taskManagerIds()) {
            List<String> left = LocalCluster.sampleFiles(cluster.tmpDir(tm), 20);
            Scenarios.note(label, tm + " left " + left.size() + " file(s) in its java.io.tmpdir: " + left);
        }
        System.out.printf("[dstl-it] %-60s %6.1f s%n", label, (System.nanoTime() - start) / 1e9);
    }

    static boolean terminal(String state) {
        return state.equals("FINISHED") || state.equals("FAILED") || state.equals("CANCELED");
    }

    /** Waits for {@code n} completed checkpoints while the job keeps running. */
    static void awaitCompletedCheckpoints(StandaloneCluster cluster, String job, int n, Duration timeout)
            throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            String state = cluster.awaitJson("/jobs/" + job, j -> true, Duration.ofSeconds(30), "job " + job)
                    .path("state").asText();
            int completed = cluster.awaitJson("/jobs/" + job + "/checkpoints", c -> true, Duration.ofSeconds(30),
                    "checkpoints of " + job).path("counts").path("completed").asInt();
            if (completed >= n && state.equals("RUNNING")) {
                return;
            }
            if (terminal(state) || System.nanoTime() > deadline) {
                throw new AssertionError("job " + job + " is " + state + " with " + completed + " of " + n
                        + " checkpoints completed\n" + rootExceptions(cluster, job) + cluster.logTails());
            }
            Thread.sleep(100);
        }
    }

    /** A TaskManager id that runs a subtask of the vertex whose name contains {@code vertexName}. */
    static String taskManagerRunning(StandaloneCluster cluster, String job, String vertexName)
            throws Exception {
        for (JsonNode v : cluster.get("/jobs/" + job).path("vertices")) {
            if (!v.path("name").asText().contains(vertexName)) {
                continue;
            }
            JsonNode tms = cluster.get("/jobs/" + job + "/vertices/" + v.path("id").asText() + "/taskmanagers");
            for (JsonNode tm : tms.path("taskmanagers")) {
                String id = tm.path("taskmanager-id").asText();
                if (cluster.taskManagerIds().contains(id)) {
                    return id;
                }
            }
            throw new AssertionError("no known TaskManager runs " + vertexName + ": " + tms);
        }
        throw new AssertionError("job " + job + " has no vertex named like " + vertexName);
    }

    static String survivor(StandaloneCluster cluster, String victim) {
        return cluster.taskManagerIds().stream().filter(id -> !id.equals(victim)).findFirst().orElseThrow();
    }

    /** The job's failover history from {@code /jobs/<id>/exceptions}, one line per root exception. */
    static String rootExceptions(StandaloneCluster cluster, String job) throws Exception {
        StringBuilder sb = new StringBuilder();
        for (JsonNode e : cluster.get("/jobs/" + job + "/exceptions").path("exceptionHistory").path("entries")) {
            String trace = e.path("stacktrace").asText();
            sb.append("    ").append(e.path("exceptionName").asText()).append(" in ")
                    .append(e.path("taskName").asText()).append(" on ").append(e.path("endpoint").asText())
                    .append(": ").append(causes(trace)).append('\n');
        }
        return sb.toString();
    }

    /**
     * Root exceptions that are not explained by the loss of TaskManager {@code victim}: the
     * JobManager noticing it, or the survivors' connections to it breaking.
     */
    static List<String> failoversNotCausedBy(StandaloneCluster cluster, String job, String victim)
            throws Exception {
        List<String> out = new ArrayList<>();
        for (JsonNode e : cluster.get("/jobs/" + job + "/exceptions").path("exceptionHistory").path("entries")) {
            String trace = e.path("stacktrace").asText();
            boolean lostTaskManager = trace.contains("TaskManager with id " + victim + " is no longer reachable")
                    || trace.contains("Heartbeat of TaskManager with id " + victim)
                    || trace.contains("RemoteTransportException")
                    || trace.contains("PartitionConnectionException")
                    || trace.contains("Connection unexpectedly closed by remote task manager");
            if (!lostTaskManager) {
                out.add(causes(trace));
            }
        }
        return out;
    }

    /** The first line and the "Caused by" lines of a stack trace. */
    private static String causes(String trace) {
        List<String> out = new ArrayList<>();
        String[] lines = trace.split("\n");
        if (lines.length > 0) {
            out.add(lines[0].trim());
        }
        for (String l : lines) {
            if (l.startsWith("Caused by")) {
                out.add(l.trim());
            }
        }
        return String.join(" <- ", out);
    }

    /**
     * The job jar a user would build: the test job's classes (and nothing else from the
     * tests), with the job as Main-Class.
     */
    static Path buildJobJar(Path jar) throws Exception {
        Path classes = TestSettings.codeSource(ChangelogTestJob.class);
        String pkg = ChangelogTestJob.class.getPackageName().replace('.', '/');
        Path pkgDir = classes.resolve(pkg);
        List<Path> files;
        try (Stream<Path> s = Files.list(pkgDir)) {
            files = s.filter(f -> f.getFileName().toString().startsWith(ChangelogTestJob.class.getSimpleName()))
                    .filter(f -> f.getFileName().toString().endsWith(".class"))
                    .sorted()
                    .collect(Collectors.toList());
        }
        if (files.isEmpty()) {
            throw new IOException("no compiled job classes in " + pkgDir);
        }
        Manifest manifest = new Manifest();
        manifest.getMainAttributes().put(Attributes.Name.MANIFEST_VERSION, "1.0");
        manifest.getMainAttributes().put(Attributes.Name.MAIN_CLASS, ChangelogTestJob.class.getName());
        try (OutputStream out = Files.newOutputStream(jar); JarOutputStream j = new JarOutputStream(out, manifest)) {
            for (Path f : files) {
                j.putNextEntry(new JarEntry(pkg + "/" + f.getFileName()));
                j.write(Files.readAllBytes(f));
                j.closeEntry();
            }
        }
        return jar;
    }
}
