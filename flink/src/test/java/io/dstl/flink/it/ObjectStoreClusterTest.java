package io.dstl.flink.it;

import org.apache.flink.core.fs.FSDataOutputStream;
import org.apache.flink.core.fs.FileStatus;
import org.apache.flink.core.fs.FileSystem;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.junit.jupiter.api.Timeout;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * (t) A real deployment on an object store with nothing but the dstl plugin: a standalone
 * JobManager and two TaskManagers in JVMs of their own, {@code plugins/dstl/} the only plugin,
 * the changelog and the checkpoints on SeaweedFS through the plugin's {@code dstl-s3://} file
 * system, every request through a proxy that can fail them. While the job runs, the store
 * throttles every changelog write for a few seconds (503 Slow Down): with retries that outlast
 * it, checkpoints slow down, nothing is lost and the job does not restart. Then a TaskManager is killed with SIGKILL; the job restores on the survivor from the
 * bucket (Flink's reader, the JobManager's metadata) and finishes with exact state. Subsumed
 * changelog objects are deleted by the JobManager as the job runs (the count stays bounded),
 * and once it finished none is left but what the killed TaskManager uploaded and never handed
 * to a checkpoint, nor any lease. Flink's own {@code filesystem} storage
 * runs the same job through the same file system, as the control; the time from the kill
 * until every task runs again (failure detection, scheduling, restore) is reported for both.
 */
@Timeout(360)
class ObjectStoreClusterTest extends JobTest {
    /**
     * How long after the SIGKILL an object of the killed TaskManager may still be committed: a
     * PUT whose body was sent completes at the server (and the store's times are whole seconds).
     */
    private static final long ORPHAN_SLACK_MS = 2_000;

    @EachStorage
    void aJobOnTheObjectStoreSurvivesThrottlingAndAKilledTaskManager(String storage) throws Exception {
        String label = "(t) object store, process cluster, " + storage;
        ChangelogTestJob.Params p = params(1200, 600);
        Path jar = ProcessClusterTest.buildJobJar(dir.resolve("dstl-test-job.jar"));
        try (Seaweed weed = Seaweed.start(dir.resolve("weed"), "cluster");
                S3Proxy proxy = S3Proxy.start(weed.endpoint())) {
            Map<String, String> config = ObjectStoreTest.objectStoreConfig(weed, "cluster");
            config.put("state.changelog.storage", storage);
            config.put("state.changelog.dstl.s3.endpoint", proxy.endpoint());
            config.put("taskmanager.numberOfTaskSlots", "2");
            // What a production job on an object store sets: uploads retried for longer than
            // the store throttles (6 attempts of up to 2 s, 1 s apart), and a checkpoint that
            // times out meanwhile declined rather than a reason to restart the job.
            config.put("state.changelog.dstl.dfs.upload.max-attempts", "6");
            config.put("state.changelog.dstl.dfs.upload.timeout", "2s");
            config.put("state.changelog.dstl.dfs.upload.next-attempt-delay", "1s");
            config.put("execution.checkpointing.tolerable-failed-checkpoints", "10");
            Objects objects = new Objects(Map.of(
                    "state.changelog.dstl.s3.endpoint", weed.endpoint(),
                    "state.changelog.dstl.s3.region", "us-east-1",
                    "state.changelog.dstl.s3.access-key-id", Seaweed.ACCESS_KEY,
                    "state.changelog.dstl.s3.secret-access-key", Seaweed.SECRET_KEY), weed.bucket);

            long start = System.nanoTime();
            List<String> orphans = new ArrayList<>();
            String jobId = null;
            StandaloneCluster cluster = StandaloneCluster.create(dir.resolve("cluster"), TestSettings.flinkLib(),
                    TestSettings.pluginJar(), config);
            try {
                cluster.startTaskManager("tm-1");
                cluster.startTaskManager("tm-2");
                cluster.awaitTaskManagers(2, 4, Duration.ofSeconds(90));
                String job = cluster.submit(jar, ChangelogTestJob.class.getName(), p.toArgs(), 2);
                String checkpointsPath = "/jobs/" + job + "/checkpoints";
                ProcessClusterTest.awaitCompletedCheckpoints(cluster, job, 4, Duration.ofSeconds(120));
                int most = objects.changelog("changelog").size();
                if (most == 0) {
                    throw new AssertionError(label + ": checkpoints completed, but no changelog object is in the bucket");
                }

                // The store throttles every changelog write for a while. Not for Flink's own
                // storage: its uploader ignores an IOException from the output stream's close,
                // and an object store commits an object on close, so a checkpoint it
                // acknowledges then names an object that was never written, and the job can
                // never be restored from it (seen here: "FileNotFoundException: dstl: no object
                // ..." on every restore until the restarts ran out).
                if (storage.equals(TestSettings.DSTL)) {
                    int before = cluster.get(checkpointsPath).path("counts").path("completed").asInt();
                    proxy.failWhile(r -> r.method.equals("PUT") && r.target.startsWith("/cluster/changelog/"));
                    long throttled = System.nanoTime();
                    while (System.nanoTime() - throttled < Duration.ofSeconds(4).toNanos()) {
                        most = Math.max(most, objects.changelog("changelog").size());
                        Thread.sleep(200);
                    }
                    proxy.heal();
                    long failedPuts = proxy.failed();
                    ProcessClusterTest.awaitCompletedCheckpoints(cluster, job, before + 3, Duration.ofSeconds(120));
                    JsonNode afterThrottling = cluster.get(checkpointsPath).path("counts");
                    Scenarios.note(label, failedPuts + " changelog PUTs failed with 503 over 4 s; checkpoints went on"
                            + " after (" + afterThrottling.path("failed").asInt() + " failed so far)");
                }

                String victim = ProcessClusterTest.taskManagerRunning(cluster, job, "state-updater");
                long killedAt = System.nanoTime();
                long killedAtMillis = System.currentTimeMillis();
                cluster.killTaskManager(victim);
                long runningAgain = 0;
                boolean stopped = false;
                while (true) {
                    JsonNode j = cluster.get("/jobs/" + job);
                    if (ProcessClusterTest.terminal(j.path("state").asText())) {
                        break;
                    }
                    boolean allRunning = j.path("vertices").size() > 0;
                    for (JsonNode v : j.path("vertices")) {
                        allRunning &= v.path("status").asText().equals("RUNNING");
                    }
                    stopped |= !allRunning;
                    if (stopped && allRunning && runningAgain == 0) {
                        runningAgain = System.nanoTime();
                    }
                    most = Math.max(most, objects.changelog("changelog").size());
                    if (System.nanoTime() - killedAt > Duration.ofSeconds(240).toNanos()) {
                        throw new AssertionError(label + ": the job did not end within 240 s of the kill\n"
                                + ProcessClusterTest.rootExceptions(cluster, job) + cluster.logTails());
                    }
                    Thread.sleep(200);
                }
                JsonNode done = cluster.get("/jobs/" + job);
                String exceptions = ProcessClusterTest.rootExceptions(cluster, job);
                if (!"FINISHED".equals(done.path("state").asText())) {
                    throw new AssertionError(label + ": job ended as " + done.path("state").asText() + "\n"
                            + exceptions + cluster.logTails());
                }
                JsonNode counts = cluster.get(checkpointsPath).path("counts");
                int completed = counts.path("completed").asInt();
                if (counts.path("restored").asInt() < 1) {
                    throw new AssertionError(label + ": the job finished without restoring a checkpoint\n" + exceptions);
                }
                List<String> unrelated = new ArrayList<>(ProcessClusterTest.failoversNotCausedBy(cluster, job, victim));
                if (!unrelated.isEmpty()) {
                    throw new AssertionError(label + ": failovers other than the loss of " + victim + ":\n"
                            + String.join("\n", unrelated));
                }
                ExpectedResults.verify(p, Path.of(p.outputDir), label);
                for (String process : List.of("jobmanager", "tm-1", "tm-2")) {
                    if (cluster.logContains(process, "UnsupportedFileSystemSchemeException")) {
                        throw new AssertionError(label + ": " + process + " could not find a file system:\n"
                                + cluster.logTails());
                    }
                }
                if (most >= completed) {
                    throw new AssertionError(label + ": the changelog objects grew with the checkpoints (" + most
                            + " at most, " + completed + " checkpoints): subsumed ones were not deleted");
                }
                // The JobManager discards the last checkpoints asynchronously once the job ended.
                // What may stay: an upload the killed TaskManager had finished but not yet
                // handed to a checkpoint (an orphan, with either storage), which the plugin's
                // orphan collection removes once the storages closed. Anything written after
                // the kill would be a leak.
                ObjectStoreTest.awaitNone(objects, "changelog", Duration.ofSeconds(30));
                List<String> leaked = new ArrayList<>();
                for (FileStatus o : objects.changelogStatus("changelog")) {
                    String at = o.getPath() + " (modified " + (o.getModificationTime() - killedAtMillis)
                            + " ms after the kill)";
                    if (o.getModificationTime() <= killedAtMillis + ORPHAN_SLACK_MS) {
                        orphans.add(at);
                    } else {
                        leaked.add(at);
                    }
                }
                if (!leaked.isEmpty()) {
                    throw new AssertionError(label + ": the job finished, but " + leaked.size()
                            + " changelog objects written after the kill are left: "
                            + leaked.subList(0, Math.min(10, leaked.size())));
                }
                jobId = job;
                Scenarios.note(label, String.format("every task running again %.1f s after the kill (detection,"
                                + " scheduling, restore); finished %.1f s after it; %d checkpoints completed, %d"
                                + " restored; at most %d changelog objects at a time; requests through"
                                + " the proxy: %d PUT (%d changelog), %d GET, %d HEAD, %d POST (deletes)",
                        runningAgain == 0 ? -1 : (runningAgain - killedAt) / 1e9,
                        (System.nanoTime() - killedAt) / 1e9, completed, counts.path("restored").asInt(), most,
                        proxy.passed("PUT"), proxy.passedChangelog("PUT"), proxy.passed("GET"), proxy.passed("HEAD"),
                        proxy.passed("POST")));
            } finally {
                cluster.close();
                cluster.keepLogs("object-store-cluster-" + storage);
            }
            // The storages closed with the cluster, the killed TaskManager's too (its lease is
            // collected by the next storage of the job, or when the survivor's closes).
            List<String> leases = new ArrayList<>();
            for (String o : objects.under("changelog")) {
                if (o.contains("/leases/")) {
                    leases.add(o);
                }
            }
            if (!leases.isEmpty()) {
                throw new AssertionError(label + ": leases left after the cluster stopped: " + leases);
            }
            // The orphan collection removes what no checkpoint names (the job retained none):
            // the killed TaskManager's orphans, if any, and one planted to be sure there is one.
            try (FSDataOutputStream planted = objects.fileSystem().create(
                    new org.apache.flink.core.fs.Path("dstl-s3://" + weed.bucket + "/changelog/" + jobId
                            + "/dstl/planted-orphan"), FileSystem.WriteMode.NO_OVERWRITE)) {
                planted.write(new byte[] {1, 2, 3});
            }
            Gc gc = Gc.run(objects.settings(), "--changelog", "dstl-s3://" + weed.bucket + "/changelog",
                    "--checkpoints", "dstl-s3://" + weed.bucket + "/checkpoints", "--job", jobId,
                    "--grace", "0s", "--delete");
            List<String> left = objects.changelog("changelog");
            if (gc.exit != 0 || !left.isEmpty() || !gc.report().contains("planted-orphan")) {
                throw new AssertionError(label + ": after the orphan collection " + left.size()
                        + " changelog objects are left: " + left + "\n" + gc);
            }
            Scenarios.note(label, orphans.size() + " orphan(s) of the killed TaskManager's last uploads"
                    + (orphans.isEmpty() ? "" : " " + orphans) + "; the orphan collection left none: "
                    + gc.report().strip().replace('\n', ';'));
            System.out.printf("[dstl-it] %-60s %6.1f s%n", label, (System.nanoTime() - start) / 1e9);
        }
    }
}
