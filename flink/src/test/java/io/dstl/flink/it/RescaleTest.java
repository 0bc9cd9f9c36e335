package io.dstl.flink.it;

import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

import java.nio.file.Path;

/**
 * (b) A retained checkpoint taken at parallelism 2 restores at parallelism 3: every key group
 * moves to a new owner, so the changelog of each old subtask is read back split by key group.
 */
@Timeout(180)
class RescaleTest {

    @TempDir
    Path dir;

    @ParameterizedTest(name = "storage={0}")
    @MethodSource("io.dstl.flink.it.TestSettings#storageNames")
    void restoresRetainedCheckpointAtHigherParallelism(String storage) throws Exception {
        StopAndRestore.run("(b) rescale 2->3 " + storage, dir, storage, 2, storage, 3, 0);
    }
}
