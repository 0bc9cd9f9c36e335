package io.dstl.flink;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.flink.core.fs.BlockLocation;
import org.apache.flink.core.fs.FSDataInputStream;
import org.apache.flink.core.fs.FSDataOutputStream;
import org.apache.flink.core.fs.FileStatus;
import org.apache.flink.core.fs.FileSystem;
import org.apache.flink.core.fs.Path;

/**
 * The objects of one bucket of an S3-compatible store as a Flink {@link FileSystem}, under the
 * scheme {@code dstl-s3} ({@code dstl-s3://bucket/key}), through dstl's own object-store client
 * (the plugin's native library). It is what dstl's changelog handles on an object store name:
 * Flink's reader restores them through it and the JobManager deletes subsumed ones through it,
 * with no S3 file system of Flink's installed, and without colliding with one that is (those
 * serve {@code s3://}). It also serves {@code execution.checkpointing.dir}, so a cluster without
 * shared disks can keep checkpoints on the same store.
 *
 * <p>Object stores have no directories: a directory is a key prefix ending in {@code /}, which
 * exists while an object under it does; {@link #mkdirs} creates nothing. Reads are ranged GETs of
 * at most {@link #READ_CHUNK} bytes. A file written through {@link #create} is buffered in memory
 * and uploaded whole in one PUT when the stream closes, so it appears whole or not at all (with
 * {@link WriteMode#NO_OVERWRITE} as a conditional put: an existing object is never replaced).
 */
final class DstlS3FileSystem extends FileSystem {
    /** The URI scheme this file system serves. */
    static final String SCHEME = "dstl-s3";

    /** Bytes one read request fetches at most. */
    static final int READ_CHUNK = 4 << 20;

    private final String bucket;
    private final URI uri;
    /** The native client; never freed: Flink caches a file system for the life of the process. */
    private final long store;

    DstlS3FileSystem(String bucket, long store) {
        this.bucket = bucket;
        this.uri = URI.create(SCHEME + "://" + bucket + "/");
        this.store = store;
    }

    /** The object (or prefix) a path names, as the native client spells it: {@code s3://bucket/key}. */
    private String object(Path path) throws IOException {
        URI u = path.toUri();
        if (u.getScheme() != null && !u.getScheme().equals(SCHEME)) {
            throw new IOException("dstl: " + path + " is not a " + SCHEME + ":// path");
        }
        if (u.getAuthority() != null && !u.getAuthority().equals(bucket)) {
            throw new IOException("dstl: " + path + " is not in the bucket " + bucket);
        }
        String key = u.getPath() == null ? "" : u.getPath();
        while (key.startsWith("/")) {
            key = key.substring(1);
        }
        while (key.endsWith("/")) {
            key = key.substring(0, key.length() - 1);
        }
        return key.isEmpty() ? "s3://" + bucket : "s3://" + bucket + "/" + key;
    }

    /** The Flink path of a native object path. */
    private Path path(String object) {
        return new Path(SCHEME + "://" + object.substring("s3://".length()));
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private boolean isRoot(String object) {
        return object.equals("s3://" + bucket);
    }

    @Override
    public Path getWorkingDirectory() {
        return new Path(uri);
    }

    @Override
    public Path getHomeDirectory() {
        return new Path(uri);
    }

    @Override
    public URI getUri() {
        return uri;
    }

    @Override
    public boolean isDistributedFS() {
        return true;
    }

    @Override
    public FileStatus getFileStatus(Path path) throws IOException {
        String object = object(path);
        if (isRoot(object)) {
            return new Status(path, 0, 0, true);
        }
        long[] stat = Native.objectStat(store, utf8(object));
        if (stat != null) {
            return new Status(path, stat[0], stat[1], false);
        }
        if (!list(object).isEmpty()) {
            return new Status(path, 0, 0, true);
        }
        throw new FileNotFoundException("dstl: no object or directory " + path);
    }

    @Override
    public BlockLocation[] getFileBlockLocations(FileStatus file, long start, long len) {
        return new BlockLocation[] {new Location(file.getLen())};
    }

    @Override
    public FSDataInputStream open(Path path, int bufferSize) throws IOException {
        return open(path);
    }

    @Override
    public FSDataInputStream open(Path path) throws IOException {
        String object = object(path);
        long[] stat = Native.objectStat(store, utf8(object));
        if (stat == null) {
            throw new FileNotFoundException("dstl: no object " + path);
        }
        return new ObjectInput(object, stat[0]);
    }

    /** Every object under {@code object/}, at any depth. */
    private List<Listed> list(String object) throws IOException {
        byte[] packed = Native.objectList(store, utf8(object));
        List<Listed> listed = new ArrayList<>();
        DataInputStream in = new DataInputStream(new ByteArrayInputStream(packed));
        while (in.available() > 0) {
            byte[] name = new byte[in.readInt()];
            in.readFully(name);
            listed.add(new Listed(new String(name, StandardCharsets.UTF_8), in.readLong(), in.readLong()));
        }
        return listed;
    }

    @Override
    public FileStatus[] listStatus(Path path) throws IOException {
        String object = object(path);
        if (!isRoot(object)) {
            long[] stat = Native.objectStat(store, utf8(object));
            if (stat != null) {
                return new FileStatus[] {new Status(path, stat[0], stat[1], false)};
            }
        }
        List<Listed> listed = list(object);
        if (listed.isEmpty() && !isRoot(object)) {
            throw new FileNotFoundException("dstl: no object or directory " + path);
        }
        // The direct children: objects, and the first level of deeper prefixes.
        Map<String, FileStatus> children = new LinkedHashMap<>();
        String prefix = object + "/";
        for (Listed l : listed) {
            String rest = l.object().substring(prefix.length());
            int slash = rest.indexOf('/');
            if (slash < 0) {
                children.put(l.object(), new Status(path(l.object()), l.size(), l.modified(), false));
            } else {
                String dir = prefix + rest.substring(0, slash);
                children.putIfAbsent(dir, new Status(path(dir), 0, 0, true));
            }
        }
        return children.values().toArray(new FileStatus[0]);
    }

    @Override
    public boolean delete(Path path, boolean recursive) throws IOException {
        String object = object(path);
        if (!isRoot(object) && Native.objectStat(store, utf8(object)) != null) {
            Native.objectDelete(store, utf8(object));
            return true;
        }
        List<Listed> listed = list(object);
        if (listed.isEmpty()) {
            return false;
        }
        if (!recursive) {
            throw new IOException("dstl: the directory " + path + " is not empty (" + listed.size() + " objects)");
        }
        for (Listed l : listed) {
            Native.objectDelete(store, utf8(l.object()));
        }
        return true;
    }

    @Override
    public boolean mkdirs(Path path) {
        return true;
    }

    @Override
    public FSDataOutputStream create(Path path, WriteMode overwrite) throws IOException {
        String object = object(path);
        if (isRoot(object)) {
            throw new IOException("dstl: cannot write the bucket itself (" + path + ")");
        }
        if (overwrite == WriteMode.NO_OVERWRITE && Native.objectStat(store, utf8(object)) != null) {
            throw new java.nio.file.FileAlreadyExistsException("dstl: " + path + " already exists");
        }
        return new ObjectOutput(object, overwrite == WriteMode.OVERWRITE);
    }

    /** Object stores cannot rename; Flink's checkpoints do not need it. */
    @Override
    public boolean rename(Path src, Path dst) throws IOException {
        throw new IOException("dstl: " + SCHEME + ":// cannot rename (" + src + " to " + dst + ")");
    }

    /** An object found by a listing. */
    private record Listed(String object, long size, long modified) {}

    /** A file (an object) or a directory (a prefix). */
    private record Status(Path path, long len, long modified, boolean dir) implements FileStatus {
        @Override
        public long getLen() {
            return len;
        }

        @Override
        public long getBlockSize() {
            return READ_CHUNK;
        }

        @Override
        public short getReplication() {
            return 1;
        }

        @Override
        public long getModificationTime() {
            return modified;
        }

        @Override
        public long getAccessTime() {
            return 0;
        }

        @Override
        public boolean isDir() {
            return dir;
        }

        @Override
        public Path getPath() {
            return path;
        }
    }

    /** One block: the whole object, on no particular host. */
    private record Location(long length) implements BlockLocation {
        @Override
        public String[] getHosts() {
            return new String[] {"localhost"};
        }

        @Override
        public long getOffset() {
            return 0;
        }

        @Override
        public long getLength() {
            return length;
        }

        @Override
        public int compareTo(BlockLocation o) {
            return Long.compare(getOffset(), o.getOffset());
        }
    }

    /** An object read with ranged GETs of up to {@link #READ_CHUNK} bytes, from wherever it seeks. */
    private final class ObjectInput extends FSDataInputStream {
        private final String object;
        private final byte[] name;
        private final long size;
        private long pos;
        /** The bytes fetched last, starting at {@code chunkStart}. */
        private byte[] chunk = new byte[0];
        private long chunkStart;
        private boolean closed;

        ObjectInput(String object, long size) {
            this.object = object;
            this.name = utf8(object);
            this.size = size;
        }

        @Override
        public void seek(long desired) throws IOException {
            if (desired < 0 || desired > size) {
                throw new EOFException("dstl: cannot seek to " + desired + " in " + object + " of " + size + " bytes");
            }
            pos = desired;
        }

        @Override
        public long getPos() {
            return pos;
        }

        @Override
        public int read() throws IOException {
            byte[] one = new byte[1];
            return read(one, 0, 1) < 0 ? -1 : one[0] & 0xff;
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            if (closed) {
                throw new IOException("dstl: " + object + " was closed");
            }
            if (len == 0) {
                return 0;
            }
            if (pos >= size) {
                return -1;
            }
            if (pos < chunkStart || pos >= chunkStart + chunk.length) {
                int want = (int) Math.min(Math.max(len, READ_CHUNK), size - pos);
                chunk = Native.objectRead(store, name, pos, want);
                chunkStart = pos;
                if (chunk.length == 0) {
                    throw new EOFException("dstl: " + object + " ended at " + pos + ", before its " + size + " bytes");
                }
            }
            int from = (int) (pos - chunkStart);
            int n = Math.min(len, chunk.length - from);
            System.arraycopy(chunk, from, b, off, n);
            pos += n;
            return n;
        }

        @Override
        public long skip(long n) throws IOException {
            long to = Math.min(size, pos + Math.max(0, n));
            long skipped = to - pos;
            pos = to;
            return skipped;
        }

        @Override
        public int available() {
            return (int) Math.min(Integer.MAX_VALUE, Math.max(0, chunkStart + chunk.length - pos));
        }

        @Override
        public void close() {
            closed = true;
            chunk = new byte[0];
        }
    }

    /** A new object, buffered and uploaded whole when closed. */
    private final class ObjectOutput extends FSDataOutputStream {
        private final String object;
        private final boolean overwrite;
        private byte[] buffer = new byte[64 << 10];
        private int length;
        private boolean closed;

        ObjectOutput(String object, boolean overwrite) {
            this.object = object;
            this.overwrite = overwrite;
        }

        private void ensure(int more) throws IOException {
            if (closed) {
                throw new IOException("dstl: " + object + " was closed");
            }
            long needed = (long) length + more;
            if (needed > Integer.MAX_VALUE - 8) {
                throw new IOException("dstl: " + object + " would exceed 2 GiB, more than one object write holds");
            }
            if (needed > buffer.length) {
                buffer = Arrays.copyOf(buffer, (int) Math.min(Integer.MAX_VALUE - 8, Math.max(needed, 2L * buffer.length)));
            }
        }

        @Override
        public void write(int b) throws IOException {
            ensure(1);
            buffer[length++] = (byte) b;
        }

        @Override
        public void write(byte[] b, int off, int len) throws IOException {
            ensure(len);
            System.arraycopy(b, off, buffer, length, len);
            length += len;
        }

        @Override
        public long getPos() {
            return length;
        }

        @Override
        public void flush() {}

        @Override
        public void sync() {}

        @Override
        public void close() throws IOException {
            if (closed) {
                return;
            }
            closed = true;
            Native.objectPut(store, utf8(object), buffer, length, overwrite);
            buffer = null;
        }
    }
}
