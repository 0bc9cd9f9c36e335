package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.checkpoint.CheckpointStatsCounts;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/** The steps the tests share: run the job on a fresh cluster and check what it did. */
final class Scenarios {

    static final Duration JOB_TIMEOUT = Duration.ofSeconds(120);

    private Scenarios() {}

    /** Input sized so that a run takes about four seconds, i.e. some twenty checkpoints. */
    static ChangelogTestJob.Params params(Path dir) throws IOException {
        ChangelogTestJob.Params p = new ChangelogTestJob.Params();
        p.keys = 12;
        p.recordsPerKey = 300;
        p.eventsPerSecond = 900;
        p.payloadBytes = 64;
        p.outputDir = Files.createDirectories(dir.resolve("output")).toString();
        return p;
    }

    /** Arms {@code n} injected failures (see {@link ChangelogTestJob}). */
    static void armFailures(ChangelogTestJob.Params p, Path dir, int n) throws IOException {
        Path failures = Files.createDirectories(dir.resolve("failures"));
        for (int i = 0; i < n; i++) {
            Files.createFile(failures.resolve(ChangelogTestJob.FAILURE_MARKER_PREFIX + i));
        }
        p.failureDir = failures.toString();
        p.failures = n;
    }

    /**
     * Runs the job to completion on a fresh cluster and asserts: the configured storage wrote
     * changelog files, exactly the armed failures happened (nothing else failed), each was
     * followed by a restore from a checkpoint, and the final state is exact.
     */
    static void runToCompletion(String label, Map<String, String> clusterConfig, Map<String, String> jobConfig,
            ChangelogTestJob.Params p, int slots) throws Exception {
        long start = System.nanoTime();
        try (LocalCluster cluster = LocalCluster.start(clusterConfig, slots)) {
            JobID job = cluster.submit(TestSettings.merge(clusterConfig, jobConfig), p);
            cluster.awaitCompletedCheckpoints(job, 2, Duration.ofSeconds(60));
            assertChangelogWritten(clusterConfig, label);
            cluster.awaitSuccess(job, JOB_TIMEOUT);
            CheckpointStatsCounts counts = cluster.checkpoints(job).getCounts();
            assertInjectedFailuresOnly(cluster, job, p, label);
            if (counts.getNumberOfRestoredCheckpoints() != p.failures) {
                throw new AssertionError(label + ": expected " + p.failures + " restores from a checkpoint (one per"
                        + " injected failure), saw " + counts.getNumberOfRestoredCheckpoints() + "\n"
                        + cluster.describeFailures(job));
            }
            ExpectedResults.verify(p, Path.of(p.outputDir), label);
            report(label, start, counts);
        }
    }

    /** Every armed marker was consumed, and every failover was caused by one of them. */
    static void assertInjectedFailuresOnly(LocalCluster cluster, JobID job, ChangelogTestJob.Params p, String label)
            throws Exception {
        List<String> left = remainingMarkers(p);
        if (!left.isEmpty()) {
            throw new AssertionError(label + ": failure markers not consumed, so fewer failures than intended"
                    + " happened: " + left);
        }
        List<Throwable> failures = cluster.rootFailures(job);
        List<Throwable> unexpected = failures.stream().filter(t -> !Failures.isInjected(t)).collect(Collectors.toList());
        if (!unexpected.isEmpty() || failures.size() != p.failures) {
            throw new AssertionError(label + ": expected exactly " + p.failures + " injected failures, saw "
                    + failures.size() + " failovers, " + unexpected.size() + " of them not injected:\n"
                    + cluster.describeFailures(job));
        }
    }

    static List<String> remainingMarkers(ChangelogTestJob.Params p) throws IOException {
        if (p.failureDir == null) {
            return List.of();
        }
        try (Stream<Path> s = Files.list(Path.of(p.failureDir))) {
            return s.map(f -> f.getFileName().toString()).sorted().collect(Collectors.toList());
        }
    }

    /** The storage under test wrote something below its base path while checkpoints completed. */
    static void assertChangelogWritten(Map<String, String> clusterConfig, String label) throws IOException {
        Path base = Path.of(java.net.URI.create(clusterConfig.get("state.changelog.dstl.dfs.base-path")));
        long files = LocalCluster.countFiles(base);
        if (files == 0) {
            throw new AssertionError(label + ": checkpoints completed but storage "
                    + clusterConfig.get("state.changelog.storage") + " wrote no file below " + base);
        }
    }

    static void report(String label, long startNanos, CheckpointStatsCounts counts) {
        System.out.printf("[dstl-it] %-60s %6.1f s  checkpoints completed=%d failed=%d restored=%d%n", label,
                (System.nanoTime() - startNanos) / 1e9, counts.getNumberOfCompletedCheckpoints(),
                counts.getNumberOfFailedCheckpoints(), counts.getNumberOfRestoredCheckpoints());
    }

    static void note(String label, String text) {
        System.out.println("[dstl-it] " + label + ": " + text);
    }

    static List<String> listNames(Path dir) throws IOException {
        List<String> out = new ArrayList<>();
        if (Files.isDirectory(dir)) {
            try (Stream<Path> s = Files.list(dir)) {
                s.forEach(f -> out.add(f.getFileName().toString()));
            }
        }
        return out;
    }
}
