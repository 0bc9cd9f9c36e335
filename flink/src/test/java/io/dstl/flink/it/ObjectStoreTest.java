package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.checkpoint.CheckpointStatsCounts;
import org.junit.jupiter.api.Timeout;

import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;

/**
 * (s) dstl on an object store in a MiniCluster, with nothing but the plugin: the changelog and
 * the checkpoints on SeaweedFS through the plugin's {@code dstl-s3://} file system. Injected
 * failures make the job restore from the bucket (Flink's reader, through that file system);
 * materialization lets the JobManager delete subsumed changelog objects while the job runs (the
 * count stays bounded); the final state is exact, and once the job finished nothing of its
 * changelog is left.
 */
@Timeout(300)
class ObjectStoreTest extends JobTest {

    @DstlOnly
    void aJobOnTheObjectStoreRestoresExactlyAndLeavesNoChangelogBehind() throws Exception {
        String label = "(s) object store, MiniCluster";
        ChangelogTestJob.Params p = params(600, 900);
        Scenarios.armFailures(p, dir, 2);
        try (Seaweed weed = Seaweed.start(dir.resolve("weed"), "minicluster")) {
            Map<String, String> config = objectStoreConfig(weed, "minicluster");
            Objects objects = new Objects(config, weed.bucket);
            long start = System.nanoTime();
            int most = 0;
            try (LocalCluster cluster = LocalCluster.start(config, 4)) {
                JobID job = cluster.submit(TestSettings.merge(config, TestSettings.job(2)), p);
                cluster.awaitCompletedCheckpoints(job, 2, Duration.ofSeconds(90));
                while (!cluster.status(job).isGloballyTerminalState()) {
                    most = Math.max(most, objects.changelog("changelog").size());
                    Thread.sleep(200);
                }
                cluster.awaitSuccess(job, Duration.ofSeconds(10));
                CheckpointStatsCounts counts = cluster.checkpoints(job).getCounts();
                Scenarios.assertInjectedFailuresOnly(cluster, job, p, label);
                if (counts.getNumberOfRestoredCheckpoints() != p.failures) {
                    throw new AssertionError(label + ": expected " + p.failures + " restores, saw "
                            + counts.getNumberOfRestoredCheckpoints() + "\n" + cluster.describeFailures(job));
                }
                ExpectedResults.verify(p, Path.of(p.outputDir), label);
                // Deletions of the last subsumed checkpoints run asynchronously at the end.
                List<String> left = awaitNone(objects, "changelog", Duration.ofSeconds(30));
                if (!left.isEmpty()) {
                    throw new AssertionError(label + ": the job finished, but " + left.size()
                            + " changelog objects are left: " + left.subList(0, Math.min(10, left.size())));
                }
                long completed = counts.getNumberOfCompletedCheckpoints();
                if (most >= completed) {
                    throw new AssertionError(label + ": the changelog objects grew with the checkpoints (" + most
                            + " at most, " + completed + " checkpoints): subsumed ones were not deleted");
                }
                Scenarios.report(label, start, counts);
                Scenarios.note(label, "at most " + most + " changelog objects at a time over " + completed
                        + " checkpoints; none left after the job");
            }
        }
    }

    @DstlOnly
    void aCancelledJobLeavesOnlyWhatItsRetainedCheckpointNamesAndResumesFromIt() throws Exception {
        String label = "(s) object store, cancel and resume";
        ChangelogTestJob.Params p = params(600);
        Map<String, String> retain = Map.of(
                "execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION");
        try (Seaweed weed = Seaweed.start(dir.resolve("weed"), "cancel")) {
            // In Flink's older spelling (no `state.changelog.`), which Flink's own storage
            // still accepts, and so does dstl.
            Map<String, String> config = new java.util.LinkedHashMap<>();
            for (Map.Entry<String, String> e : objectStoreConfig(weed, "cancel").entrySet()) {
                config.put(e.getKey().startsWith("state.changelog.dstl.")
                        ? e.getKey().substring("state.changelog.".length()) : e.getKey(), e.getValue());
            }
            Objects objects = new Objects(config, weed.bucket);
            long start = System.nanoTime();
            String retained;
            try (LocalCluster cluster = LocalCluster.start(config, 4)) {
                ChangelogTestJob.Params slow = params(p.recordsPerKey, p.eventsPerSecond / 2);
                JobID job = cluster.submit(TestSettings.merge(config, TestSettings.job(2), retain), slow);
                cluster.awaitCompletedCheckpoints(job, 8, Duration.ofSeconds(90));
                retained = cluster.cancelAndGetRetainedCheckpoint(job);
                Scenarios.report(label + " [run 1]", start, cluster.checkpoints(job).getCounts());
            }
            CheckpointInspector checkpoint = CheckpointInspector.read(retained);
            if (checkpoint.changelogFiles.isEmpty()) {
                throw new AssertionError(label + ": the retained checkpoint names no changelog object: " + checkpoint);
            }
            // What the JobManager deleted before the cancellation completed is gone; what is
            // left must be what the retained checkpoint needs.
            List<String> left = objects.changelog("changelog");
            List<String> unnamed = new java.util.ArrayList<>(left);
            unnamed.removeAll(checkpoint.changelogFiles);
            if (!unnamed.isEmpty()) {
                throw new AssertionError(label + ": " + unnamed.size() + " of " + left.size() + " changelog objects"
                        + " left after the cancellation are not named by the retained checkpoint " + retained
                        + ": " + unnamed.subList(0, Math.min(10, unnamed.size())));
            }
            Scenarios.note(label, "retained " + retained + " names " + checkpoint.changelogFiles.size()
                    + " changelog objects; " + left.size() + " left in the bucket, all of them named by it");
            // The orphan collection reads the retained checkpoint and deletes none of them.
            String jobId = retained.replaceAll(".*/([0-9a-f]{32})/chk-[0-9]+/?$", "$1");
            Gc gc = Gc.run(objects.settings(), "--changelog", "s3://" + weed.bucket + "/changelog",
                    "--checkpoints", "dstl-s3://" + weed.bucket + "/checkpoints", "--job", jobId,
                    "--grace", "0s", "--delete");
            List<String> afterGc = objects.changelog("changelog");
            if (gc.exit != 0 || !afterGc.containsAll(left) || !gc.report().contains(left.size() + " named by a checkpoint")) {
                throw new AssertionError(label + ": the orphan collection touched what the retained checkpoint"
                        + " names (" + afterGc.size() + " of " + left.size() + " left)\n" + gc);
            }
            Scenarios.note(label, "orphan collection: " + gc.report().strip().replace('\n', ';'));
            if (!Scenarios.listNames(Path.of(p.outputDir)).isEmpty()) {
                throw new AssertionError(label + ": output before the cancellation, so the run was not cut off");
            }
            start = System.nanoTime();
            try (LocalCluster cluster = LocalCluster.start(config, 4)) {
                Map<String, String> restore = Map.of(
                        "execution.state-recovery.path", retained,
                        "execution.state-recovery.claim-mode", "CLAIM");
                JobID job = cluster.submit(TestSettings.merge(config, TestSettings.job(2), restore), p);
                cluster.awaitSuccess(job, Scenarios.JOB_TIMEOUT);
                if (cluster.checkpoints(job).getLatestRestoredCheckpoint() == null) {
                    throw new AssertionError(label + ": the second run did not restore from " + retained);
                }
                ExpectedResults.verify(p, Path.of(p.outputDir), label);
                Scenarios.report(label + " [run 2]", start, cluster.checkpoints(job).getCounts());
            }
        }
    }

    /**
     * The cluster configuration of a job whose changelog and checkpoints go to {@code weed}'s
     * bucket under {@code dstl-s3://}, with materialization every second.
     */
    static Map<String, String> objectStoreConfig(Seaweed weed, String bucket) {
        Map<String, String> c = TestSettings.changelog(TestSettings.DSTL, "hashmap", Path.of("unused"),
                Path.of("unused"));
        c.put("state.changelog.dstl.dfs.base-path", "dstl-s3://" + bucket + "/changelog");
        c.put("execution.checkpointing.dir", "dstl-s3://" + bucket + "/checkpoints");
        c.put("state.changelog.periodic-materialize.enabled", "true");
        c.put("state.changelog.periodic-materialize.interval", "1s");
        c.putAll(weed.dstlSettings());
        return c;
    }

    static List<String> awaitNone(Objects objects, String prefix, Duration timeout) throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            List<String> left = objects.changelog(prefix);
            if (left.isEmpty() || System.nanoTime() > deadline) {
                return left;
            }
            Thread.sleep(200);
        }
    }
}
