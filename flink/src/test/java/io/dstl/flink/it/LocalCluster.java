package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.checkpoint.CheckpointStatsSnapshot;
import org.apache.flink.runtime.checkpoint.CompletedCheckpointStats;
import org.apache.flink.runtime.executiongraph.AccessExecutionGraph;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.jobgraph.SavepointRestoreSettings;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.runtime.scheduler.ExecutionGraphInfo;
import org.apache.flink.runtime.scheduler.exceptionhistory.ExceptionHistoryEntry;
import org.apache.flink.runtime.scheduler.exceptionhistory.RootExceptionHistoryEntry;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * One in-process Flink cluster (a {@link MiniCluster}) for one job run. Its configuration plays
 * the role of the cluster's config.yaml: the TaskManagers create the changelog storage from it.
 * The plugin jar is on the test classpath, because a MiniCluster never loads plugins/.
 */
final class LocalCluster implements AutoCloseable {

    private final MiniCluster cluster;

    private LocalCluster(MiniCluster cluster) {
        this.cluster = cluster;
    }

    static LocalCluster start(Map<String, String> clusterConfig, int slots) throws Exception {
        Configuration conf = Configuration.fromMap(clusterConfig);
        // What a cluster's entry point does (a MiniCluster does not): the file systems get
        // the cluster's configuration, dstl-s3:// its state.changelog.dstl.s3.* keys.
        org.apache.flink.core.fs.FileSystem.initialize(conf, null);
        conf.setString("rest.bind-port", "0");
        MiniCluster cluster = new MiniCluster(new MiniClusterConfiguration.Builder()
                .setConfiguration(conf)
                .setNumTaskManagers(1)
                .setNumSlotsPerTaskManager(slots)
                .build());
        cluster.start();
        return new LocalCluster(cluster);
    }

    /**
     * Submits the test job with the given job configuration. A restore path in it
     * ({@code execution.state-recovery.path}, with its claim mode) is applied to the job graph
     * as the CLI would.
     */
    JobID submit(Map<String, String> jobConfig, ChangelogTestJob.Params params) throws Exception {
        Configuration conf = Configuration.fromMap(jobConfig);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        ChangelogTestJob.build(env, params);
        JobGraph jobGraph = env.getStreamGraph().getJobGraph();
        jobGraph.setSavepointRestoreSettings(SavepointRestoreSettings.fromConfiguration(conf));
        return cluster.submitJob(jobGraph).get(30, TimeUnit.SECONDS).getJobID();
    }

    AccessExecutionGraph graph(JobID job) throws Exception {
        return cluster.getExecutionGraph(job).get(30, TimeUnit.SECONDS);
    }

    /** Checkpoint statistics; also available once the job has terminated. */
    CheckpointStatsSnapshot checkpoints(JobID job) throws Exception {
        return info(job).getArchivedExecutionGraph().getCheckpointStatsSnapshot();
    }

    ExecutionGraphInfo info(JobID job) throws Exception {
        return cluster.getExecutionGraphInfo(job).get(30, TimeUnit.SECONDS);
    }

    /** Waits until {@code n} checkpoints have completed; fails if the job ends first. */
    void awaitCompletedCheckpoints(JobID job, long n, Duration timeout) throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            AccessExecutionGraph g = graph(job);
            long completed = g.getCheckpointStatsSnapshot().getCounts().getNumberOfCompletedCheckpoints();
            if (completed >= n) {
                return;
            }
            if (g.getState().isGloballyTerminalState()) {
                throw new AssertionError("job ended (" + g.getState() + ") after " + completed
                        + " completed checkpoints, before " + n + " had completed\n" + describeFailures(job));
            }
            if (System.nanoTime() > deadline) {
                throw new AssertionError("only " + completed + " of " + n + " checkpoints completed within "
                        + timeout + " (job " + g.getState() + ")\n" + describeFailures(job));
            }
            Thread.sleep(50);
        }
    }

    JobResult awaitResult(JobID job, Duration timeout) throws Exception {
        try {
            return cluster.requestJobResult(job).get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.TimeoutException e) {
            throw new AssertionError("job did not terminate within " + timeout + " (status "
                    + cluster.getJobStatus(job).get() + ")\n" + describeFailures(job), e);
        }
    }

    /** Waits for the job to finish successfully; reports the failure history if it does not. */
    JobResult awaitSuccess(JobID job, Duration timeout) throws Exception {
        JobResult result = awaitResult(job, timeout);
        if (!result.isSuccess() || result.getJobStatus().orElse(null) != JobStatus.FINISHED) {
            throw new AssertionError("job did not finish: " + result.getJobStatus().orElse(null) + "\n"
                    + result.getSerializedThrowable().map(t -> Failures.chain(t.deserializeError(getClass().getClassLoader())))
                            .orElse("") + "\n" + describeFailures(job));
        }
        return result;
    }

    /**
     * Cancels the job (its checkpoints are retained on cancellation) and returns the external
     * path of the latest completed checkpoint.
     */
    String cancelAndGetRetainedCheckpoint(JobID job) throws Exception {
        cancel(job);
        CompletedCheckpointStats latest = checkpoints(job).getHistory().getLatestCompletedCheckpoint();
        if (latest == null || latest.getExternalPath() == null) {
            throw new AssertionError("no retained checkpoint after cancelling " + job);
        }
        return latest.getExternalPath();
    }

    /**
     * Cancels the job and waits until it is CANCELED; with the default retention its
     * checkpoints are then discarded, not retained.
     */
    void cancel(JobID job) throws Exception {
        cluster.cancelJob(job).get(30, TimeUnit.SECONDS);
        JobResult result = awaitResult(job, Duration.ofSeconds(60));
        if (result.getJobStatus().orElse(null) != JobStatus.CANCELED) {
            throw new AssertionError("expected the job to be cancelled mid-way, but it ended as "
                    + result.getJobStatus().orElse(null) + "\n" + describeFailures(job));
        }
    }

    /** Slots of the cluster no job holds. */
    int freeSlots() throws Exception {
        return cluster.getResourceOverview().get(30, TimeUnit.SECONDS).getNumberFreeSlots();
    }

    /** Asks the cluster to cancel the job, without waiting for it. */
    void requestCancel(JobID job) throws Exception {
        cluster.cancelJob(job).get(30, TimeUnit.SECONDS);
    }

    JobStatus status(JobID job) throws Exception {
        return cluster.getJobStatus(job).get(30, TimeUnit.SECONDS);
    }

    /**
     * Records the vertices whose name contains {@code name} took in, over the current attempt
     * of every subtask (for a failed task: up to its failure).
     */
    long recordsIn(JobID job, String name) throws Exception {
        long total = 0;
        for (org.apache.flink.runtime.executiongraph.AccessExecutionJobVertex v
                : info(job).getArchivedExecutionGraph().getVerticesTopologically()) {
            if (!v.getName().contains(name)) {
                continue;
            }
            for (org.apache.flink.runtime.executiongraph.AccessExecutionVertex sub : v.getTaskVertices()) {
                org.apache.flink.runtime.executiongraph.IOMetrics m = sub.getCurrentExecutionAttempt().getIOMetrics();
                total += m == null ? 0 : m.getNumRecordsIn();
            }
        }
        return total;
    }

    /** Root exceptions of every failover of the job, oldest first. */
    List<Throwable> rootFailures(JobID job) throws Exception {
        List<RootExceptionHistoryEntry> entries = history(job);
        List<Throwable> out = new ArrayList<>();
        for (RootExceptionHistoryEntry e : entries) {
            out.add(e.getException().deserializeError(getClass().getClassLoader()));
        }
        return out;
    }

    private List<RootExceptionHistoryEntry> history(JobID job) throws Exception {
        List<RootExceptionHistoryEntry> entries = new ArrayList<>();
        info(job).getExceptionHistory().forEach(entries::add);
        entries.sort(java.util.Comparator.comparingLong(RootExceptionHistoryEntry::getTimestamp));
        return entries;
    }

    /** Human-readable failure history, with concurrent exceptions. */
    String describeFailures(JobID job) {
        try {
            StringBuilder sb = new StringBuilder();
            int i = 0;
            for (RootExceptionHistoryEntry e : history(job)) {
                sb.append("failure #").append(i++).append(" in ").append(e.getFailingTaskName()).append(":\n")
                        .append(Failures.chain(e.getException().deserializeError(getClass().getClassLoader())));
                for (ExceptionHistoryEntry c : e.getConcurrentExceptions()) {
                    sb.append("  concurrent in ").append(c.getFailingTaskName()).append(":\n")
                            .append(Failures.chain(c.getException().deserializeError(getClass().getClassLoader())));
                }
            }
            return sb.length() == 0 ? "(no failures recorded)" : sb.toString();
        } catch (Exception e) {
            return "(failure history unavailable: " + e + ")";
        }
    }

    @Override
    public void close() throws java.util.concurrent.ExecutionException, java.util.concurrent.TimeoutException {
        try {
            cluster.closeAsync().get(60, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted while shutting down the MiniCluster", e);
        }
    }

    /** Number of regular files below {@code dir}: shows whether a storage wrote anything there. */
    static long countFiles(Path dir) throws IOException {
        if (!Files.isDirectory(dir)) {
            return 0;
        }
        try (Stream<Path> s = Files.walk(dir)) {
            return s.filter(Files::isRegularFile).count();
        }
    }

    /** Up to {@code n} file paths below {@code dir}, relative to it. */
    static List<String> sampleFiles(Path dir, int n) throws IOException {
        if (!Files.isDirectory(dir)) {
            return List.of();
        }
        try (Stream<Path> s = Files.walk(dir)) {
            return s.filter(Files::isRegularFile).limit(n).map(f -> dir.relativize(f).toString())
                    .collect(java.util.stream.Collectors.toList());
        }
    }
}
