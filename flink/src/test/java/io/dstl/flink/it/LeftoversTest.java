package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.checkpoint.CheckpointStatsCounts;
import org.junit.jupiter.api.condition.EnabledIf;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * (g) What a job leaves below the changelog base path once it has ended and its cluster has
 * shut down, with the default retention (checkpoints are not retained, so the JobManager
 * discards them when the job finishes or is cancelled). Flink's own storage is the yardstick:
 * for the same job, dstl must leave no more files than it, no lease (a lease outliving its
 * storage would keep {@code dstl gc} off the job's files for ten minutes) and no staging file
 * (a {@code .}-name that an upload never moved into place).
 */
@Timeout(180)
class LeftoversTest extends JobTest {

    private static final Duration QUIET = Duration.ofMillis(300);
    private static final Duration SETTLE_TIMEOUT = Duration.ofSeconds(15);

    @ParameterizedTest(name = "job {0}")
    @ValueSource(strings = {"finished", "cancelled"})
    @EnabledIf("io.dstl.flink.it.TestSettings#dstlEnabled")
    void dstlLeavesNoMoreThanFlinksStorage(String ending) throws Exception {
        String label = "(g) leftovers, job " + ending;
        Map<String, BasePathListing> left = new LinkedHashMap<>();
        for (String storage : TestSettings.storages()) {
            left.put(storage, run(label + ", " + storage, storage, ending.equals("cancelled")));
        }
        left.forEach((storage, listing) -> Scenarios.note(label, storage + " left " + listing));

        BasePathListing dstl = left.get(TestSettings.DSTL);
        if (!dstl.leaseEntries().isEmpty()) {
            throw new AssertionError(label + ": dstl left lease entries after its storage closed (they would"
                    + " protect the job's files from dstl gc): " + dstl.leaseEntries() + "\nfull listing: " + dstl);
        }
        if (!dstl.hiddenEntries().isEmpty()) {
            throw new AssertionError(label + ": dstl left staging entries (names starting with '.'): "
                    + dstl.hiddenEntries() + "\nfull listing: " + dstl);
        }
        BasePathListing flink = left.get(TestSettings.FILESYSTEM);
        if (flink == null) {
            Scenarios.note(label, "filesystem not in DSTL_FLINK_TEST_STORAGES: no comparison with Flink's storage");
            return;
        }
        if (dstl.files().size() > flink.files().size()) {
            throw new AssertionError(label + ": dstl left " + dstl.files().size() + " file(s), Flink's filesystem"
                    + " storage only " + flink.files().size() + " for the same job\ndstl: " + dstl
                    + "\nfilesystem: " + flink);
        }
    }

    /** Runs the job on a fresh cluster, ends it and lists the base path after shutdown. */
    private BasePathListing run(String label, String storage, boolean cancel) throws Exception {
        Path runDir = Files.createDirectories(dir.resolve(storage));
        ChangelogTestJob.Params p = Scenarios.params(runDir);
        // Two seconds of input when run to the end; a cancelled run gets more input than it
        // can process before the cancellation, so it is surely cut off mid-way.
        p.recordsPerKey = cancel ? 600 : 150;
        Path base = runDir.resolve("changelog");
        Map<String, String> clusterConfig = TestSettings.changelog(storage, "hashmap", base,
                runDir.resolve("checkpoints"));
        long start = System.nanoTime();
        CheckpointStatsCounts counts;
        try (LocalCluster cluster = LocalCluster.start(clusterConfig, 4)) {
            JobID job = cluster.submit(TestSettings.merge(clusterConfig, TestSettings.job(2)), p);
            cluster.awaitCompletedCheckpoints(job, 3, Duration.ofSeconds(60));
            Scenarios.assertChangelogWritten(clusterConfig, label);
            if (storage.equals(TestSettings.DSTL)) {
                // The open storage holds a lease on its job: without one to see here, the
                // check for leftover leases below would prove nothing.
                BasePathListing running = BasePathListing.of(base);
                if (running.leaseEntries().isEmpty()) {
                    throw new AssertionError(label + ": no lease below the base path while the dstl storage is"
                            + " open: " + running);
                }
                Scenarios.note(label, "while running: " + running.files().size() + " file(s), leases "
                        + running.leaseEntries());
            }
            if (cancel) {
                cluster.cancel(job);
                List<String> output = Scenarios.listNames(Path.of(p.outputDir));
                if (!output.isEmpty()) {
                    throw new AssertionError(label + ": results before the cancellation, so the job was not"
                            + " cut off mid-way: " + output);
                }
            } else {
                cluster.awaitSuccess(job, Scenarios.JOB_TIMEOUT);
                ExpectedResults.verify(p, Path.of(p.outputDir), label);
            }
            counts = cluster.checkpoints(job).getCounts();
            if (!cluster.rootFailures(job).isEmpty()) {
                throw new AssertionError(label + ": the job failed over:\n" + cluster.describeFailures(job));
            }
            // The JobManager discards the checkpoints asynchronously after the job ended;
            // give it that time while the cluster is still up.
            BasePathListing.awaitStable(base, QUIET, SETTLE_TIMEOUT, label);
        }
        BasePathListing listing = BasePathListing.awaitStable(base, QUIET, SETTLE_TIMEOUT, label + " after shutdown");
        Scenarios.report(label, start, counts);
        return listing;
    }
}
