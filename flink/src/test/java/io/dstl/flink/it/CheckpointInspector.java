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
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

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

    /** Every file a changelog handle names, as its path spells it. */
    final Set<String> changelogFiles = new TreeSet<>();

    static CheckpointInspector read(String externalPath) throws IOException {
        CheckpointInspector s = new CheckpointInspector();
        try (InputStream in = open(externalPath)) {
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

    /** The checkpoint's metadata: a local directory or file, or any Flink file system's path. */
    private static InputStream open(String externalPath) throws IOException {
        if (externalPath.startsWith("file:") || externalPath.startsWith("/")) {
            Path dir = externalPath.startsWith("file:") ? Paths.get(URI.create(externalPath)) : Paths.get(externalPath);
            return Files.newInputStream(Files.isDirectory(dir) ? dir.resolve("_metadata") : dir);
        }
        org.apache.flink.core.fs.Path path = new org.apache.flink.core.fs.Path(externalPath);
        org.apache.flink.core.fs.FileSystem fs = path.getFileSystem();
        if (fs.getFileStatus(path).isDir()) {
            path = new org.apache.flink.core.fs.Path(path, "_metadata");
        }
        return fs.open(path);
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
                    if (t.f0 instanceof org.apache.flink.runtime.state.filesystem.FileStateHandle) {
                        changelogFiles.add(((org.apache.flink.runtime.state.filesystem.FileStateHandle) t.f0)
                                .getFilePath().toString());
                    }
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
