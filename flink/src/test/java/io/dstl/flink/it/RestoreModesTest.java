package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.junit.jupiter.api.Timeout;

import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

/**
 * (u) The changelog backend's two restore traps, which are Flink's and the same with either
 * storage (README names them, so users do not blame dstl):
 *
 * <ol>
 *   <li>Restored in {@code NO_CLAIM} mode (Flink's default), a job runs, but every checkpoint
 *       fails ("does not support enforcing a full snapshot"), and the job restarts until its
 *       restart strategy gives up.
 *   <li>A checkpoint restored in {@code CLAIM} mode belongs to the new job, which deletes it
 *       once a checkpoint of its own subsumes it: restoring it a second time fails. The
 *       checkpoint the new job retains restores with exact state.
 * </ol>
 */
@Timeout(300)
class RestoreModesTest extends JobTest {

    @EachStorage
    void noClaimFailsEveryCheckpointAndAClaimedCheckpointIsGoneOnceSubsumed(String storage) throws Exception {
        String label = "(u) restore modes, " + storage;
        long start = System.nanoTime();
        // Slow enough that no run ends (and writes output) before it is cancelled.
        ChangelogTestJob.Params p = Scenarios.params(dir);
        p.eventsPerSecond = p.eventsPerSecond / 3;
        Map<String, String> cluster = changelog(storage);
        String first = runAndCancel(cluster, p, Map.of());

        assertFailedWith(runToEnd(cluster, p, restore(first, "NO_CLAIM"), Duration.ofSeconds(90)),
                "does not support enforcing a full snapshot",
                label + ": NO_CLAIM should fail every checkpoint until the restarts run out");

        String second = runAndCancel(cluster, p, restore(first, "CLAIM"));
        if (Files.exists(Path.of(URI.create(first)))) {
            throw new AssertionError(label + ": the checkpoint restored in CLAIM mode should be gone once"
                    + " subsumed: " + first);
        }
        assertFailedWith(runToEnd(cluster, p, restore(first, "CLAIM"), Duration.ofSeconds(60)),
                "Cannot find checkpoint or savepoint",
                label + ": restoring the claimed checkpoint again should fail, missing");

        JobResult last = runToEnd(cluster, p, restore(second, "CLAIM"), Scenarios.JOB_TIMEOUT);
        if (last.getJobStatus().orElse(null) != JobStatus.FINISHED) {
            throw new AssertionError(label + ": the checkpoint retained after the CLAIM restore did not restore:"
                    + " the job ended " + last.getJobStatus());
        }
        ExpectedResults.verify(p, Path.of(p.outputDir), label);
        Scenarios.note(label, String.format("NO_CLAIM failed every checkpoint until the restarts ran out; the"
                + " claimed checkpoint was gone once subsumed; the one retained after it restored exactly"
                + " (%.1f s)", (System.nanoTime() - start) / 1e9));
    }

    /** Fails with {@code what} unless the job ended FAILED with {@code expected} in its cause. */
    private static void assertFailedWith(JobResult result, String expected, String what) {
        String cause = result.getSerializedThrowable()
                .map(t -> Failures.chain(t.deserializeError(RestoreModesTest.class.getClassLoader()))).orElse("");
        if (result.getJobStatus().orElse(null) != JobStatus.FAILED || !cause.contains(expected)) {
            throw new AssertionError(what + "; the job ended " + result.getJobStatus() + "\n" + cause);
        }
    }

    private static Map<String, String> restore(String path, String mode) {
        return Map.of("execution.state-recovery.path", path, "execution.state-recovery.claim-mode", mode);
    }

    /** Runs the job (from {@code restore}) for six checkpoints, cancels it, returns the retained one. */
    private static String runAndCancel(Map<String, String> cluster, ChangelogTestJob.Params p,
            Map<String, String> restore) throws Exception {
        try (LocalCluster c = LocalCluster.start(cluster, 4)) {
            JobID job = c.submit(TestSettings.merge(cluster, TestSettings.job(2), retain(), restore), p);
            c.awaitCompletedCheckpoints(job, 6, Duration.ofSeconds(90));
            return c.cancelAndGetRetainedCheckpoint(job);
        }
    }

    private static JobResult runToEnd(Map<String, String> cluster, ChangelogTestJob.Params p,
            Map<String, String> restore, Duration timeout) throws Exception {
        try (LocalCluster c = LocalCluster.start(cluster, 4)) {
            JobID job = c.submit(TestSettings.merge(cluster, TestSettings.job(2), retain(), restore), p);
            return c.awaitResult(job, timeout);
        }
    }

    private static Map<String, String> retain() {
        Map<String, String> retain = new HashMap<>();
        retain.put("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION");
        return retain;
    }
}
