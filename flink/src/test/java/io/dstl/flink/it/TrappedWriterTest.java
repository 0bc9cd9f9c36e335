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
 * (e) A dstl writer whose sandbox runs out of memory: with the smallest memory limit dstl accepts
 * (2 MiB) and 64 KiB list elements, the changes buffered between two checkpoints (some 5 MiB at
 * this rate) no longer fit. The job must fail
 * (restarts are off) with a cause that names dstl and the memory limit, the JVM must survive,
 * and dstl must still work in the same JVM afterwards.
 */
@Timeout(240)
class TrappedWriterTest extends JobTest {

    @DstlOnly
    void writerOutOfMemoryFailsTheJobWithAClearCause() throws Exception {
        String label = "(e) trapped writer";
        ChangelogTestJob.Params p = Scenarios.params(dir.resolve("trapped"));
        p.keys = 4;
        p.recordsPerKey = 200;
        p.eventsPerSecond = 400;
        p.payloadBytes = 64 * 1024;
        Map<String, String> clusterConfig = changelog(TestSettings.DSTL);
        clusterConfig.put("state.changelog.dstl.writer.memory-limit", "2mb");
        Map<String, String> job = TestSettings.job(2);
        job.put("restart-strategy.type", "none");

        long start = System.nanoTime();
        Throwable cause;
        try (LocalCluster cluster = LocalCluster.start(clusterConfig, 4)) {
            JobID id = cluster.submit(TestSettings.merge(clusterConfig, job), p);
            JobResult result = cluster.awaitResult(id, Duration.ofSeconds(120));
            if (result.getJobStatus().orElse(null) != JobStatus.FAILED) {
                throw new AssertionError(label + ": expected the job to fail once the writer exceeded its 1 MiB"
                        + " memory limit, but it ended as " + result.getJobStatus().orElse(null)
                        + " (checkpoints: " + cluster.checkpoints(id).getCounts().getNumberOfCompletedCheckpoints()
                        + " completed)");
            }
            // The failure must come from a running writer, not from rejecting the configuration.
            long recordsIn = cluster.recordsIn(id, "state-updater");
            if (recordsIn == 0) {
                throw new AssertionError(label + ": the job failed before the stateful operator processed any"
                        + " record, so no writer ran out of memory:\n" + cluster.describeFailures(id));
            }
            cause = result.getSerializedThrowable().orElseThrow()
                    .deserializeError(getClass().getClassLoader());
            Scenarios.note(label, "the job failed after "
                    + String.format("%.1f s", (System.nanoTime() - start) / 1e9) + " and " + recordsIn
                    + " records into the stateful operator; cause chain:\n"
                    + Failures.chain(cause) + "failure history:\n" + cluster.describeFailures(id));
        }
        boolean namesDstl = Failures.mentions(cause, "dstl");
        boolean namesMemory = Failures.mentions(cause, "memory");
        if (!namesDstl || !namesMemory) {
            throw new AssertionError(label + ": the failure cause should name dstl (" + namesDstl
                    + ") and the memory limit (" + namesMemory + "):\n" + Failures.chain(cause));
        }

        // The same JVM, its native library and a new dstl storage still work after the trap.
        Path after = Files.createDirectories(dir.resolve("after"));
        ChangelogTestJob.Params q = Scenarios.params(after);
        q.recordsPerKey = 150;
        Map<String, String> healthy = TestSettings.changelog(TestSettings.DSTL, "hashmap",
                after.resolve("changelog"), after.resolve("checkpoints"));
        Scenarios.runToCompletion(label + ", then a healthy job", healthy, TestSettings.job(2), q, 4);
    }
}
