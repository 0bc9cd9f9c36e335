package io.dstl.flink;

import java.io.IOException;
import java.util.concurrent.locks.ReentrantReadWriteLock;

/**
 * The native storage behind its handle, held alive across every call that uses it.
 *
 * <p>Flink closes a storage from other threads than the tasks that use it (the TaskManager's
 * {@code releaseJobResources} right after a slot is freed, without waiting for the slot's
 * tasks, and its shutdown hook), so a call can race with the close. Every native call on the
 * handle runs under the read lock and {@link #free} takes the write lock: the handle is freed
 * only once no call uses it, and a call after the close fails with an
 * {@link IllegalStateException} naming the storage instead of touching freed memory.
 */
final class NativeStorage {
    private final String job;
    private final ReentrantReadWriteLock lock = new ReentrantReadWriteLock();
    /** 0 once freed; written under the write lock. */
    private long handle;
    /** Set by {@link #close}: no writer is created and no capacity awaited afterwards. */
    private volatile boolean closed;

    NativeStorage(String job, long handle) {
        this.job = job;
        this.handle = handle;
    }

    /** A native call on the storage's handle. */
    @FunctionalInterface
    interface Call<T> {
        T run(long handle) throws IOException;
    }

    /** Runs {@code call} on the open storage; fails once it is closing. */
    <T> T open(String operation, Call<T> call) throws IOException {
        lock.readLock().lock();
        try {
            if (closed || handle == 0) {
                throw new IllegalStateException(
                        "dstl: the changelog storage of job " + job + " is closed (" + operation + ")");
            }
            return call.run(handle);
        } finally {
            lock.readLock().unlock();
        }
    }

    /** Runs {@code call} unless the storage was freed; {@code orElse} if it was. */
    private <T> T live(Call<T> call, T orElse) throws IOException {
        lock.readLock().lock();
        try {
            return handle == 0 ? orElse : call.run(handle);
        } finally {
            lock.readLock().unlock();
        }
    }

    /** Whether uploads are accepted without blocking; true once closing (nothing waits any more). */
    boolean awaitAvailable(long timeoutMs) {
        if (closed) {
            return true;
        }
        try {
            return live(h -> Native.awaitAvailable(h, timeoutMs), true);
        } catch (IOException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
    }

    /** The native metrics, or null once closing. */
    long[] metrics() {
        if (closed) {
            return null;
        }
        try {
            return live(Native::metrics, null);
        } catch (IOException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
    }

    /** The next persist outcome, blocking; null once closed and drained, or freed. */
    byte[] nextCompletion() {
        try {
            return live(Native::nextCompletion, null);
        } catch (IOException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
    }

    /**
     * Closes the native storage: later {@link #open} calls fail, writers waiting for upload
     * capacity wake with an error, uploads still running get the close grace, and
     * {@link #nextCompletion} returns null once the pending outcomes are delivered.
     */
    void close() throws IOException {
        closed = true;
        live(h -> {
            Native.closeStorage(h);
            return null;
        }, null);
    }

    /** Frees the handle once no call uses it; after {@link #close} and the completion thread's end. */
    void free() {
        lock.writeLock().lock();
        try {
            if (handle != 0) {
                long h = handle;
                handle = 0;
                Native.freeStorage(h);
            }
        } finally {
            lock.writeLock().unlock();
        }
    }
}
