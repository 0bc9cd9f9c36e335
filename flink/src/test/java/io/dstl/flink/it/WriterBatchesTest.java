package io.dstl.flink.it;

import io.dstl.flink.CloseScenarios;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandleStreamImpl;
import org.apache.flink.runtime.state.changelog.SequenceNumber;
import org.apache.flink.runtime.state.changelog.StateChange;
import org.apache.flink.runtime.state.changelog.StateChangelogStorage;
import org.apache.flink.runtime.state.changelog.StateChangelogWriter;
import org.apache.flink.util.CloseableIterator;
import org.junit.jupiter.api.Timeout;

/**
 * The plugin's writer as a task uses it, without a job: the changes whose values it keeps and
 * writes straight into the sandbox, where the native side framed their batch, reach the file in
 * each key group's append order, metadata, empty and large values included, as Flink's own
 * reader reads them; a key group outside the writer's range is refused by name and the writer
 * carries on.
 */
@Timeout(120)
class WriterBatchesTest extends JobTest {

    @DstlOnly
    @SuppressWarnings("unchecked")
    void changesFramedByTheWriterReadBackInEachKeyGroupsOrder() throws Exception {
        StateChangelogStorage<ChangelogStateHandleStreamImpl> storage =
                (StateChangelogStorage<ChangelogStateHandleStreamImpl>) CloseScenarios.storage(Map.of(
                        "state.changelog.dstl.dfs.base-path", dir.resolve("changelog").toString(),
                        // Pre-emptive uploads along the way: batches end at the threshold.
                        "state.changelog.dstl.dfs.preemptive-persist-threshold", "64kb"));
        try {
            KeyGroupRange range = new KeyGroupRange(16, 47);
            StateChangelogWriter<ChangelogStateHandleStreamImpl> writer =
                    storage.createWriter("op", range, new CloseScenarios.DirectMailbox());
            Map<Integer, List<byte[]>> expected = new TreeMap<>();
            SequenceNumber from = writer.initialSequenceNumber();
            for (int i = 0; i < 20_000; i++) {
                int keyGroup = 16 + (i * 7) % 32;
                byte[] value;
                if (i % 1000 == 999) {
                    // As large as a batch: it goes in a batch of its own.
                    value = new byte[300 << 10];
                    Arrays.fill(value, (byte) i);
                } else if (i % 97 == 0) {
                    value = new byte[0];
                } else {
                    value = ("change " + i).getBytes(StandardCharsets.UTF_8);
                }
                if (i % 501 == 0) {
                    writer.appendMeta(value);
                    keyGroup = StateChange.META_KEY_GROUP;
                } else {
                    writer.append(keyGroup, value);
                }
                expected.computeIfAbsent(keyGroup, k -> new ArrayList<>()).add(value);
                if (i == 5_000) {
                    try {
                        writer.append(range.getEndKeyGroup() + 1, new byte[] {1});
                        throw new AssertionError("a key group outside the writer's range was taken");
                    } catch (Exception e) {
                        if (!String.valueOf(e.getMessage()).contains(Integer.toString(range.getEndKeyGroup() + 1))) {
                            throw new AssertionError("the error names the key group: " + e, e);
                        }
                    }
                }
                if (i % 7_000 == 0) {
                    writer.nextSequenceNumber();
                }
            }
            ChangelogStateHandleStreamImpl handle =
                    writer.persist(from, 1).get(60, TimeUnit.SECONDS).getJobManagerOwnedSnapshot();
            Map<Integer, List<byte[]>> read = new TreeMap<>();
            CloseableIterator<StateChange> changes = storage.createReader().getChanges(handle);
            try {
                while (changes.hasNext()) {
                    StateChange change = changes.next();
                    read.computeIfAbsent(change.getKeyGroup(), k -> new ArrayList<>()).add(change.getChange());
                }
            } finally {
                changes.close();
            }
            if (!read.keySet().equals(expected.keySet())) {
                throw new AssertionError("key groups read " + read.keySet() + ", appended " + expected.keySet());
            }
            for (Map.Entry<Integer, List<byte[]>> group : expected.entrySet()) {
                List<byte[]> got = read.get(group.getKey());
                List<byte[]> want = group.getValue();
                if (got.size() != want.size()) {
                    throw new AssertionError("key group " + group.getKey() + ": " + got.size()
                            + " changes read, " + want.size() + " appended");
                }
                for (int j = 0; j < want.size(); j++) {
                    if (!Arrays.equals(got.get(j), want.get(j))) {
                        throw new AssertionError("key group " + group.getKey() + ", change " + j
                                + ": the bytes read differ from those appended (" + got.get(j).length
                                + " read, " + want.get(j).length + " appended)");
                    }
                }
            }
            writer.close();
        } finally {
            storage.close();
        }
    }
}
