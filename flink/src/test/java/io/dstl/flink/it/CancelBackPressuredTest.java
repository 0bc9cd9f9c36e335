package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.junit.jupiter.api.Timeout;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;

/**
 * (r) A job back-pressured by dstl against a store that never answers is cancelled within
 * seconds and gives its slots back. The changelog goes to SeaweedFS with a tiny in-flight limit;
 * once the job checkpoints, the server is stopped (SIGSTOP): uploads hang, the limit fills, and
 * the task threads block in dstl for capacity. Flink's cancellation interrupts them; dstl must
 * let go (an uninterruptible wait would hold the task until Flink's watchdog kills the
 * TaskManager after three minutes), and the storage's close at the job's end must not wait on
 * the hung uploads beyond its grace.
 */
@Timeout(240)
class CancelBackPressuredTest extends JobTest {

    /** What "within seconds" means here: well below Flink's 30 s interrupt interval. */
    private static final Duration CANCEL_LIMIT = Duration.ofSeconds(20);

    @DstlOnly
    void aJobBackPressuredAgainstAHungStoreIsCancelledAndFreesItsSlots() throws Exception {
        String label = "(r) cancel while back-pressured";
        ChangelogTestJob.Params p = params(8, 100_000, 20_000, 1024);
        int slots = 4;
        try (Seaweed weed = Seaweed.start(dir.resolve("weed"), "cancel")) {
            Map<String, String> clusterConfig = changelog(TestSettings.DSTL);
            clusterConfig.put("state.changelog.dstl.dfs.base-path", "s3://" + weed.bucket + "/changelog");
            clusterConfig.putAll(weed.dstlSettings());
            // Uploads that never end once the store stops: no attempt timeout, requests that
            // wait a day.
            clusterConfig.put("state.changelog.dstl.dfs.upload.retry-policy", "none");
            clusterConfig.put("state.changelog.dstl.s3.request-timeout", "1d");
            clusterConfig.put("state.changelog.dstl.dfs.upload.max-in-flight", "64kb");
            clusterConfig.put("state.changelog.dstl.dfs.batch.persist-size-threshold", "64kb");
            clusterConfig.put("state.changelog.dstl.dfs.preemptive-persist-threshold", "16kb");
            clusterConfig.put("metrics.reporter.recording.factory.class", RecordingMetricReporter.Factory.class.getName());
            RecordingMetricReporter.reset();
            try (LocalCluster cluster = LocalCluster.start(clusterConfig, slots)) {
                JobID job = cluster.submit(TestSettings.merge(clusterConfig, TestSettings.job(2)), p);
                cluster.awaitCompletedCheckpoints(job, 2, Duration.ofSeconds(90));
                weed.pause();
                try {
                    // Back-pressured: the stateful operator takes no record for two seconds.
                    long records = -1;
                    long still = System.nanoTime();
                    long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
                    while (System.nanoTime() - still < Duration.ofSeconds(2).toNanos()) {
                        long now = RecordingMetricReporter.recordsIntoStateUpdater();
                        if (now != records) {
                            records = now;
                            still = System.nanoTime();
                        }
                        if (System.nanoTime() > deadline) {
                            throw new AssertionError(label + ": the job never stalled on the stopped store ("
                                    + records + " records in)");
                        }
                        Thread.sleep(50);
                    }
                    if (cluster.status(job) != JobStatus.RUNNING) {
                        throw new AssertionError(label + ": expected the job RUNNING and stalled, it is "
                                + cluster.status(job) + "\n" + cluster.describeFailures(job));
                    }
                    long cancelling = System.nanoTime();
                    cluster.requestCancel(job);
                    Duration cancelled = awaitStatus(cluster, job, JobStatus.CANCELED, label);
                    Duration freed = awaitFreeSlots(cluster, slots, cancelling, label);
                    Scenarios.note(label, String.format(
                            "stalled at %d records in; CANCELED after %.1f s, all %d slots free after %.1f s",
                            records, cancelled.toMillis() / 1e3, slots, freed.toMillis() / 1e3));
                } finally {
                    weed.resume();
                }
            }
        }
    }

    private static Duration awaitStatus(LocalCluster cluster, JobID job, JobStatus wanted, String label)
            throws Exception {
        long start = System.nanoTime();
        while (true) {
            JobStatus status = cluster.status(job);
            Duration took = Duration.ofNanos(System.nanoTime() - start);
            if (status == wanted) {
                return took;
            }
            if (took.compareTo(CANCEL_LIMIT) > 0) {
                throw new AssertionError(label + ": still " + status + " " + took.toSeconds() + " s after the cancel"
                        + " (a task held in dstl?)\n" + cluster.describeFailures(job) + "\n" + taskThreads());
            }
            Thread.sleep(50);
        }
    }

    /** The stacks of the tasks' threads (this JVM runs the MiniCluster): where a cancel is held. */
    static String taskThreads() {
        StringBuilder out = new StringBuilder();
        for (Map.Entry<Thread, StackTraceElement[]> t : Thread.getAllStackTraces().entrySet()) {
            String name = t.getKey().getName();
            if (!name.contains("(") || !name.contains("/")) {
                continue;
            }
            out.append('"').append(name).append("\" ").append(t.getKey().getState()).append('\n');
            for (StackTraceElement e : t.getValue()) {
                out.append("    at ").append(e).append('\n');
            }
        }
        return out.toString();
    }

    private static Duration awaitFreeSlots(LocalCluster cluster, int slots, long since, String label)
            throws Exception {
        while (true) {
            int free = cluster.freeSlots();
            Duration took = Duration.ofNanos(System.nanoTime() - since);
            if (free == slots) {
                return took;
            }
            if (took.compareTo(CANCEL_LIMIT) > 0) {
                throw new AssertionError(label + ": only " + free + " of " + slots + " slots free "
                        + took.toSeconds() + " s after the cancel");
            }
            Thread.sleep(50);
        }
    }

}
