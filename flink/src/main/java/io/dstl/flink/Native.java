package io.dstl.flink;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/**
 * The JNI entry points of the native library ({@code flink/native}: the dstl host with its
 * writer component compiled in). Handles are pointers owned by the Java object holding them;
 * see {@code flink/native/src/lib.rs} for each call's contract.
 *
 * <p>The library is loaded once per class loader that loads this class: once per JVM on the
 * classpath, once per TaskManager from {@code plugins/dstl/}. It is extracted from the jar to
 * a temporary file first, because a JVM can only load a shared object from the file system.
 * The system property {@code dstl.native.library} names a library file to load instead.
 */
final class Native {
    private static final String RESOURCE = "/io/dstl/flink/native/linux-x86_64/libdstl_flink.so";

    private static volatile Throwable loadFailure;
    private static volatile boolean loaded;

    private Native() {}

    /** Loads the library on first use; later calls return at once (or rethrow its failure). */
    static synchronized void load() throws IOException {
        if (loaded) {
            return;
        }
        if (loadFailure != null) {
            throw new IOException("dstl: the native library failed to load earlier", loadFailure);
        }
        try {
            String override = System.getProperty("dstl.native.library");
            if (override != null) {
                System.load(Path.of(override).toAbsolutePath().toString());
            } else {
                Path file = extract();
                try {
                    System.load(file.toString());
                } finally {
                    // Mapped once loaded: the file can go at once, so a process that is
                    // killed (no shutdown hooks run) leaves nothing behind in the temp dir.
                    Files.deleteIfExists(file);
                }
            }
            loaded = true;
        } catch (IOException | RuntimeException | UnsatisfiedLinkError e) {
            loadFailure = e;
            throw new IOException(
                    "dstl: cannot load the native library "
                            + RESOURCE
                            + " (dstl's Flink plugin runs on linux-x86_64): "
                            + e,
                    e);
        }
    }

    private static Path extract() throws IOException {
        String os = System.getProperty("os.name", "").toLowerCase();
        String arch = System.getProperty("os.arch", "");
        if (!os.contains("linux") || !(arch.equals("amd64") || arch.equals("x86_64"))) {
            throw new IOException(
                    "dstl: no native library for " + os + "/" + arch + "; the jar carries linux-x86_64");
        }
        try (InputStream in = Native.class.getResourceAsStream(RESOURCE)) {
            if (in == null) {
                throw new IOException("dstl: the jar holds no " + RESOURCE + "; build it with flink/build.sh");
            }
            Path file = Files.createTempFile("libdstl_flink", ".so");
            try {
                Files.copy(in, file, StandardCopyOption.REPLACE_EXISTING);
            } catch (IOException e) {
                Files.deleteIfExists(file);
                throw e;
            }
            return file;
        }
    }

    /**
     * Whether the calling thread was interrupted, without clearing the flag: the native side
     * asks this while a writer call waits for upload capacity, so a cancelled task (Flink
     * interrupts its thread) is not held in dstl.
     */
    static boolean interrupted() {
        return Thread.currentThread().isInterrupted();
    }

    static native long openStorage(byte[] settings) throws IOException;

    static native void closeStorage(long storage);

    static native void freeStorage(long storage);

    static native byte[] nextCompletion(long storage);

    static native boolean awaitAvailable(long storage, long timeoutMs);

    /** The metrics {@link #metrics} reports, a UTF-8 line {@code KIND NAME} each, in its order. */
    static native byte[] metricNames();

    static native long[] metrics(long storage);

    /** What a writer's batch holds at most: {@code changes << 32 | aloneAt}. */
    static native long batchLimits();

    static native long createWriter(
            long storage,
            byte[] name,
            int start,
            int end,
            ByteBuffer keyGroups,
            ByteBuffer lengths,
            ByteBuffer offsets,
            ByteBuffer budget)
            throws IOException;

    /**
     * Appends the {@code count} changes of {@code framer}'s batch (key groups and lengths in its
     * buffers), framed here, whose values it writes into the writer's sandbox when this call has
     * it do so: {@code framer.frame(ByteBuffer)}, called back on this thread during this call.
     */
    static native void appendFramed(long writer, DstlChangelogWriter framer, int count) throws IOException;

    /** One change on its own: how a key group outside the writer's range gets the writer's error. */
    static native void append(long writer, int keyGroup, byte[] value) throws IOException;

    static native long nextSequenceNumber(long writer) throws IOException;

    /** Appends {@code framer}'s batch as {@link #appendFramed} does, then persists, in one call. */
    static native void persistFramed(
            long writer, DstlChangelogWriter framer, int count, long from, long checkpoint, long request)
            throws IOException;

    static native void truncate(long writer, long to) throws IOException;

    static native void confirm(long writer, long from, long to, long checkpoint) throws IOException;

    static native void reset(long writer, long from, long to, long checkpoint) throws IOException;

    static native void truncateAndClose(long writer, long from) throws IOException;

    static native void closeWriter(long writer) throws IOException;

    static native byte[] failure(long writer);

    /** A handle that announces the writer's close from another thread; see {@code raiseClose}. */
    static native long closeSignal(long writer) throws IOException;

    /** Ends the writer's waits for upload capacity (its close follows); never blocks. */
    static native void raiseClose(long signal);

    static native void freeCloseSignal(long signal);

    // The dstl-s3:// file system (DstlS3FileSystem): one client per bucket; paths are
    // s3://bucket/key in UTF-8.

    static native long openObjectStore(byte[] settings, byte[] bucket) throws IOException;

    static native void closeObjectStore(long store);

    /** {size, modified ms}, or null if there is no such object. */
    static native long[] objectStat(long store, byte[] path) throws IOException;

    static native byte[] objectRead(long store, byte[] path, long offset, int length) throws IOException;

    /** Every object under path/: int length, UTF-8 path, long size, long modified ms, each. */
    static native byte[] objectList(long store, byte[] path) throws IOException;

    static native void objectDelete(long store, byte[] path) throws IOException;

    static native void objectPut(long store, byte[] path, byte[] data, int length, boolean overwrite)
            throws IOException;
}
