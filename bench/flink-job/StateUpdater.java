package io.dstl.flink.bench;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

/**
 * Reads and rewrites one ValueState per record, so with the changelog backend every record
 * appends exactly one change (key, key group, about {@code valueBytes} of value) to the state
 * changelog: the write path of the changelog storage is exercised at the job's full rate.
 *
 * <p>The stored value is the incoming payload with its first 8 bytes replaced by the number of
 * updates the key has seen, so each update depends on the previous one (the read cannot be
 * elided) and the value size stays that of the records.
 *
 * <p>Also hosts the failure injection and the restore timestamps, see {@link Probe}.
 */
final class StateUpdater extends KeyedProcessFunction<Long, Tuple2<Long, byte[]>, Long> {
    private static final long serialVersionUID = 1L;

    private transient ValueState<byte[]> last;
    private transient int subtask;
    /** True for the instance created by the restart that follows the injected failure. */
    private transient boolean afterFailure;
    private transient boolean firstRecordSeen;
    private transient boolean hitWindowDone;

    @Override
    public void open(OpenContext openContext) {
        last = getRuntimeContext()
                .getState(new ValueStateDescriptor<>("last", PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO));
        subtask = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
        // open() runs after the keyed state backend has been restored (initializeState comes
        // first), so this timestamp marks "state is back" for this subtask.
        afterFailure = Probe.FAILED.get();
        if (afterFailure) {
            Probe.OPENED_AFTER_FAILURE.compareAndSet(subtask, 0, System.nanoTime());
        }
    }

    @Override
    public void processElement(Tuple2<Long, byte[]> record, Context ctx, Collector<Long> out)
            throws Exception {
        if (Probe.failRequested && Probe.FAILED.compareAndSet(false, true)) {
            Probe.failedAtNanos = System.nanoTime();
            throw new InjectedFailure();
        }
        if (afterFailure && !firstRecordSeen) {
            firstRecordSeen = true;
            Probe.FIRST_RECORD_AFTER_FAILURE.compareAndSet(subtask, 0, System.nanoTime());
        }
        byte[] previous = last.value();
        long count = previous == null ? 1 : getLong(previous) + 1;
        if (afterFailure && !hitWindowDone) {
            // sum() walks the adder's cells: stop calling it once the window is full.
            if (Probe.RESTORED_SEEN.sum() < Probe.hitWindow) {
                Probe.RESTORED_SEEN.increment();
                if (previous != null) {
                    Probe.RESTORED_HITS.increment();
                }
            } else {
                hitWindowDone = true;
            }
        }
        byte[] value = record.f1;
        putLong(value, count);
        last.update(value);
        Probe.PROCESSED.increment();
        out.collect(count);
    }

    private static long getLong(byte[] b) {
        long v = 0;
        for (int i = 0; i < 8 && i < b.length; i++) {
            v |= (b[i] & 0xffL) << (8 * i);
        }
        return v;
    }

    private static void putLong(byte[] b, long v) {
        for (int i = 0; i < 8 && i < b.length; i++) {
            b[i] = (byte) (v >>> (8 * i));
        }
    }

    /** The one failure the benchmark injects; its own type so it is easy to spot in the log. */
    static final class InjectedFailure extends RuntimeException {
        private static final long serialVersionUID = 1L;

        InjectedFailure() {
            super("failure injected by the changelog storage benchmark to measure the restore");
        }
    }
}
