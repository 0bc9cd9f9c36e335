package io.dstl.flink.it;

import org.junit.jupiter.api.Timeout;

import java.nio.file.Path;

/**
 * (b) A retained checkpoint taken at parallelism 2 restores at parallelism 3: every key group
 * moves to a new owner, so the changelog of each old subtask is read back split by key group.
 */
@Timeout(180)
class RescaleTest extends JobTest {

    @EachStorage
    void restoresRetainedCheckpointAtHigherParallelism(String storage) throws Exception {
        StopAndRestore.run("(b) rescale 2->3 " + storage, dir, storage, 2, storage, 3, 0);
    }
}
