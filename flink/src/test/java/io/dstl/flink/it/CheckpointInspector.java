package io.dstl.flink.it;

import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.runtime.checkpoint.Checkpoints;
import org.apache.flink.runtime.checkpoint.OperatorState;
import org.apache.flink.runtime.checkpoint.OperatorSubtaskState;
import org.apache.flink.runtime.checkpoint.metadata.CheckpointMetadata;
import org.apache.flink.runtime.state.KeyedStateHandle;
import org.apache.flink.runtime.state.StreamStateHandle;
import org.apache.flink.runtime.state.changelog.ChangelogStateBackendHandle;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandle;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandleStreamImpl;

import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Map;
import java.util.TreeMap;

/**
 * Reads a retained checkpoint's {@code _metadata} and summarizes the changelog handles in it:
 * which storage identifiers and handle types the keyed state refers to. This proves that the
 * checkpoint really carries changelog state (and not just materialized state), and shows which
 * storage wrote it.
 */
final class CheckpointInspector {

    /** Changelog handles per {@code storageIdentifier / handle class / stream handle class}. */
    final Map<String, Integer> changelogHandles = new TreeMap<>();
    int keyedHandles;
    int nonChangelogKeyedHandles;
    int materializedHandles;
    long changelogBytes;

    static CheckpointInspector read(String externalPath) throws IOException {
        Path dir = externalPath.startsWith("file:") ? Paths.get(URI.create(externalPath)) : Paths.get(externalPath);
        Path metadata = Files.isDirectory(dir) ? dir.resolve("_metadata") : dir;
        CheckpointInspector s = new CheckpointInspector();
        try (InputStream in = Files.newInputStream(metadata)) {
            CheckpointMetadata m = Checkpoints.loadCheckpointMetadata(
                    new DataInputStream(in), CheckpointInspector.class.getClassLoader(), externalPath);
            for (OperatorState op : m.getOperatorStates()) {
                for (OperatorSubtaskState sub : op.getStates()) {
                    for (KeyedStateHandle h : sub.getManagedKeyedState()) {
                        s.add(h);
                    }
                }
            }
        }
        return s;
    }

    private void add(KeyedStateHandle h) {
        keyedHandles++;
        if (!(h instanceof ChangelogStateBackendHandle)) {
            nonChangelogKeyedHandles++;
            return;
        }
        ChangelogStateBackendHandle c = (ChangelogStateBackendHandle) h;
        materializedHandles += c.getMaterializedStateHandles().size();
        for (ChangelogStateHandle ch : c.getNonMaterializedStateHandles()) {
            changelogBytes += ch.getStateSize();
            StringBuilder key = new StringBuilder(ch.getStorageIdentifier()).append(" / ")
                    .append(ch.getClass().getSimpleName());
            if (ch instanceof ChangelogStateHandleStreamImpl) {
                for (Tuple2<StreamStateHandle, Long> t : ((ChangelogStateHandleStreamImpl) ch).getHandlesAndOffsets()) {
                    changelogHandles.merge(key + " / " + t.f0.getClass().getSimpleName(), 1, Integer::sum);
                }
            } else {
                changelogHandles.merge(key.toString(), 1, Integer::sum);
            }
        }
    }

    int changelogHandleCount() {
        return changelogHandles.values().stream().mapToInt(Integer::intValue).sum();
    }

    @Override
    public String toString() {
        return keyedHandles + " keyed handles (" + nonChangelogKeyedHandles + " without changelog, "
                + materializedHandles + " materialized parts), changelog " + changelogBytes + " bytes in "
                + changelogHandles;
    }
}
