package io.dstl.flink;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.core.fs.Path;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.SnapshotResult;
import org.apache.flink.runtime.state.StreamStateHandle;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandleStreamImpl;
import org.apache.flink.runtime.state.filesystem.FileStateHandle;

/**
 * A persist's outcome as the native side encodes it ({@code flink/native/src/completion.rs}),
 * and the Flink handles built from it.
 */
final class Completion {
    /**
     * The identifier dstl's handles carry. Flink picks the reader of a restored job by the
     * first handle's identifier; with Flink's own, dstl's checkpoints restore with or without
     * the plugin installed, and mixed checkpoints (during a migration) restore either way.
     */
    static final String STORAGE_ID = "filesystem";

    final long request;
    /** Why the persist failed, or null. */
    final String failure;

    private final long stateSize;
    private final long incrementalSize;
    private final List<Entry> remote;
    /** Null without local copies. */
    private final List<Entry> local;

    private Completion(
            long request,
            String failure,
            long stateSize,
            long incrementalSize,
            List<Entry> remote,
            List<Entry> local) {
        this.request = request;
        this.failure = failure;
        this.stateSize = stateSize;
        this.incrementalSize = incrementalSize;
        this.remote = remote;
        this.local = local;
    }

    /** The request id an outcome answers: its first field. */
    static long request(byte[] bytes) throws IOException {
        return new DataInputStream(new ByteArrayInputStream(bytes)).readLong();
    }

    static Completion decode(byte[] bytes) throws IOException {
        DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes));
        long request = in.readLong();
        if (in.readByte() != 0) {
            return new Completion(request, string(in), 0, 0, List.of(), null);
        }
        long stateSize = in.readLong();
        long incrementalSize = in.readLong();
        List<Entry> remote = entries(in);
        List<Entry> local = in.readByte() != 0 ? entries(in) : null;
        return new Completion(request, null, stateSize, incrementalSize, remote, local);
    }

    /** Flink's snapshot: the remote handle, and the local one when Flink recovers locally. */
    SnapshotResult<ChangelogStateHandleStreamImpl> snapshot(
            KeyGroupRange range, boolean localRecovery, String objectScheme) {
        ChangelogStateHandleStreamImpl remoteHandle =
                handle(remote, range, stateSize, incrementalSize, objectScheme);
        if (localRecovery && local != null && local.size() == remote.size()) {
            long localSize = local.stream().mapToLong(e -> e.size).sum();
            // As Flink's writer: a local handle reports no incremental size.
            return SnapshotResult.withLocalState(remoteHandle, handle(local, range, localSize, 0, objectScheme));
        }
        return SnapshotResult.of(remoteHandle);
    }

    private static ChangelogStateHandleStreamImpl handle(
            List<Entry> entries, KeyGroupRange range, long size, long incremental, String objectScheme) {
        // One FileStateHandle per file, shared by its change sets, spelled one way: the
        // JobManager keys shared state by the path's URI.
        Map<String, StreamStateHandle> files = new HashMap<>();
        List<Tuple2<StreamStateHandle, Long>> pairs = new ArrayList<>(entries.size());
        for (Entry e : entries) {
            StreamStateHandle file =
                    files.computeIfAbsent(e.path, p -> new FileStateHandle(flinkPath(p, objectScheme), e.fileSize));
            pairs.add(Tuple2.of(file, e.offset));
        }
        return new ChangelogStateHandleStreamImpl(pairs, range, size, incremental, STORAGE_ID);
    }

    /**
     * A local path as a {@code file:} URI (so any Flink FileSystem setup resolves it); an object
     * of an object store ({@code s3://bucket/key}) under {@code objectScheme}: {@code dstl-s3},
     * which the plugin's own file system serves, or {@code s3} for Flink's.
     */
    static Path flinkPath(String path, String objectScheme) {
        if (path.startsWith("/")) {
            return new Path(new File(path).toURI());
        }
        if (path.startsWith("s3://") && !objectScheme.equals("s3")) {
            return new Path(objectScheme + "://" + path.substring("s3://".length()));
        }
        return new Path(path);
    }

    private static List<Entry> entries(DataInputStream in) throws IOException {
        int count = in.readInt();
        List<Entry> entries = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            entries.add(new Entry(string(in), in.readLong(), in.readLong(), in.readLong()));
        }
        return entries;
    }

    private static String string(DataInputStream in) throws IOException {
        byte[] bytes = new byte[in.readInt()];
        in.readFully(bytes);
        return new String(bytes, StandardCharsets.UTF_8);
    }

    private static final class Entry {
        final String path;
        final long fileSize;
        final long offset;
        final long size;

        Entry(String path, long fileSize, long offset, long size) {
            this.path = path;
            this.fileSize = fileSize;
            this.offset = offset;
            this.size = size;
        }
    }
}
