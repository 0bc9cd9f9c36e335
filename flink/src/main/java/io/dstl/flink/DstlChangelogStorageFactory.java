package io.dstl.flink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.changelog.fs.FsStateChangelogStorageFactory;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.metrics.groups.TaskManagerJobMetricGroup;
import org.apache.flink.runtime.state.LocalRecoveryConfig;
import org.apache.flink.runtime.state.changelog.StateChangelogStorage;
import org.apache.flink.runtime.state.changelog.StateChangelogStorageFactory;
import org.apache.flink.runtime.state.changelog.StateChangelogStorageView;

/**
 * Flink's entry point into dstl: {@code state.changelog.storage: dstl}. Found through {@code
 * META-INF/services} on the classpath or in a TaskManager's {@code plugins/dstl/}.
 *
 * <p>Restores go through Flink's own reader: dstl writes Flink's file format and its handles
 * carry the identifier {@code filesystem}, so a job checkpointed with dstl restores with or
 * without this plugin, and a job checkpointed with Flink's storage restores under dstl (Flink
 * picks one reader per job, from the first handle's identifier).
 */
public final class DstlChangelogStorageFactory implements StateChangelogStorageFactory {
    /** The value of {@code state.changelog.storage} that selects dstl. */
    public static final String IDENTIFIER = "dstl";

    @Override
    public String getIdentifier() {
        return IDENTIFIER;
    }

    /**
     * Called for every task of every job on a TaskManager, changelog on or off: returns at
     * once, and the storage starts its engine and threads at its first writer.
     */
    @Override
    public StateChangelogStorage<?> createStorage(
            JobID jobID,
            Configuration configuration,
            TaskManagerJobMetricGroup metricGroup,
            LocalRecoveryConfig localRecoveryConfig) {
        return new DstlChangelogStorage(jobID, configuration, metricGroup, localRecoveryConfig);
    }

    /** Flink's own view: it reads dstl's files and Flink's alike. */
    @Override
    public StateChangelogStorageView<?> createStorageView(Configuration configuration)
            throws java.io.IOException {
        return new FsStateChangelogStorageFactory().createStorageView(configuration);
    }
}
