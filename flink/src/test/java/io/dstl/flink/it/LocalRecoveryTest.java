package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.checkpoint.CheckpointStatsCounts;
import org.junit.jupiter.api.Timeout;

import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;

/**
 * (d) Local recovery: the TaskManager keeps a local copy of each checkpoint's state (for the
 * changelog, the storage writes it next to the remote files) and the restore after a failure in
 * the same TaskManager prefers that copy.
 */
@Timeout(180)
class LocalRecoveryTest extends JobTest {

    @EachStorage
    void exactStateAfterFailureWithLocalRecovery(String storage) throws Exception {
        String label = "(d) local recovery " + storage;
        ChangelogTestJob.Params p = Scenarios.params(dir);
        Scenarios.armFailures(p, dir, 1);
        Path localDir = dir.resolve("local-state");
        Map<String, String> clusterConfig = changelog(storage);
        clusterConfig.put("execution.checkpointing.local-backup.enabled", "true");
        clusterConfig.put("execution.state-recovery.from-local", "true");
        clusterConfig.put("execution.checkpointing.local-backup.dirs", localDir.toString());

        long start = System.nanoTime();
        try (LocalCluster cluster = LocalCluster.start(clusterConfig, 4)) {
            JobID job = cluster.submit(TestSettings.merge(clusterConfig, TestSettings.job(2)), p);
            cluster.awaitCompletedCheckpoints(job, 3, Duration.ofSeconds(60));
            Scenarios.assertChangelogWritten(clusterConfig, label);
            // Flink itself writes a _task_state_snapshot per subtask and checkpoint; any other
            // file is the storage's local copy of the changelog (with no materialization, the
            // changelog is all the keyed state there is).
            List<String> copies = LocalCluster.sampleFiles(localDir, Integer.MAX_VALUE).stream()
                    .filter(f -> !f.endsWith("_task_state_snapshot"))
                    .collect(Collectors.toList());
            Scenarios.note(label, LocalCluster.countFiles(localDir) + " files in the local state directory after"
                    + " 3 checkpoints, " + copies.size() + " of them changelog copies, e.g. "
                    + copies.subList(0, Math.min(2, copies.size())));
            if (copies.isEmpty()) {
                throw new AssertionError(label + ": local backup is enabled, but the storage wrote no local copy"
                        + " of the changelog below " + localDir + " (only Flink's own snapshot metadata: "
                        + LocalCluster.sampleFiles(localDir, 5) + ")");
            }
            cluster.awaitSuccess(job, Scenarios.JOB_TIMEOUT);
            CheckpointStatsCounts counts = cluster.checkpoints(job).getCounts();
            Scenarios.assertInjectedFailuresOnly(cluster, job, p, label);
            if (counts.getNumberOfRestoredCheckpoints() != 1) {
                throw new AssertionError(label + ": expected 1 restore, saw "
                        + counts.getNumberOfRestoredCheckpoints() + "\n" + cluster.describeFailures(job));
            }
            ExpectedResults.verify(p, Path.of(p.outputDir), label);
            Scenarios.report(label, start, counts);
        }
    }
}
