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
 * A persist's outcome as the native side encodes it ({@code flink/native/src/completion.rs},
 * which declares the format and its version), and the Flink handles built from it: the
 * handles as the writer built them, sizes included.
 */
final class Completion {
    /** The format version this class reads ({@code FORMAT_VERSION} in completion.rs). */
    static final int FORMAT_VERSION = 2;

    /**
     * The identifier dstl's handles carry. Flink picks the reader of a restored job by the
     * first handle's identifier; with Flink's own, dstl's checkpoints restore with or without
     * the plugin installed, and mixed checkpoints (during a migration) restore either way.
     */
    static final String STORAGE_ID = "filesystem";

    final long request;
    /** Why the persist failed, or null. */
    final String failure;

    private final Handle remote;
    /** Null when the writer built no local handle. */
    private final Handle local;

    private Completion(long request, String failure, Handle remote, Handle local) {
        this.request = request;
        this.failure = failure;
        this.remote = remote;
        this.local = local;
    }

    /** The request id an outcome answers: its first field in every version. */
    static long request(byte[] bytes) throws IOException {
        return new DataInputStream(new ByteArrayInputStream(bytes)).readLong();
    }

    static Completion decode(byte[] bytes) throws IOException {
        DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes));
        long request = in.readLong();
        int version = in.readUnsignedByte();
        if (version != FORMAT_VERSION) {
            throw new IOException("dstl: a persist outcome of format " + version + ", but this jar reads format "
                    + FORMAT_VERSION + ": its Java classes and native library come from different builds");
        }
        if (in.readByte() != 0) {
            return new Completion(request, string(in), null, null);
        }
        Handle remote = handle(in);
        Handle local = in.readByte() != 0 ? handle(in) : null;
        return new Completion(request, null, remote, local);
    }

    /**
     * Flink's snapshot: the remote handle, and the local one when the writer built one (every
     * change set has a local copy) and Flink recovers locally.
     */
    SnapshotResult<ChangelogStateHandleStreamImpl> snapshot(
            KeyGroupRange range, boolean localRecovery, String objectScheme) {
        ChangelogStateHandleStreamImpl remoteHandle = remote.flink(range, objectScheme);
        if (localRecovery && local != null) {
            return SnapshotResult.withLocalState(remoteHandle, local.flink(range, objectScheme));
        }
        return SnapshotResult.of(remoteHandle);
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

    private static Handle handle(DataInputStream in) throws IOException {
        long stateSize = in.readLong();
        long incrementalSize = in.readLong();
        int count = in.readInt();
        List<Entry> entries = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            entries.add(new Entry(string(in), in.readLong(), in.readLong(), in.readLong()));
        }
        return new Handle(stateSize, incrementalSize, entries);
    }

    /** A changelog handle as the writer built it. */
    private record Handle(long stateSize, long incrementalSize, List<Entry> entries) {
        ChangelogStateHandleStreamImpl flink(KeyGroupRange range, String objectScheme) {
            // One FileStateHandle per file, shared by its change sets, spelled one way: the
            // JobManager keys shared state by the path's URI.
            Map<String, StreamStateHandle> files = new HashMap<>();
            List<Tuple2<StreamStateHandle, Long>> pairs = new ArrayList<>(entries.size());
            for (Entry e : entries) {
                StreamStateHandle file = files.computeIfAbsent(
                        e.path(), p -> new FileStateHandle(flinkPath(p, objectScheme), e.fileSize()));
                pairs.add(Tuple2.of(file, e.offset()));
            }
            return new ChangelogStateHandleStreamImpl(pairs, range, stateSize, incrementalSize, STORAGE_ID);
        }
    }

    private static String string(DataInputStream in) throws IOException {
        byte[] bytes = new byte[in.readInt()];
        in.readFully(bytes);
        return new String(bytes, StandardCharsets.UTF_8);
    }

    private record Entry(String path, long fileSize, long offset, long size) {}
}
