package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.checkpoint.CheckpointStatsCounts;
import org.apache.flink.runtime.checkpoint.RestoredCheckpointStats;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;

/**
 * Runs the job part-way, cancels it with its latest checkpoint retained, and finishes it from
 * that checkpoint in a second cluster, which may use another storage and parallelism.
 */
final class StopAndRestore {

    private StopAndRestore() {}

    /**
     * @param failuresInSecondRun injected failures after the restore; with a storage change,
     *     the checkpoints the second run restores from then hold changelog written by both
     *     storages
     */
    static void run(String label, Path dir, String firstStorage, int firstParallelism, String secondStorage,
            int secondParallelism, int failuresInSecondRun) throws Exception {
        ChangelogTestJob.Params p = Scenarios.params(dir);
        // One base path per run, so that each run's storage is seen to write its own files.
        Path firstChangelog = dir.resolve("changelog-1");
        Path secondChangelog = dir.resolve("changelog-2");
        Path checkpoints = dir.resolve("checkpoints");
        Map<String, String> retain = Map.of(
                "execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION");

        long start = System.nanoTime();
        Map<String, String> firstCluster = TestSettings.changelog(firstStorage, "hashmap", firstChangelog, checkpoints);
        String retained;
        CheckpointInspector firstCheckpoint;
        try (LocalCluster cluster = LocalCluster.start(firstCluster, 4)) {
            // A slower first run (the rate does not change the result): six checkpoints take
            // about a fifth of its input, so the state is substantial but no key is complete,
            // even if checkpoints are slow.
            ChangelogTestJob.Params slow = Scenarios.params(dir);
            slow.eventsPerSecond = p.eventsPerSecond * 2 / 3;
            JobID job = cluster.submit(
                    TestSettings.merge(firstCluster, TestSettings.job(firstParallelism), retain), slow);
            cluster.awaitCompletedCheckpoints(job, 6, Duration.ofSeconds(60));
            Scenarios.assertChangelogWritten(firstCluster, label);
            retained = cluster.cancelAndGetRetainedCheckpoint(job);
            CheckpointStatsCounts counts = cluster.checkpoints(job).getCounts();
            if (!cluster.rootFailures(job).isEmpty()) {
                throw new AssertionError(label + ": the first run failed over:\n" + cluster.describeFailures(job));
            }
            Scenarios.report(label + " [run 1, p=" + firstParallelism + "]", start, counts);
        }
        firstCheckpoint = CheckpointInspector.read(retained);
        Scenarios.note(label, "retained " + retained + ": " + firstCheckpoint);
        // Without materialization all keyed state of the checkpoint must be changelog.
        if (firstCheckpoint.changelogHandleCount() == 0 || firstCheckpoint.nonChangelogKeyedHandles > 0) {
            throw new AssertionError(label + ": the retained checkpoint holds no changelog state: " + firstCheckpoint);
        }
        if (!Scenarios.listNames(Path.of(p.outputDir)).isEmpty()) {
            throw new AssertionError(label + ": output before the cancellation, so the first run was not cut off"
                    + " mid-way: " + Scenarios.listNames(Path.of(p.outputDir)));
        }

        if (failuresInSecondRun > 0) {
            Scenarios.armFailures(p, dir, failuresInSecondRun);
        }
        start = System.nanoTime();
        Map<String, String> secondCluster = TestSettings.changelog(secondStorage, "hashmap", secondChangelog, checkpoints);
        try (LocalCluster cluster = LocalCluster.start(secondCluster, 4)) {
            Map<String, String> restore = Map.of(
                    "execution.state-recovery.path", retained,
                    "execution.state-recovery.claim-mode", "CLAIM");
            JobID job = cluster.submit(
                    TestSettings.merge(secondCluster, TestSettings.job(secondParallelism), retain, restore), p);
            cluster.awaitCompletedCheckpoints(job, 2, Duration.ofSeconds(60));
            Scenarios.assertChangelogWritten(secondCluster, label + " [run 2]");
            cluster.awaitSuccess(job, Scenarios.JOB_TIMEOUT);
            CheckpointStatsCounts counts = cluster.checkpoints(job).getCounts();
            RestoredCheckpointStats restored = cluster.checkpoints(job).getLatestRestoredCheckpoint();
            if (restored == null) {
                throw new AssertionError(label + ": the second run did not restore from " + retained);
            }
            Scenarios.assertInjectedFailuresOnly(cluster, job, p, label + " [run 2]");
            if (counts.getNumberOfRestoredCheckpoints() != 1 + failuresInSecondRun) {
                throw new AssertionError(label + ": expected " + (1 + failuresInSecondRun) + " restores, saw "
                        + counts.getNumberOfRestoredCheckpoints() + "\n" + cluster.describeFailures(job));
            }
            ExpectedResults.verify(p, Path.of(p.outputDir), label);
            Scenarios.report(label + " [run 2, p=" + secondParallelism + "]", start, counts);
        }
    }
}
