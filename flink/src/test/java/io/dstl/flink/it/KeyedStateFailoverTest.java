package io.dstl.flink.it;

import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

import java.nio.file.Path;
import java.util.Map;

/**
 * (a) Value, list, map and timer state survive two injected task failures exactly, with heap
 * and RocksDB state. Periodic materialization runs every second, so the restores combine a
 * materialized snapshot with the changelog written after it, and the storage sees truncations.
 */
@Timeout(180)
class KeyedStateFailoverTest extends JobTest {

    @ParameterizedTest(name = "storage={0} backend={1}")
    @MethodSource("io.dstl.flink.it.TestSettings#storagesAndBackends")
    void exactStateAfterTwoInjectedFailures(String storage, String backend) throws Exception {
        ChangelogTestJob.Params p = Scenarios.params(dir);
        Scenarios.armFailures(p, dir, 2);
        Map<String, String> cluster = TestSettings.changelog(storage, backend,
                dir.resolve("changelog"), dir.resolve("checkpoints"));
        cluster.put("state.changelog.periodic-materialize.enabled", "true");
        cluster.put("state.changelog.periodic-materialize.interval", "1s");
        Scenarios.runToCompletion("(a) failover " + storage + "/" + backend, cluster, TestSettings.job(2), p, 4);
    }
}
