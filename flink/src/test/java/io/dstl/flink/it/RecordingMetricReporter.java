package io.dstl.flink.it;

import org.apache.flink.metrics.Metric;
import org.apache.flink.metrics.MetricConfig;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.metrics.reporter.MetricReporter;
import org.apache.flink.metrics.reporter.MetricReporterFactory;

import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.stream.Collectors;

/**
 * A metric reporter that remembers every metric Flink adds, by the name it was registered
 * under, in static state: a MiniCluster runs in the test JVM, so the test reads the very
 * objects the storages registered and can poll their values while the job runs. Enabled with
 * {@code metrics.reporter.<name>.factory.class: io.dstl.flink.it.RecordingMetricReporter$Factory}
 * (Flink finds the factory through {@code META-INF/services}).
 */
public final class RecordingMetricReporter implements MetricReporter {

    /** A registration: the metric and its full identifier (the group's scope and the name). */
    record Added(Metric metric, String identifier) {}

    private static final Map<String, List<Added>> ADDED = new ConcurrentHashMap<>();

    /** Forgets everything recorded so far: call before starting the cluster under test. */
    static void reset() {
        ADDED.clear();
    }

    /**
     * numRecordsIn of the stateful operator ({@code state-updater} in the test job), over its
     * subtasks. Its operator scope is {@code ...<job>.state-updater.<subtask>}; the scope of its
     * task, whose name starts the same way ({@code state-updater -> file-results: Writer}), does
     * not match.
     */
    static long recordsIntoStateUpdater() {
        long total = 0;
        for (Added a : added("numRecordsIn")) {
            if (a.identifier().contains(".state-updater.") && a.metric() instanceof org.apache.flink.metrics.Counter) {
                total += ((org.apache.flink.metrics.Counter) a.metric()).getCount();
            }
        }
        return total;
    }

    /** Every registration under {@code name}, in order (one per group that registered it). */
    static List<Added> added(String name) {
        return ADDED.getOrDefault(name, List.of());
    }

    /** The names registered so far that start with {@code prefix}, sorted. */
    static TreeSet<String> names(String prefix) {
        return ADDED.keySet().stream().filter(n -> n.startsWith(prefix))
                .collect(Collectors.toCollection(TreeSet::new));
    }

    @Override
    public void open(MetricConfig config) {}

    @Override
    public void close() {}

    @Override
    public void notifyOfAddedMetric(Metric metric, String metricName, MetricGroup group) {
        ADDED.computeIfAbsent(metricName, n -> new CopyOnWriteArrayList<>())
                .add(new Added(metric, group.getMetricIdentifier(metricName)));
    }

    @Override
    public void notifyOfRemovedMetric(Metric metric, String metricName, MetricGroup group) {
        // Kept: the test asks what was ever registered, and reads the last values after removal.
    }

    /** What {@code factory.class} names. */
    public static final class Factory implements MetricReporterFactory {
        @Override
        public MetricReporter createMetricReporter(Properties properties) {
            return new RecordingMetricReporter();
        }
    }
}
