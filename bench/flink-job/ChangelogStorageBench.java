package io.dstl.flink.bench;

import java.io.IOException;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryPoolMXBean;
import java.lang.management.MemoryType;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.runtime.checkpoint.AbstractCheckpointStats;
import org.apache.flink.runtime.checkpoint.CheckpointStatsSnapshot;
import org.apache.flink.runtime.checkpoint.CheckpointStatsStatus;
import org.apache.flink.runtime.checkpoint.RestoredCheckpointStats;
import org.apache.flink.runtime.checkpoint.SubtaskStateStats;
import org.apache.flink.runtime.checkpoint.TaskStateStats;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.jobgraph.JobVertex;
import org.apache.flink.runtime.jobgraph.JobVertexID;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;

/**
 * Runs one stateful streaming job on the changelog state backend with a given state changelog
 * storage, injects one task failure, and prints one JSON line of measurements on stdout.
 *
 * <p>Pipeline: unthrottled DataGeneratorSource (keys spread over {@code --keys}, values of
 * {@code --value-bytes} random bytes) -> keyBy(key) -> {@link StateUpdater} (one ValueState read
 * and write per record, i.e. one changelog entry per record) -> DiscardingSink. The job runs in a
 * MiniCluster (one TaskManager, {@code --parallelism} slots) inside this JVM, so this process's
 * peak RSS is the TaskManager's (and JobManager's) footprint.
 *
 * <p>Timeline, measured from the first record the stateful operator processes (t0):
 *
 * <ul>
 *   <li>[t0, warmup): JIT and allocation warm-up; nothing from here is reported.
 *   <li>[warmup, fail): the steady window for {@code records_per_s}.
 *   <li>fail ({@code --fail-at} of the duration, or once {@code --fail-at-records} records are
 *       processed, so that storages of different speeds restore the same changelog): the first
 *       subtask to see the request throws;
 *       the job restarts from its latest completed checkpoint (fixed-delay restart, 0 ms delay,
 *       so the restore time contains no arbitrary back-off).
 *   <li>restore: {@code restore_ms} runs from the throw to the moment every stateful subtask has
 *       processed its first record again (state downloaded and replayed, source rewound);
 *       {@code restore_state_ready_ms} stops earlier, at the restored operators' open().
 *   <li>end: t0 + duration (later if the restore took longer than the rest of the run).
 * </ul>
 *
 * <p>Which storage reads the changelog back on restore is decided by the storage identifier in
 * the restored state handles ({@code StateChangelogStorageLoader.loadFromStateHandle}), not by
 * {@code state.changelog.storage}; the log line "Creating a changelog storage with name ... to
 * restore from ..." names it.
 *
 * <p>Checkpoint times come from Flink's own checkpoint statistics (the JobManager's
 * CheckpointStatsTracker, the same data as the REST API's /jobs/:id/checkpoints), read through
 * {@link MiniCluster#getExecutionGraph}: completed checkpoints triggered after the warm-up, end
 * to end (trigger to last acknowledgement). With the changelog backend the synchronous part is
 * nearly empty and the asynchronous part waits for the changelog storage to make the changes up
 * to the checkpoint durable, so {@code checkpoint_async_*} (the slowest stateful subtask of each
 * checkpoint) isolates the storage's share and the end-to-end figure adds barrier alignment and
 * acknowledgement latency.
 */
public final class ChangelogStorageBench {
    /** CPU time of this process so far (every thread, user and system), in nanoseconds. */
    private static long processCpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime();
    }

    private static double perRecordMicros(long cpuNanos, long records) {
        return records <= 0 ? 0.0 : cpuNanos / 1e3 / records;
    }

    private static final String OPERATOR_NAME = "state-updater";

    private ChangelogStorageBench() {}

    public static void main(String[] args) throws Exception {
        Options o = Options.parse(args);
        Map<String, String> flinkConf = flinkConfiguration(o);
        Configuration conf = Configuration.fromMap(flinkConf);
        Probe.hitWindow = Math.max(1, o.keys / 2);
        // What a cluster's entry point does (a MiniCluster does not): the file systems get the
        // configuration, dstl-s3:// its state.changelog.dstl.s3.* keys.
        org.apache.flink.core.fs.FileSystem.initialize(conf, null);

        MiniClusterConfiguration clusterConf = new MiniClusterConfiguration.Builder()
                .setConfiguration(conf)
                .setNumTaskManagers(1)
                .setNumSlotsPerTaskManager(o.parallelism)
                .withRandomPorts()
                .build();
        try (MiniCluster cluster = new MiniCluster(clusterConf)) {
            cluster.start();
            JobGraph jobGraph = buildJob(conf, o);
            JobVertexID statefulVertex = statefulVertex(jobGraph);
            JobID jobId = cluster.submitJob(jobGraph).get().getJobID();
            String json = drive(cluster, jobId, statefulVertex, o, flinkConf);
            cluster.cancelJob(jobId).get(30, TimeUnit.SECONDS);
            waitTerminal(cluster, jobId, Duration.ofSeconds(60));
            System.out.println(json + ",\"peak_rss_mb\":" + fmt(peakRssMb()) + "}");
            System.out.flush();
        }
        // Flink leaves non-daemon threads (e.g. the changelog storage's pools) on some paths.
        System.exit(0);
    }

    /** Everything that shapes the run, printed into the result so two runs can be compared. */
    private static Map<String, String> flinkConfiguration(Options o) {
        // A local directory, or a file system's URI (dstl-s3://bucket/prefix: the changelog and
        // the checkpoints on an object store, through the dstl plugin's file system).
        String base = o.baseDir.contains("://")
                ? o.baseDir.replaceAll("/+$", "")
                : Paths.get(o.baseDir).toAbsolutePath().toUri().toString().replaceAll("/+$", "");
        Map<String, String> c = new LinkedHashMap<>();
        c.put("parallelism.default", Integer.toString(o.parallelism));
        c.put("state.backend.type", "hashmap");
        // state.changelog.* are Flink 2's names; state.backend.changelog.* still work as
        // deprecated fallbacks.
        c.put("state.changelog.enabled", "true");
        c.put("state.changelog.storage", o.storage);
        // Flink's filesystem storage and the dstl storage read the same state.changelog.dstl.dfs.*
        // keys, so one setting serves both.
        c.put("state.changelog.dstl.dfs.base-path", base + "/changelog");
        // Left at Flink's default (10 min) unless asked: no materialization happens within a
        // run, so every checkpoint is changelog only and the restore replays the whole changelog
        // written before the failure, which is the storage's read path at its longest.
        if (o.materializeInterval != null) {
            c.put("state.changelog.periodic-materialize.interval", o.materializeInterval);
        }
        c.put("execution.checkpointing.interval", o.checkpointIntervalMs + " ms");
        c.put("execution.checkpointing.storage", "filesystem");
        c.put("execution.checkpointing.dir", base + "/checkpoints");
        c.put("restart-strategy.type", "fixed-delay");
        c.put("restart-strategy.fixed-delay.attempts", "3");
        c.put("restart-strategy.fixed-delay.delay", "0 ms");
        // The statistics keep only this many recent checkpoints (default 10); keep the whole run.
        long expected = o.durationS * 1000L / Math.max(1, o.checkpointIntervalMs);
        c.put("web.checkpoints.history", Long.toString(2 * expected + 100));
        c.put("rest.bind-port", "0");
        c.putAll(o.extraConf);
        return c;
    }

    private static JobGraph buildJob(Configuration conf, Options o) {
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(o.parallelism);
        // A rate limit makes both storages log the same changes, so their restores read the
        // same amount; unlimited, each runs as fast as it lets the job.
        DataGeneratorSource<Tuple2<Long, byte[]>> source = new DataGeneratorSource<>(
                new EventGenerator(o.keys, o.valueBytes),
                Long.MAX_VALUE,
                o.recordsPerSecond > 0
                        ? RateLimiterStrategy.perSecond(o.recordsPerSecond)
                        : RateLimiterStrategy.noOp(),
                Types.TUPLE(Types.LONG, PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO));
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "generator")
                .uid("generator")
                .keyBy(new ByKey(), Types.LONG)
                .process(new StateUpdater(), Types.LONG)
                .name(OPERATOR_NAME)
                .uid(OPERATOR_NAME)
                .sinkTo(new DiscardingSink<>())
                .name("discard")
                .uid("discard");
        return env.getStreamGraph().getJobGraph();
    }

    private static JobVertexID statefulVertex(JobGraph jobGraph) {
        for (JobVertex v : jobGraph.getVertices()) {
            if (v.getName().contains(OPERATOR_NAME)) {
                return v.getID();
            }
        }
        throw new IllegalStateException("no vertex named " + OPERATOR_NAME);
    }

    private static String drive(
            MiniCluster cluster, JobID jobId, JobVertexID statefulVertex, Options o,
            Map<String, String> flinkConf) throws Exception {
        long durationNanos = TimeUnit.SECONDS.toNanos(o.durationS);
        // t0: the first record through the stateful operator (deployment and start-up excluded).
        long startDeadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
        while (Probe.PROCESSED.sum() == 0) {
            ensureRunning(cluster, jobId);
            if (System.nanoTime() > startDeadline) {
                throw new IllegalStateException("no record processed within 120 s of submission");
            }
            Thread.sleep(5);
        }
        long t0 = System.nanoTime();

        sleepUntil(cluster, jobId, t0 + (long) (durationNanos * o.warmupFraction));
        long warmupNanos = System.nanoTime();
        long warmupWallMs = System.currentTimeMillis();
        long warmupCount = Probe.PROCESSED.sum();
        long warmupCpu = processCpuNanos();

        if (o.failAtRecords > 0) {
            awaitRecords(cluster, jobId, warmupCount, o.failAtRecords, t0 + durationNanos);
        } else {
            sleepUntil(cluster, jobId, t0 + (long) (durationNanos * o.failAtFraction));
        }
        long failNanos = System.nanoTime();
        long failCount = Probe.PROCESSED.sum();
        long failCpu = processCpuNanos();
        Probe.failRequested = true;

        long restoreDeadline = Math.max(t0 + durationNanos, failNanos)
                + TimeUnit.SECONDS.toNanos(o.restoreTimeoutS);
        long restoredAt;
        long nextStatusCheck = 0;
        while ((restoredAt = Probe.maxOf(Probe.FIRST_RECORD_AFTER_FAILURE, o.parallelism)) == 0) {
            if (System.nanoTime() > restoreDeadline) {
                throw new IllegalStateException("the job did not come back within "
                        + o.restoreTimeoutS + " s after the end of the run");
            }
            if (System.nanoTime() > nextStatusCheck) {
                ensureRunning(cluster, jobId);
                nextStatusCheck = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(200);
            }
            Thread.sleep(1);
        }
        long restoredCount = Probe.PROCESSED.sum();
        long restoredCpu = processCpuNanos();
        sleepUntil(cluster, jobId, t0 + durationNanos);
        long endNanos = System.nanoTime();
        long endCount = Probe.PROCESSED.sum();
        long endCpu = processCpuNanos();

        CheckpointStatsSnapshot stats =
                cluster.getExecutionGraph(jobId).get(30, TimeUnit.SECONDS).getCheckpointStatsSnapshot();
        List<Long> e2e = new ArrayList<>();
        List<Long> async = new ArrayList<>();
        List<Long> alignment = new ArrayList<>();
        List<Long> sizes = new ArrayList<>();
        for (AbstractCheckpointStats cp : stats.getHistory().getCheckpoints()) {
            if (cp.getStatus() != CheckpointStatsStatus.COMPLETED
                    || cp.getProperties().isSavepoint()
                    || cp.getTriggerTimestamp() < warmupWallMs) {
                continue;
            }
            e2e.add(cp.getEndToEndDuration());
            sizes.add(cp.getCheckpointedSize());
            TaskStateStats task = cp.getTaskStateStats(statefulVertex);
            if (task != null) {
                long maxAsync = 0;
                long maxAlign = 0;
                for (SubtaskStateStats s : task.getSubtaskStats()) {
                    if (s != null) {
                        maxAsync = Math.max(maxAsync, s.getAsyncCheckpointDuration());
                        maxAlign = Math.max(maxAlign, s.getAlignmentDuration());
                    }
                }
                async.add(maxAsync);
                alignment.add(maxAlign);
            }
        }
        RestoredCheckpointStats restored = stats.getLatestRestoredCheckpoint();
        long failedAt = Probe.failedAtNanos;
        long stateReadyAt = Probe.maxOf(Probe.OPENED_AFTER_FAILURE, o.parallelism);
        long seen = Probe.RESTORED_SEEN.sum();

        StringBuilder j = new StringBuilder("{");
        field(j, "storage", o.storage);
        field(j, "duration_s", o.durationS);
        field(j, "parallelism", o.parallelism);
        field(j, "keys", o.keys);
        field(j, "value_bytes", o.valueBytes);
        field(j, "checkpoint_interval_ms", o.checkpointIntervalMs);
        field(j, "records_per_s", rate(failCount - warmupCount, failNanos - warmupNanos));
        field(j, "records_per_s_after_restore", rate(endCount - restoredCount, endNanos - restoredAt));
        field(j, "records_total", endCount);
        field(j, "records_before_failure", failCount);
        // The process's CPU time (every thread, user and system) per record in the steady
        // window and after the restore, and spent on the restore itself. The whole run's CPU
        // per record (the script's process_cpu_s / records_total) also holds the restore,
        // whose size grows with the records logged before the failure.
        field(j, "steady_cpu_us_per_record", perRecordMicros(failCpu - warmupCpu, failCount - warmupCount));
        field(j, "after_restore_cpu_us_per_record", perRecordMicros(endCpu - restoredCpu, endCount - restoredCount));
        field(j, "restore_cpu_s", (restoredCpu - failCpu) / 1e9);
        field(j, "checkpoints_measured", e2e.size());
        field(j, "checkpoints_completed_total", stats.getCounts().getNumberOfCompletedCheckpoints());
        field(j, "checkpoints_failed_total", stats.getCounts().getNumberOfFailedCheckpoints());
        field(j, "checkpoint_p50_ms", percentile(e2e, 50));
        field(j, "checkpoint_p99_ms", percentile(e2e, 99));
        field(j, "checkpoint_p999_ms", percentile(e2e, 99.9));
        field(j, "checkpoint_max_ms", percentile(e2e, 100));
        field(j, "checkpoint_async_p50_ms", percentile(async, 50));
        field(j, "checkpoint_async_p99_ms", percentile(async, 99));
        field(j, "checkpoint_alignment_p99_ms", percentile(alignment, 99));
        field(j, "checkpointed_bytes_p50", percentile(sizes, 50));
        field(j, "restore_ms", ms(restoredAt - failedAt));
        field(j, "restore_state_ready_ms", stateReadyAt == 0 ? -1 : ms(stateReadyAt - failedAt));
        field(j, "restored_checkpoint_id", restored == null ? -1 : restored.getCheckpointId());
        // Without materialization in the run, the restored state is the whole changelog written
        // so far, so its size grows with the throughput before the failure: bytes per second of
        // restore compares storages whose runs wrote different amounts.
        long restoredBytes = restored == null ? 0 : restored.getStateSize();
        field(j, "restored_state_bytes", restoredBytes);
        field(j, "restore_mb_per_s", stateReadyAt == 0 ? 0.0
                : restoredBytes / 1e6 / ((stateReadyAt - failedAt) / 1e9));
        // The restore's CPU per restored byte: what compares runs whose restores read different amounts.
        field(j, "restore_cpu_s_per_gb", restoredBytes == 0 ? 0.0 : (restoredCpu - failCpu) / 1e9 / (restoredBytes / 1e9));
        field(j, "restore_state_hit_ratio", seen == 0 ? 0.0 : (double) Probe.RESTORED_HITS.sum() / seen);
        field(j, "jvm_max_heap_mb", Runtime.getRuntime().maxMemory() / (1024 * 1024));
        // The RSS is mostly Java heap; these tell how much of it is, and how much GC the
        // storage's allocations caused.
        long heapCommittedPeak = 0;
        for (MemoryPoolMXBean pool : ManagementFactory.getMemoryPoolMXBeans()) {
            if (pool.getType() == MemoryType.HEAP && pool.getPeakUsage() != null) {
                heapCommittedPeak += pool.getPeakUsage().getCommitted();
            }
        }
        field(j, "jvm_heap_peak_committed_mb", heapCommittedPeak / (1024 * 1024));
        long gcMs = 0;
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            gcMs += Math.max(0, gc.getCollectionTime());
        }
        field(j, "gc_ms", gcMs);
        j.append("\"flink_conf\":{");
        boolean first = true;
        for (Map.Entry<String, String> e : flinkConf.entrySet()) {
            if (!first) {
                j.append(',');
            }
            first = false;
            j.append(quote(e.getKey())).append(':').append(quote(e.getValue()));
        }
        // The caller appends the peak RSS once the cluster is gone, then closes the object.
        return j.append('}').toString();
    }

    private static void sleepUntil(MiniCluster cluster, JobID jobId, long deadlineNanos)
            throws Exception {
        long now;
        while ((now = System.nanoTime()) < deadlineNanos) {
            ensureRunning(cluster, jobId);
            Thread.sleep(Math.max(1, Math.min(200, (deadlineNanos - now) / 1_000_000)));
        }
    }

    /**
     * Waits until the stateful operator has processed {@code records} records, so runs of
     * different storages fail with the same changelog behind them and restore the same state.
     */
    private static void awaitRecords(MiniCluster cluster, JobID jobId, long warmupCount, long records,
            long deadlineNanos) throws Exception {
        if (warmupCount >= records) {
            throw new IllegalStateException("--fail-at-records " + records + " was reached during the warm-up ("
                    + warmupCount + " records): ask for more records or a shorter --warmup");
        }
        long nextStatusCheck = 0;
        while (Probe.PROCESSED.sum() < records) {
            if (System.nanoTime() > deadlineNanos) {
                throw new IllegalStateException("--fail-at-records " + records + " was not reached within the run ("
                        + Probe.PROCESSED.sum() + " records): ask for fewer records or a longer --duration");
            }
            if (System.nanoTime() > nextStatusCheck) {
                ensureRunning(cluster, jobId);
                nextStatusCheck = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(200);
            }
            Thread.sleep(1);
        }
    }

    /** Fails fast (with Flink's own cause) if the job died instead of restarting. */
    private static void ensureRunning(MiniCluster cluster, JobID jobId) throws Exception {
        JobStatus status = cluster.getJobStatus(jobId).get(30, TimeUnit.SECONDS);
        if (status.isGloballyTerminalState()) {
            JobResult result = cluster.requestJobResult(jobId).get(30, TimeUnit.SECONDS);
            Throwable cause = result.getSerializedThrowable()
                    .map(t -> t.deserializeError(ChangelogStorageBench.class.getClassLoader()))
                    .orElse(null);
            throw new IllegalStateException("job ended early with status " + status, cause);
        }
    }

    private static void waitTerminal(MiniCluster cluster, JobID jobId, Duration timeout)
            throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!cluster.getJobStatus(jobId).get(30, TimeUnit.SECONDS).isGloballyTerminalState()) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("job did not stop within " + timeout);
            }
            Thread.sleep(20);
        }
    }

    /** VmHWM: the peak resident set of this process, i.e. of the whole MiniCluster. */
    private static double peakRssMb() throws IOException {
        for (String line : Files.readAllLines(Paths.get("/proc/self/status"))) {
            if (line.startsWith("VmHWM:")) {
                String[] parts = line.trim().split("\\s+");
                return Long.parseLong(parts[1]) / 1024.0; // kB
            }
        }
        return -1;
    }

    /** Nearest-rank percentile; with ~30 checkpoints per run p99 is the slowest one. */
    private static long percentile(List<Long> values, double p) {
        if (values.isEmpty()) {
            return -1;
        }
        List<Long> sorted = new ArrayList<>(values);
        Collections.sort(sorted);
        int rank = (int) Math.ceil(p / 100.0 * sorted.size());
        return sorted.get(Math.min(sorted.size(), Math.max(1, rank)) - 1);
    }

    private static double rate(long count, long nanos) {
        return nanos <= 0 ? 0 : count * 1e9 / nanos;
    }

    private static double ms(long nanos) {
        return nanos / 1e6;
    }

    private static String fmt(double v) {
        return String.format(Locale.ROOT, "%.1f", v);
    }

    private static void field(StringBuilder j, String name, Object value) {
        j.append(quote(name)).append(':');
        if (value instanceof String) {
            j.append(quote((String) value));
        } else if (value instanceof Double) {
            j.append(String.format(Locale.ROOT, "%.3f", (Double) value));
        } else {
            j.append(value);
        }
        j.append(',');
    }

    private static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }

    private static final class ByKey implements KeySelector<Tuple2<Long, byte[]>, Long> {
        private static final long serialVersionUID = 1L;

        @Override
        public Long getKey(Tuple2<Long, byte[]> record) {
            return record.f0;
        }
    }

    private static final class Options {
        String storage;
        String baseDir;
        int durationS = 30;
        int parallelism = 2;
        long keys = 100_000;
        int valueBytes = 100;
        long checkpointIntervalMs = 1000;
        double warmupFraction = 0.2;
        double failAtFraction = 0.6;
        /** The failure after this many records instead of at --fail-at; 0: at --fail-at. */
        long failAtRecords;
        String materializeInterval;
        int restoreTimeoutS = 120;
        /** Records per second of the whole source; 0: as fast as the job takes them. */
        double recordsPerSecond;
        final Map<String, String> extraConf = new LinkedHashMap<>();

        static Options parse(String[] args) {
            Options o = new Options();
            for (int i = 0; i < args.length; i++) {
                String a = args[i];
                if (i + 1 >= args.length) {
                    throw usage("missing value for " + a);
                }
                String v = args[++i];
                switch (a) {
                    case "--storage": o.storage = v; break;
                    case "--base-dir": o.baseDir = v; break;
                    case "--duration": o.durationS = Integer.parseInt(v); break;
                    case "--parallelism": o.parallelism = Integer.parseInt(v); break;
                    case "--keys": o.keys = Long.parseLong(v); break;
                    case "--value-bytes": o.valueBytes = Integer.parseInt(v); break;
                    case "--checkpoint-interval-ms": o.checkpointIntervalMs = Long.parseLong(v); break;
                    case "--warmup": o.warmupFraction = Double.parseDouble(v); break;
                    case "--fail-at": o.failAtFraction = Double.parseDouble(v); break;
                    case "--fail-at-records": o.failAtRecords = Long.parseLong(v); break;
                    case "--materialize-interval": o.materializeInterval = v; break;
                    case "--restore-timeout": o.restoreTimeoutS = Integer.parseInt(v); break;
                    case "--records-per-second": o.recordsPerSecond = Double.parseDouble(v); break;
                    case "--conf": {
                        int eq = v.indexOf('=');
                        if (eq <= 0) {
                            throw usage("--conf wants key=value, got " + v);
                        }
                        o.extraConf.put(v.substring(0, eq).trim(), v.substring(eq + 1).trim());
                        break;
                    }
                    default: throw usage("unknown option " + a);
                }
            }
            if (o.storage == null || o.baseDir == null) {
                throw usage("--storage and --base-dir are required");
            }
            if (o.parallelism < 1 || o.parallelism > Probe.MAX_SUBTASKS) {
                throw usage("--parallelism must be in 1.." + Probe.MAX_SUBTASKS);
            }
            if (!(0 <= o.warmupFraction && o.warmupFraction < o.failAtFraction
                    && o.failAtFraction < 1)) {
                throw usage("need 0 <= --warmup < --fail-at < 1");
            }
            if (o.failAtRecords < 0) {
                throw usage("--fail-at-records wants a number of records (0: fail at --fail-at), got " + o.failAtRecords);
            }
            return o;
        }

        private static IllegalArgumentException usage(String problem) {
            return new IllegalArgumentException(problem + "\nusage: ChangelogStorageBench"
                    + " --storage NAME --base-dir DIR [--duration S] [--parallelism N]"
                    + " [--keys N] [--value-bytes N] [--checkpoint-interval-ms MS]"
                    + " [--warmup FRACTION] [--fail-at FRACTION | --fail-at-records N] [--materialize-interval DURATION]"
                    + " [--restore-timeout S] [--records-per-second N] [--conf key=value]...");
        }
    }
}
