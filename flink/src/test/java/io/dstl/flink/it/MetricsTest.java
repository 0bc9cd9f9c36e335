package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.Gauge;
import org.apache.flink.metrics.Histogram;
import org.apache.flink.metrics.Metric;
import org.junit.jupiter.api.Timeout;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.stream.Collectors;

/**
 * (i) dstl reports its uploads through Flink's metric system under the names of Flink's own
 * changelog storage ({@code ChangelogStorage.*} in the job's TaskManager metric group), so
 * that dashboards and alerts built for Flink's changelog keep working. A reporter from the
 * test classpath records every metric the cluster registers; the test reads the upload
 * counter and the upload size histogram while the job still runs (dstl's values come from the
 * native storage, which stops answering once the job's storage is closed) and checks that
 * uploads were counted. Flink's filesystem storage runs the same assertions, and dstl must
 * register at least every {@code ChangelogStorage.*} name Flink does.
 */
@Timeout(180)
class MetricsTest extends JobTest {

    private static final String PREFIX = "ChangelogStorage.";
    private static final String REQUESTS = PREFIX + "numberOfUploadRequests";
    private static final String SIZES = PREFIX + "uploadSizes";

    /** The metrics of Flink's {@code ChangelogStorageMetricGroup}, and their kinds. */
    private static final Map<String, Class<? extends Metric>> EXPECTED = new LinkedHashMap<>();

    static {
        EXPECTED.put(REQUESTS, Counter.class);
        EXPECTED.put(PREFIX + "numberOfUploadFailures", Counter.class);
        EXPECTED.put(SIZES, Histogram.class);
        EXPECTED.put(PREFIX + "uploadLatenciesNanos", Histogram.class);
        EXPECTED.put(PREFIX + "attemptsPerUpload", Histogram.class);
        EXPECTED.put(PREFIX + "totalAttemptsPerUpload", Histogram.class);
        EXPECTED.put(PREFIX + "uploadBatchSizes", Histogram.class);
        EXPECTED.put(PREFIX + "uploadQueueSize", Gauge.class);
    }

    @DstlOnly
    void dstlRegistersFlinksChangelogMetricsAndCountsUploads() throws Exception {
        Map<String, TreeSet<String>> names = new LinkedHashMap<>();
        for (String storage : TestSettings.storages()) {
            names.put(storage, run("(i) metrics " + storage, storage));
        }
        TreeSet<String> dstl = names.get(TestSettings.DSTL);
        TreeSet<String> flink = names.get(TestSettings.FILESYSTEM);
        if (flink == null) {
            Scenarios.note("(i) metrics", "filesystem not in DSTL_FLINK_TEST_STORAGES: no comparison with Flink's"
                    + " storage");
            return;
        }
        TreeSet<String> missing = new TreeSet<>(flink);
        missing.removeAll(dstl);
        TreeSet<String> extra = new TreeSet<>(dstl);
        extra.removeAll(flink);
        Scenarios.note("(i) metrics", PREFIX + "* names only Flink's storage registers: " + missing
                + "; only dstl: " + extra);
        if (!missing.isEmpty()) {
            throw new AssertionError("(i) metrics: dstl does not register " + missing + ", which Flink's filesystem"
                    + " storage does\ndstl: " + dstl + "\nfilesystem: " + flink);
        }
    }

    /** Runs the job with the recording reporter; returns the ChangelogStorage.* names registered. */
    private TreeSet<String> run(String label, String storage) throws Exception {
        Path runDir = Files.createDirectories(dir.resolve(storage));
        ChangelogTestJob.Params p = Scenarios.params(runDir);
        // Some three seconds of input: a dozen checkpoints' worth of uploads to count.
        p.recordsPerKey = 200;
        Map<String, String> clusterConfig = TestSettings.changelog(storage, "hashmap",
                runDir.resolve("changelog"), runDir.resolve("checkpoints"));
        clusterConfig.put("metrics.reporter.recording.factory.class", RecordingMetricReporter.Factory.class.getName());

        RecordingMetricReporter.reset();
        long start = System.nanoTime();
        Observation last = null;
        long finishedAt;
        try (LocalCluster cluster = LocalCluster.start(clusterConfig, 4)) {
            JobID job = cluster.submit(TestSettings.merge(clusterConfig, TestSettings.job(2)), p);
            long deadline = System.nanoTime() + Scenarios.JOB_TIMEOUT.toNanos();
            while (true) {
                // Read first, then check that the job is still running: the observation is
                // then one of a running job's storage.
                long requests = sum(REQUESTS);
                long sizes = sum(SIZES);
                JobStatus status = cluster.status(job);
                if (status == JobStatus.RUNNING) {
                    last = new Observation(System.nanoTime(), requests, sizes);
                } else if (status.isGloballyTerminalState()) {
                    break;
                }
                if (System.nanoTime() > deadline) {
                    throw new AssertionError(label + ": the job did not end within " + Scenarios.JOB_TIMEOUT
                            + " (" + status + ")");
                }
                Thread.sleep(100);
            }
            finishedAt = System.nanoTime();
            cluster.awaitSuccess(job, Duration.ofSeconds(10));
            ExpectedResults.verify(p, Path.of(p.outputDir), label);
            Scenarios.report(label, start, cluster.checkpoints(job).getCounts());
        }

        List<String> problems = new ArrayList<>();
        for (Map.Entry<String, Class<? extends Metric>> e : EXPECTED.entrySet()) {
            List<RecordingMetricReporter.Added> added = RecordingMetricReporter.added(e.getKey());
            if (added.isEmpty()) {
                problems.add(e.getKey() + " was never registered");
                continue;
            }
            for (RecordingMetricReporter.Added a : added) {
                if (!e.getValue().isInstance(a.metric())) {
                    problems.add(a.identifier() + " is a " + a.metric().getClass().getName() + ", not a "
                            + e.getValue().getSimpleName());
                }
            }
        }
        if (last == null) {
            problems.add("the job was never seen running, so no value was read while it ran");
        } else {
            Scenarios.note(label, String.format("last reading while the job ran (%.1f s before it ended): %s=%d,"
                            + " %s count=%d; registered as %s", (finishedAt - last.at()) / 1e9, REQUESTS,
                    last.requests(), SIZES, last.sizes(), RecordingMetricReporter.added(REQUESTS).stream()
                            .map(RecordingMetricReporter.Added::identifier).collect(Collectors.toList())));
            if (last.requests() <= 0) {
                problems.add(REQUESTS + " was " + last.requests() + " near the end of a job that uploaded changelog");
            }
            if (last.sizes() <= 0) {
                problems.add(SIZES + " counted " + last.sizes() + " uploads near the end of a job that uploaded"
                        + " changelog");
            }
        }
        TreeSet<String> names = RecordingMetricReporter.names(PREFIX);
        Scenarios.note(label, "registered " + names);
        if (!problems.isEmpty()) {
            throw new AssertionError(label + ": " + String.join("; ", problems) + "\nregistered " + PREFIX + "*: "
                    + names);
        }
        return names;
    }

    /** The value of a counter or the count of a histogram, over every group that registered it. */
    private static long sum(String name) {
        long total = 0;
        for (RecordingMetricReporter.Added a : RecordingMetricReporter.added(name)) {
            if (a.metric() instanceof Counter) {
                total += ((Counter) a.metric()).getCount();
            } else if (a.metric() instanceof Histogram) {
                total += ((Histogram) a.metric()).getCount();
            }
        }
        return total;
    }

    /** A reading of the two metrics while the job ran, and when (nanoTime). */
    private record Observation(long at, long requests, long sizes) {}
}
