package io.dstl.flink;

import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.Gauge;
import org.apache.flink.metrics.Histogram;
import org.apache.flink.metrics.HistogramStatistics;
import org.apache.flink.metrics.MetricGroup;

/**
 * dstl's upload metrics in the job's metric group, under the names Flink's own storage uses
 * ({@code ChangelogStorage.*}), so dashboards built for Flink's changelog show dstl's.
 *
 * <p>Values are read from the native storage at most every 100 ms, whatever the number of
 * reporters. Histograms report the native side's window: count, min, max, mean and the 50th
 * and 99th percentiles (a quantile in between reports the nearer of those two; above 0.99,
 * the maximum).
 */
final class DstlMetrics {
    private static final String PREFIX = "ChangelogStorage.";

    // Indexes into Native.metrics().
    private static final int UPLOAD_REQUESTS = 0;
    private static final int UPLOAD_FAILURES = 1;
    private static final int QUEUE_SIZE = 2;
    private static final int IN_FLIGHT = 3;
    private static final int HISTOGRAMS = 6;
    private static final int HISTOGRAM_FIELDS = 6;

    private final NativeStorage storage;
    private long[] values = new long[HISTOGRAMS + 5 * HISTOGRAM_FIELDS];
    private long readAt;
    private boolean closed;

    private DstlMetrics(NativeStorage storage) {
        this.storage = storage;
    }

    static DstlMetrics register(MetricGroup group, NativeStorage storage) {
        DstlMetrics m = new DstlMetrics(storage);
        if (group == null) {
            return m;
        }
        group.counter(PREFIX + "numberOfUploadRequests", m.new ReadOnlyCounter(UPLOAD_REQUESTS));
        group.counter(PREFIX + "numberOfUploadFailures", m.new ReadOnlyCounter(UPLOAD_FAILURES));
        group.histogram(PREFIX + "uploadSizes", m.new NativeHistogram(0));
        group.histogram(PREFIX + "uploadLatenciesNanos", m.new NativeHistogram(1));
        group.histogram(PREFIX + "attemptsPerUpload", m.new NativeHistogram(2));
        group.histogram(PREFIX + "totalAttemptsPerUpload", m.new NativeHistogram(3));
        group.histogram(PREFIX + "uploadBatchSizes", m.new NativeHistogram(4));
        group.gauge(PREFIX + "uploadQueueSize", (Gauge<Integer>) () -> (int) m.read(QUEUE_SIZE));
        group.gauge(PREFIX + "inFlightBytes", (Gauge<Long>) () -> m.read(IN_FLIGHT));
        return m;
    }

    /** Before the native storage is freed: later reads report the last values. */
    synchronized void close() {
        closed = true;
    }

    private synchronized long read(int index) {
        long now = System.nanoTime();
        if (!closed && (now - readAt > 100_000_000L || readAt == 0)) {
            long[] fresh = storage.metrics();
            if (fresh != null) {
                values = fresh;
            }
            readAt = now;
        }
        return index < values.length ? values[index] : 0;
    }

    /** A counter the native side counts; Flink's reporters only read it. */
    private final class ReadOnlyCounter implements Counter {
        private final int index;

        ReadOnlyCounter(int index) {
            this.index = index;
        }

        @Override
        public void inc() {}

        @Override
        public void inc(long n) {}

        @Override
        public void dec() {}

        @Override
        public void dec(long n) {}

        @Override
        public long getCount() {
            return read(index);
        }
    }

    private final class NativeHistogram implements Histogram {
        private final int base;

        NativeHistogram(int histogram) {
            this.base = HISTOGRAMS + histogram * HISTOGRAM_FIELDS;
        }

        @Override
        public void update(long value) {}

        @Override
        public long getCount() {
            return read(base);
        }

        @Override
        public HistogramStatistics getStatistics() {
            long count = read(base);
            long min = read(base + 1);
            long max = read(base + 2);
            long mean = read(base + 3);
            long p50 = read(base + 4);
            long p99 = read(base + 5);
            return new HistogramStatistics() {
                @Override
                public double getQuantile(double q) {
                    if (q > 0.99) {
                        return max;
                    }
                    return q <= 0.745 ? p50 : p99;
                }

                @Override
                public long[] getValues() {
                    return new long[] {min, p50, p99, max};
                }

                @Override
                public int size() {
                    return (int) Math.min(count, Integer.MAX_VALUE);
                }

                @Override
                public double getMean() {
                    return mean;
                }

                @Override
                public double getStdDev() {
                    return 0;
                }

                @Override
                public long getMax() {
                    return max;
                }

                @Override
                public long getMin() {
                    return min;
                }
            };
        }
    }
}
