package io.dstl.flink.it;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.connector.datagen.source.GeneratorFunction;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

import java.io.IOException;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.TreeMap;
import java.util.UUID;

/**
 * A deterministic keyed-state job whose final state can be checked exactly after any number of
 * restores.
 *
 * <p>The source emits the sequence {@code 0 .. keys*recordsPerKey-1}; element {@code i} becomes
 * the event {@code (key = i % keys, seq = i / keys)}, so every key receives the sequence numbers
 * {@code 0 .. recordsPerKey-1} exactly once, interleaved with all other keys. The source is
 * Flink's FLIP-27 {@link DataGeneratorSource}: its splits are number ranges whose current
 * position is part of every checkpoint, so a restore neither drops nor repeats an element, even
 * at another parallelism. A rate limit keeps the job running long enough for many checkpoints.
 *
 * <p>The keyed operator keeps value, list and map state and a timer per key. Every operation it
 * applies is commutative per key (sums, appends compared as multisets, toggles compared by
 * parity), because the relative order of one key's events is not fixed when several source
 * subtasks feed it. Once a key has seen all its events the operator emits its full state; the
 * sink writes it to a file named after the key. A re-emission after a restore (of a result
 * emitted after the last completed checkpoint) finds the file with the same content and leaves
 * it; differing content ({@code conflict-*}), extra events ({@code overflow-*}) or a key that is
 * still incomplete when the input ends ({@code incomplete-*}) leave extra files the test reports.
 *
 * <p>Failure injection goes through marker files so that it works across processes: marker
 * {@code fail-i} is consumed (deleted) by the first subtask that sees it once at least two
 * checkpoints have completed in its current attempt, its attempt number is at least {@code i}
 * and the event's sequence number has passed a threshold. Deleting the file is the atomic claim,
 * so each marker causes exactly one failure, and the failures happen in successive attempts.
 */
public final class ChangelogTestJob {

    /** Prefix of the sink file carrying the final state of a complete key. */
    public static final String RESULT_PREFIX = "result-";

    /** Prefix of the marker files that each inject one failure. */
    public static final String FAILURE_MARKER_PREFIX = "fail-";

    private ChangelogTestJob() {}

    /** Everything that shapes the job's input and behaviour; also parsed from program args. */
    public static final class Params implements Serializable {
        private static final long serialVersionUID = 1L;

        public int keys = 12;
        public int recordsPerKey = 300;
        /** Events per second over all source subtasks. */
        public double eventsPerSecond = 900;
        /** Bytes of each list element (at least 12: key and sequence number come first). */
        public int payloadBytes = 64;
        /** Directory the sink writes one file per emitted result into. */
        public String outputDir;
        /** Directory with failure markers, or null for no failure injection. */
        public String failureDir;
        /** How many failure markers the test created (spreads the failure points). */
        public int failures;
        /** Completed checkpoints an attempt must see before it may fail. */
        public int checkpointsBeforeFailure = 2;
        /** Only used by {@link #main}: the MiniCluster tests configure the environment. */
        public long checkpointIntervalMs = 200;
        public int restartAttempts = 10;
        public long restartDelayMs = 1000;

        public long totalEvents() {
            return (long) keys * recordsPerKey;
        }

        /** The sequence number from which marker {@code index} may fire. */
        long failureThreshold(int index) {
            return (long) recordsPerKey * (index + 1) / (failures + 2);
        }

        public List<String> toArgs() {
            List<String> args = new ArrayList<>();
            add(args, "keys", keys);
            add(args, "records-per-key", recordsPerKey);
            add(args, "events-per-second", eventsPerSecond);
            add(args, "payload-bytes", payloadBytes);
            add(args, "output", outputDir);
            add(args, "failure-dir", failureDir);
            add(args, "failures", failures);
            add(args, "checkpoints-before-failure", checkpointsBeforeFailure);
            add(args, "checkpoint-interval-ms", checkpointIntervalMs);
            add(args, "restart-attempts", restartAttempts);
            add(args, "restart-delay-ms", restartDelayMs);
            return args;
        }

        private static void add(List<String> args, String name, Object value) {
            if (value != null) {
                args.add("--" + name);
                args.add(String.valueOf(value));
            }
        }

        public static Params fromArgs(String[] args) {
            Params p = new Params();
            for (int i = 0; i < args.length; i += 2) {
                if (!args[i].startsWith("--") || i + 1 >= args.length) {
                    throw new IllegalArgumentException("expected --name value pairs: " + Arrays.toString(args));
                }
                String v = args[i + 1];
                switch (args[i].substring(2)) {
                    case "keys": p.keys = Integer.parseInt(v); break;
                    case "records-per-key": p.recordsPerKey = Integer.parseInt(v); break;
                    case "events-per-second": p.eventsPerSecond = Double.parseDouble(v); break;
                    case "payload-bytes": p.payloadBytes = Integer.parseInt(v); break;
                    case "output": p.outputDir = v; break;
                    case "failure-dir": p.failureDir = v; break;
                    case "failures": p.failures = Integer.parseInt(v); break;
                    case "checkpoints-before-failure": p.checkpointsBeforeFailure = Integer.parseInt(v); break;
                    case "checkpoint-interval-ms": p.checkpointIntervalMs = Long.parseLong(v); break;
                    case "restart-attempts": p.restartAttempts = Integer.parseInt(v); break;
                    case "restart-delay-ms": p.restartDelayMs = Long.parseLong(v); break;
                    default: throw new IllegalArgumentException("unknown option " + args[i]);
                }
            }
            if (p.outputDir == null) {
                throw new IllegalArgumentException("--output is required");
            }
            if (p.payloadBytes < 12) {
                throw new IllegalArgumentException("--payload-bytes must be at least 12");
            }
            return p;
        }
    }

    /** One source element. A POJO so that Flink serializes it without Kryo. */
    public static final class Event {
        public int key;
        public long seq;

        public Event() {}

        public Event(int key, long seq) {
            this.key = key;
            this.seq = seq;
        }
    }

    /**
     * One sink record: the file name and its content. Made by {@link StateUpdater#emit}, the
     * only place that writes records.
     */
    public static final class Output {
        public String name;
        public String content;

        public Output() {}
    }

    /** Entry point for submission to a real cluster (CLI or REST): {@code --name value} args. */
    public static void main(String[] args) throws Exception {
        Params p = Params.fromArgs(args);
        Configuration conf = new Configuration();
        conf.set(RestartStrategyOptions.RESTART_STRATEGY, "fixed-delay");
        conf.set(RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_ATTEMPTS, p.restartAttempts);
        conf.set(RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_DELAY, Duration.ofMillis(p.restartDelayMs));
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.enableCheckpointing(p.checkpointIntervalMs);
        build(env, p);
        env.execute("dstl changelog test job");
    }

    /** Adds source, keyed state operator and file sink to {@code env}. */
    public static void build(StreamExecutionEnvironment env, Params p) {
        final int keys = p.keys;
        GeneratorFunction<Long, Event> generator = i -> new Event((int) (i % keys), i / keys);
        DataGeneratorSource<Event> source = new DataGeneratorSource<>(
                generator,
                p.totalEvents(),
                RateLimiterStrategy.perSecond(p.eventsPerSecond),
                TypeInformation.of(Event.class));
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "sequence")
                .uid("sequence")
                .keyBy(e -> e.key, Types.INT)
                .process(new StateUpdater(p))
                .uid("state-updater")
                .name("state-updater")
                .returns(TypeInformation.of(Output.class))
                .sinkTo(new FileResultSink(p.outputDir))
                .uid("file-results")
                .name("file-results");
    }

    /**
     * The list element for {@code (key, seq)}: key and sequence number, then bytes from a
     * generator seeded with both, so any corruption or mix-up on the way through the changelog
     * is detectable.
     */
    public static byte[] payload(int key, long seq, int size) {
        byte[] b = new byte[size];
        ByteBuffer.wrap(b).putInt(key).putLong(seq);
        SplittableRandom random = new SplittableRandom(key * 1_000_003L + seq);
        for (int i = 12; i < size; i++) {
            b[i] = (byte) random.nextInt(256);
        }
        return b;
    }

    /** Bucket of the map state that sums {@code seq + 1}. */
    public static int sumBucket(long seq) {
        return (int) (seq % 7);
    }

    /** Slot of the map state that is toggled (put if absent, removed if present) per event. */
    public static int toggleSlot(int key, long seq) {
        return (int) ((seq * 31 + key) % 13);
    }

    /** The value a toggle slot holds while present. */
    public static int toggleValue(int key, int slot) {
        return slot * slot + key;
    }

    /**
     * The canonical text of one key's state; the test computes the same text from the input
     * alone. {@code seqs} must be sorted; {@code corrupt} counts list elements whose bytes did
     * not match {@link #payload}.
     */
    public static String describe(int key, long count, long sum, List<Long> seqs, long corrupt,
            Map<Integer, Long> buckets, Map<Integer, Integer> toggles) {
        StringBuilder sb = new StringBuilder();
        sb.append("key=").append(key).append('\n');
        sb.append("count=").append(count).append('\n');
        sb.append("sum=").append(sum).append('\n');
        sb.append("list.size=").append(seqs.size()).append('\n');
        sb.append("list.corrupt=").append(corrupt).append('\n');
        sb.append("list.seqs=");
        for (int i = 0; i < seqs.size(); i++) {
            sb.append(i == 0 ? "" : ",").append(seqs.get(i));
        }
        sb.append('\n');
        sb.append("buckets=").append(new TreeMap<>(buckets)).append('\n');
        sb.append("toggles=").append(new TreeMap<>(toggles)).append('\n');
        return sb.toString();
    }

    /** Updates value, list and map state per event and emits the state of complete keys. */
    public static final class StateUpdater extends KeyedProcessFunction<Integer, Event, Output>
            implements CheckpointListener {
        private static final long serialVersionUID = 1L;
        /** Rewrite the whole list every this many appends, so updates are logged, not just adds. */
        private static final int COMPACT_EVERY = 64;

        private final Params p;
        private transient ValueState<Long> count;
        private transient ValueState<Long> sum;
        private transient ListState<byte[]> elements;
        private transient MapState<Integer, Long> buckets;
        private transient MapState<Integer, Integer> toggles;
        private transient int checkpointsCompleted;
        private transient boolean markersLeft;

        StateUpdater(Params p) {
            this.p = p;
        }

        @Override
        public void open(OpenContext openContext) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
            sum = getRuntimeContext().getState(new ValueStateDescriptor<>("sum", Types.LONG));
            elements = getRuntimeContext().getListState(
                    new ListStateDescriptor<>("elements", PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO));
            buckets = getRuntimeContext().getMapState(
                    new MapStateDescriptor<>("buckets", Types.INT, Types.LONG));
            toggles = getRuntimeContext().getMapState(
                    new MapStateDescriptor<>("toggles", Types.INT, Types.INT));
            markersLeft = p.failureDir != null && p.failures > 0;
        }

        @Override
        public void processElement(Event e, Context ctx, Collector<Output> out) throws Exception {
            long c = orZero(count.value());
            if (c == 0) {
                // Fires when the final watermark arrives at the end of the input; reports keys
                // that never completed. Being timer state, it also goes through the changelog.
                ctx.timerService().registerEventTimeTimer(Long.MAX_VALUE);
            }
            c++;
            count.update(c);
            sum.update(orZero(sum.value()) + e.seq);
            elements.add(payload(e.key, e.seq, p.payloadBytes));
            if (c % COMPACT_EVERY == 0) {
                List<byte[]> all = new ArrayList<>();
                elements.get().forEach(all::add);
                all.sort(Comparator.comparingLong(b -> ByteBuffer.wrap(b).getLong(4)));
                elements.update(all);
            }
            int bucket = sumBucket(e.seq);
            Long old = buckets.get(bucket);
            buckets.put(bucket, (old == null ? 0 : old) + e.seq + 1);
            int slot = toggleSlot(e.key, e.seq);
            if (toggles.contains(slot)) {
                toggles.remove(slot);
            } else {
                toggles.put(slot, toggleValue(e.key, slot));
            }

            if (c == p.recordsPerKey) {
                emit(out, RESULT_PREFIX + e.key, e.key);
            } else if (c > p.recordsPerKey) {
                emit(out, "overflow-" + e.key + "-" + c, e.key);
            }
            maybeFail(e);
        }

        @Override
        public void onTimer(long timestamp, OnTimerContext ctx, Collector<Output> out) throws Exception {
            long c = orZero(count.value());
            if (c != p.recordsPerKey) {
                emit(out, "incomplete-" + ctx.getCurrentKey(), ctx.getCurrentKey());
            }
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            checkpointsCompleted++;
        }

        private void maybeFail(Event e) throws IOException {
            if (!markersLeft || checkpointsCompleted < p.checkpointsBeforeFailure) {
                return;
            }
            int attempt = getRuntimeContext().getTaskInfo().getAttemptNumber();
            for (int i = 0; i < p.failures; i++) {
                Path marker = Paths.get(p.failureDir, FAILURE_MARKER_PREFIX + i);
                if (!Files.exists(marker)) {
                    continue;
                }
                // Only the lowest remaining marker may fire, and only from attempt i on, so
                // that every restore is followed by at least one checkpoint before the next
                // failure.
                if (i > attempt || e.seq < p.failureThreshold(i)) {
                    return;
                }
                try {
                    Files.delete(marker);
                } catch (NoSuchFileException raced) {
                    return; // another subtask claimed it
                }
                throw new InjectedFailure("injected failure " + i + " at key " + e.key + " seq " + e.seq
                        + " in attempt " + attempt + " of subtask "
                        + getRuntimeContext().getTaskInfo().getIndexOfThisSubtask()
                        + " after " + checkpointsCompleted + " completed checkpoints");
            }
            markersLeft = false;
        }

        /** Emits the full state of {@code key}, the current key, as the file {@code name}. */
        private void emit(Collector<Output> out, String name, int key) throws Exception {
            Output o = new Output();
            o.name = name;
            o.content = describeCurrent(key);
            out.collect(o);
        }

        private String describeCurrent(int key) throws Exception {
            List<Long> seqs = new ArrayList<>();
            long corrupt = 0;
            Iterable<byte[]> all = elements.get();
            if (all != null) {
                for (byte[] b : all) {
                    ByteBuffer buf = ByteBuffer.wrap(b);
                    int k = b.length >= 12 ? buf.getInt(0) : -1;
                    long seq = b.length >= 12 ? buf.getLong(4) : -1;
                    seqs.add(seq);
                    if (k != key || !Arrays.equals(b, payload(key, seq, p.payloadBytes))) {
                        corrupt++;
                    }
                }
            }
            seqs.sort(null);
            Map<Integer, Long> b = new TreeMap<>();
            for (Map.Entry<Integer, Long> en : buckets.entries()) {
                b.put(en.getKey(), en.getValue());
            }
            Map<Integer, Integer> t = new TreeMap<>();
            for (Map.Entry<Integer, Integer> en : toggles.entries()) {
                t.put(en.getKey(), en.getValue());
            }
            return describe(key, orZero(count.value()), orZero(sum.value()), seqs, corrupt, b, t);
        }

        private static long orZero(Long v) {
            return v == null ? 0 : v;
        }
    }

    /** The exception the test injects; its own type makes it easy to tell from real failures. */
    public static final class InjectedFailure extends RuntimeException {
        private static final long serialVersionUID = 1L;

        InjectedFailure(String message) {
            super(message);
        }
    }

    /**
     * Writes each record to {@code dir/name}, atomically (temporary file and rename) so that a
     * reader never sees a partial file, and idempotently so that a re-emission after a restore is
     * harmless. Content that differs from an existing file is kept next to it as a
     * {@code conflict-*} file rather than overwriting it, so the test sees the inconsistency.
     */
    public static final class FileResultSink implements Sink<Output> {
        private static final long serialVersionUID = 1L;
        private final String dir;

        FileResultSink(String dir) {
            this.dir = dir;
        }

        @Override
        public SinkWriter<Output> createWriter(WriterInitContext context) throws IOException {
            Path base = Paths.get(dir);
            Files.createDirectories(base);
            return new SinkWriter<Output>() {
                @Override
                public void write(Output o, Context c) throws IOException {
                    Path target = base.resolve(o.name);
                    String name = o.name;
                    if (Files.exists(target)) {
                        String existing = Files.readString(target, StandardCharsets.UTF_8);
                        if (existing.equals(o.content)) {
                            return;
                        }
                        name = "conflict-" + o.name + "-" + UUID.randomUUID();
                    }
                    Path tmp = base.resolve(".tmp-" + UUID.randomUUID());
                    Files.writeString(tmp, o.content, StandardCharsets.UTF_8);
                    try {
                        Files.move(tmp, base.resolve(name), StandardCopyOption.ATOMIC_MOVE,
                                StandardCopyOption.REPLACE_EXISTING);
                    } catch (AtomicMoveNotSupportedException e) {
                        Files.move(tmp, base.resolve(name), StandardCopyOption.REPLACE_EXISTING);
                    }
                }

                @Override
                public void flush(boolean endOfInput) {}

                @Override
                public void close() {}
            };
        }
    }
}
