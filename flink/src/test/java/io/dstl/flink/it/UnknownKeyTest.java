package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.junit.jupiter.api.Timeout;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;

/**
 * (k) A misspelt dstl key in the cluster configuration must not go unnoticed, and must not
 * break jobs that do not use the changelog. Flink creates a changelog storage for every job
 * on a TaskManager, changelog on or off, so dstl checks its configuration only when the
 * first writer opens the native storage: a changelog job then fails with a cause naming the
 * key, while a job with {@code state.changelog.enabled: false} on the same cluster (the same
 * TaskManager, after that failure) runs as if dstl were not there.
 */
@Timeout(120)
class UnknownKeyTest extends JobTest {

    private static final String BAD_KEY = "state.changelog.dstl.no-such-key";

    @DstlOnly
    void unknownKeyFailsChangelogJobsOnly() throws Exception {
        String label = "(k) unknown key";
        Path base = dir.resolve("changelog");
        Map<String, String> clusterConfig = TestSettings.changelog(TestSettings.DSTL, "hashmap", base,
                dir.resolve("checkpoints"));
        clusterConfig.put(BAD_KEY, "1");
        Map<String, String> noRestarts = TestSettings.job(2);
        noRestarts.put("restart-strategy.type", "none");

        long start = System.nanoTime();
        try (LocalCluster cluster = LocalCluster.start(clusterConfig, 4)) {
            ChangelogTestJob.Params failing = Scenarios.params(Files.createDirectories(dir.resolve("with-changelog")));
            JobID bad = cluster.submit(TestSettings.merge(clusterConfig, noRestarts), failing);
            JobResult result = cluster.awaitResult(bad, Duration.ofSeconds(60));
            if (result.getJobStatus().orElse(null) != JobStatus.FAILED) {
                throw new AssertionError(label + ": a changelog job with " + BAD_KEY + " in the cluster configuration"
                        + " ended as " + result.getJobStatus().orElse(null) + "; it should fail");
            }
            Throwable cause = result.getSerializedThrowable().orElseThrow()
                    .deserializeError(getClass().getClassLoader());
            Scenarios.note(label, "the changelog job failed after "
                    + String.format("%.1f s", (System.nanoTime() - start) / 1e9) + "; cause chain:\n"
                    + Failures.chain(cause));
            if (!Failures.mentions(cause, BAD_KEY)) {
                throw new AssertionError(label + ": the failure does not name " + BAD_KEY + ":\n" + Failures.chain(cause)
                        + cluster.describeFailures(bad));
            }

            // Same cluster, same TaskManager, whose dstl storage factory sees the same key.
            ChangelogTestJob.Params p = Scenarios.params(Files.createDirectories(dir.resolve("without-changelog")));
            p.recordsPerKey = 100;
            Map<String, String> off = TestSettings.merge(clusterConfig, noRestarts,
                    Map.of("state.changelog.enabled", "false"));
            JobID good = cluster.submit(off, p);
            cluster.awaitCompletedCheckpoints(good, 2, Duration.ofSeconds(60));
            cluster.awaitSuccess(good, Scenarios.JOB_TIMEOUT);
            ExpectedResults.verify(p, Path.of(p.outputDir), label + ", changelog off");
            Scenarios.report(label + ", changelog off", start, cluster.checkpoints(good).getCounts());
        }
        // Neither job wrote changelog: the first failed before its writer existed, the
        // second never asked for one.
        long files = LocalCluster.countFiles(base);
        if (files != 0) {
            throw new AssertionError(label + ": " + files + " file(s) below the changelog base path, though no job"
                    + " wrote changelog: " + LocalCluster.sampleFiles(base, 10));
        }
    }
}
