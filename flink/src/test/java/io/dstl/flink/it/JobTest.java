package io.dstl.flink.it;

import java.io.IOException;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;
import java.nio.file.Path;
import java.util.Map;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.condition.EnabledIf;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/** What every test of a Flink job shares: a directory of its own, and the storages it runs on. */
abstract class JobTest {

    /** A fresh directory for each test, removed after it. */
    @TempDir
    Path dir;

    /**
     * The cluster configuration of a job on {@code storage} with the hashmap backend, its
     * changelog and checkpoints under {@link #dir}.
     */
    Map<String, String> changelog(String storage) {
        return TestSettings.changelog(storage, "hashmap", dir.resolve("changelog"), dir.resolve("checkpoints"));
    }

    /**
     * The job's input as {@link Scenarios#params} sizes it, its output under {@link #dir}, but
     * {@code recordsPerKey} events per key: how long a test's job runs is what tests tune most.
     */
    ChangelogTestJob.Params params(int recordsPerKey) throws IOException {
        ChangelogTestJob.Params p = Scenarios.params(dir);
        p.recordsPerKey = recordsPerKey;
        return p;
    }

    /** {@link #params(int)}, and {@code eventsPerSecond} over all source subtasks. */
    ChangelogTestJob.Params params(int recordsPerKey, double eventsPerSecond) throws IOException {
        ChangelogTestJob.Params p = params(recordsPerKey);
        p.eventsPerSecond = eventsPerSecond;
        return p;
    }

    /**
     * {@link #params(int, double)} with {@code keys} keys and list elements of
     * {@code payloadBytes}: for tests that load the changelog beyond the usual small state.
     */
    ChangelogTestJob.Params params(int keys, int recordsPerKey, double eventsPerSecond, int payloadBytes)
            throws IOException {
        ChangelogTestJob.Params p = params(recordsPerKey, eventsPerSecond);
        p.keys = keys;
        p.payloadBytes = payloadBytes;
        return p;
    }

    /** A test run once for each storage of {@code DSTL_FLINK_TEST_STORAGES}, named by it. */
    @Target(ElementType.METHOD)
    @Retention(RetentionPolicy.RUNTIME)
    @ParameterizedTest(name = "storage={0}")
    @MethodSource("io.dstl.flink.it.TestSettings#storageNames")
    @interface EachStorage {}

    /** A test of dstl alone, skipped when {@code DSTL_FLINK_TEST_STORAGES} leaves dstl out. */
    @Target(ElementType.METHOD)
    @Retention(RetentionPolicy.RUNTIME)
    @Test
    @EnabledIf("io.dstl.flink.it.TestSettings#dstlEnabled")
    @interface DstlOnly {}
}
