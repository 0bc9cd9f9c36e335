package io.dstl.flink.it;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

import java.nio.file.Path;

/**
 * (c) A job moves between Flink's filesystem changelog and dstl: a checkpoint written by one
 * storage is restored by a cluster configured with the other, which then writes the new
 * changes. Flink reads a restored changelog with the reader of the storage named in the
 * handles (one reader per job and TaskManager, chosen by the first handle), not with the
 * configured storage, so both directions depend on the files and handles being compatible.
 * One failure after the switch makes the next restore read a checkpoint that holds changelog
 * written by both storages.
 */
@Timeout(180)
class StorageMigrationTest extends JobTest {

    @ParameterizedTest(name = "{0} -> {1}")
    @CsvSource({"filesystem, dstl", "dstl, filesystem"})
    void restoresCheckpointOfTheOtherStorage(String from, String to) throws Exception {
        Assumptions.assumeTrue(TestSettings.enabled(from) && TestSettings.enabled(to),
                "needs both storages in DSTL_FLINK_TEST_STORAGES");
        StopAndRestore.run("(c) migrate " + from + "->" + to, dir, from, 2, to, 2, 1);
    }
}
