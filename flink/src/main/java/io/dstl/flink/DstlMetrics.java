package io.dstl.flink;

import java.nio.charset.StandardCharsets;

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
    /** Longs a histogram takes in {@code Native.metrics()}: count, min, max, mean, p50, p99. */
    private static final int HISTOGRAM_FIELDS = 6;

    private final NativeStorage storage;
    private long[] values = new long[0];
    private long readAt;
    private boolean closed;

    private DstlMetrics(NativeStorage storage) {
        this.storage = storage;
    }

    /**
     * Registers every metric the native side lists ({@code Native.metricNames()}: kind and name,
     * in the order of {@code Native.metrics()}'s values), so this class holds no name or index.
     */
    static DstlMetrics register(MetricGroup group, NativeStorage storage) {
        DstlMetrics m = new DstlMetrics(storage);
        if (group == null) {
            return m;
        }
        int index = 0;
        for (String line : new String(Native.metricNames(), StandardCharsets.UTF_8).split("\n")) {
            String[] kindAndName = line.split(" ", 2);
            String name = PREFIX + kindAndName[1];
            int at = index;
            index += switch (kindAndName[0]) {
                case "counter" -> {
                    group.counter(name, m.new ReadOnlyCounter(at));
                    yield 1;
                }
                case "gauge" -> {
                    group.gauge(name, (Gauge<Long>) () -> m.read(at));
                    yield 1;
                }
                case "histogram" -> {
                    group.histogram(name, m.new NativeHistogram(at));
                    yield HISTOGRAM_FIELDS;
                }
                default -> throw new IllegalStateException(
                        "dstl: the native side lists a metric of unknown kind: " + line);
            };
        }
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

        NativeHistogram(int base) {
            this.base = base;
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
