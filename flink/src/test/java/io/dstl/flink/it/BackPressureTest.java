package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.metrics.Gauge;
import org.apache.flink.runtime.checkpoint.CheckpointStatsCounts;
import org.junit.jupiter.api.Timeout;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * (j) The upload in-flight limit is the changelog's back-pressure: with a 1 MiB limit, 32 KiB
 * list elements arriving faster than uploads of 256 KiB pre-emptive persists drain, the
 * storage turns unavailable, the task stops taking input until uploads complete, and the job
 * must still finish with exact state: throttling, not deadlock. Whole-list rewrites (every
 * 64th append of a key) make single changes of some 2 MiB, larger than the limit itself,
 * which must still be admitted once nothing else is in flight. Flink's own storage runs the
 * same job as the control.
 *
 * <p>A deadlock shows as a job that stays RUNNING while its stateful operator takes no more
 * records; the test fails on that after {@link #STALL} instead of waiting out the job
 * timeout, and reports any exception that killed a dstl thread.
 */
@Timeout(180)
class BackPressureTest extends JobTest {

    /** No record into the stateful operator for this long while the job runs: a deadlock. */
    private static final Duration STALL = Duration.ofSeconds(10);

    @EachStorage
    void tinyInFlightLimitThrottlesWithoutDeadlock(String storage) throws Exception {
        String label = "(j) back-pressure " + storage;
        // 800 records of 32 KiB, some 40 MiB of changelog with the rewrites, offered within
        // a second: the limit, not the source, sets the pace.
        ChangelogTestJob.Params p = params(8, 100, 1000, 32 * 1024);
        Map<String, String> clusterConfig = changelog(storage);
        clusterConfig.put("state.changelog.dstl.dfs.upload.max-in-flight", "1mb");
        clusterConfig.put("state.changelog.dstl.dfs.batch.persist-size-threshold", "512kb");
        clusterConfig.put("state.changelog.dstl.dfs.preemptive-persist-threshold", "256kb");
        // The recording reporter gives the operator's record counter while the job runs.
        clusterConfig.put("metrics.reporter.recording.factory.class", RecordingMetricReporter.Factory.class.getName());
        RecordingMetricReporter.reset();

        // A dstl thread that dies of an exception cannot complete what it was responsible
        // for (an availability future, a persist): record it for the failure message.
        List<String> died = new CopyOnWriteArrayList<>();
        Thread.UncaughtExceptionHandler previous = Thread.getDefaultUncaughtExceptionHandler();
        Thread.setDefaultUncaughtExceptionHandler((t, e) -> {
            if (t.getName().startsWith("dstl")) {
                StringWriter trace = new StringWriter();
                e.printStackTrace(new PrintWriter(trace));
                died.add(t.getName() + ": " + trace);
            }
            if (previous != null) {
                previous.uncaughtException(t, e);
            } else {
                // What the JVM prints without a handler (ThreadGroup's default would call
                // back into this handler).
                System.err.print("Exception in thread \"" + t.getName() + "\" ");
                e.printStackTrace();
            }
        });
        long start = System.nanoTime();
        long maxInFlight = 0;
        try (LocalCluster cluster = LocalCluster.start(clusterConfig, 4)) {
            JobID job = cluster.submit(TestSettings.merge(clusterConfig, TestSettings.job(2)), p);
            long deadline = System.nanoTime() + Scenarios.JOB_TIMEOUT.toNanos();
            long records = -1;
            long progressAt = System.nanoTime();
            while (true) {
                JobStatus status = cluster.status(job);
                if (status.isGloballyTerminalState()) {
                    break;
                }
                long now = RecordingMetricReporter.recordsIntoStateUpdater();
                if (now != records || status != JobStatus.RUNNING) {
                    records = now;
                    progressAt = System.nanoTime();
                }
                maxInFlight = Math.max(maxInFlight, dstlInFlightBytes());
                if (status == JobStatus.RUNNING && System.nanoTime() - progressAt > STALL.toNanos()) {
                    throw new AssertionError(label + ": the job is stuck: RUNNING, but its stateful operator took no"
                            + " record for " + STALL + " (" + records + " of " + p.totalEvents() + " so far,"
                            + " largest in-flight reading " + maxInFlight + " bytes); threads named dstl*: "
                            + dstlThreads() + "\n" + (died.isEmpty() ? "no dstl thread died of an exception"
                            : "dstl threads that died of an exception:\n" + String.join("\n", died))
                            + "\n" + cluster.describeFailures(job));
                }
                if (System.nanoTime() > deadline) {
                    throw new AssertionError(label + ": still " + status + " after " + Scenarios.JOB_TIMEOUT);
                }
                Thread.sleep(50);
            }
            cluster.awaitSuccess(job, Duration.ofSeconds(10));
            // The stall detector must watch the right counter: at the end it holds every event.
            if (RecordingMetricReporter.recordsIntoStateUpdater() != p.totalEvents()) {
                throw new AssertionError(label + ": the stateful operator's numRecordsIn reads "
                        + RecordingMetricReporter.recordsIntoStateUpdater() + " at the end, not the " + p.totalEvents() + " events of the input");
            }
            CheckpointStatsCounts counts = cluster.checkpoints(job).getCounts();
            Scenarios.assertInjectedFailuresOnly(cluster, job, p, label);
            ExpectedResults.verify(p, Path.of(p.outputDir), label);
            Scenarios.report(label, start, counts);
            if (storage.equals(TestSettings.DSTL)) {
                Scenarios.note(label, "largest in-flight reading " + maxInFlight + " bytes (sampled every 50 ms)");
            }
        } finally {
            Thread.setDefaultUncaughtExceptionHandler(previous);
        }
        if (!died.isEmpty()) {
            throw new AssertionError(label + ": the job finished, but dstl threads died of an exception:\n"
                    + String.join("\n", died));
        }
    }


    /** dstl's ChangelogStorage.inFlightBytes gauge (absent with Flink's storage). */
    private static long dstlInFlightBytes() {
        long max = 0;
        for (RecordingMetricReporter.Added a : RecordingMetricReporter.added("ChangelogStorage.inFlightBytes")) {
            Object v = ((Gauge<?>) a.metric()).getValue();
            if (v instanceof Number) {
                max = Math.max(max, ((Number) v).longValue());
            }
        }
        return max;
    }

    private static List<String> dstlThreads() {
        List<String> out = new ArrayList<>();
        for (Thread t : Thread.getAllStackTraces().keySet()) {
            if (t.getName().startsWith("dstl")) {
                out.add(t.getName() + " (" + t.getState() + ")");
            }
        }
        return out;
    }
}
