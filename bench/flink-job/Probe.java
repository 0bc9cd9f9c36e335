package io.dstl.flink.bench;

import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.concurrent.atomic.LongAdder;

/**
 * Measurement points shared between the stateful operator and the driver.
 *
 * <p>The whole MiniCluster runs in the driver's JVM and the job ships no jars, so the user code
 * class loader delegates to the application class loader and every operator instance, including
 * the ones re-created after the injected failure, sees these very fields. That lets the driver
 * read counters without going through Flink's metric system (whose reporting interval would blur
 * the boundaries of the measurement windows) and lets the operator timestamp the restore with the
 * same clock as the failure.
 */
final class Probe {
    private Probe() {}

    /** Upper bound for the parallelism; the per-subtask arrays are sized by it. */
    static final int MAX_SUBTASKS = 64;

    /** Records processed by the stateful operator, summed over subtasks and restarts. */
    static final LongAdder PROCESSED = new LongAdder();

    /** Set by the driver when the failure is due; the first subtask to see it throws. */
    static volatile boolean failRequested;

    /** Guards the single injected failure against the other subtask and against restarts. */
    static final AtomicBoolean FAILED = new AtomicBoolean();

    /** System.nanoTime() just before the injected exception is thrown. */
    static volatile long failedAtNanos;

    /** Per subtask: nanoTime of open() of the instance created after the failure, 0 until then. */
    static final AtomicLongArray OPENED_AFTER_FAILURE = new AtomicLongArray(MAX_SUBTASKS);

    /** Per subtask: nanoTime of the first record processed after the failure, 0 until then. */
    static final AtomicLongArray FIRST_RECORD_AFTER_FAILURE = new AtomicLongArray(MAX_SUBTASKS);

    /**
     * Of the first {@link #hitWindow} records processed after the restore, how many found state
     * for their key. Every key has been written long before the failure, so a restored backend
     * gives a ratio of 1.0; a backend that came back empty gives far less, which would make the
     * restore time meaningless.
     */
    static final LongAdder RESTORED_SEEN = new LongAdder();

    static final LongAdder RESTORED_HITS = new LongAdder();

    static volatile long hitWindow = 50_000;

    static long maxOf(AtomicLongArray a, int n) {
        long max = 0;
        for (int i = 0; i < n; i++) {
            long v = a.get(i);
            if (v == 0) {
                return 0; // some subtask is not there yet
            }
            max = Math.max(max, v);
        }
        return max;
    }
}
