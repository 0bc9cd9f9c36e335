package io.dstl.flink;

import java.util.concurrent.CompletableFuture;

import org.apache.flink.runtime.io.AvailabilityProvider;

/**
 * The storage's availability, driven by dstl's in-flight limit: while uploads in flight
 * reach {@code state.changelog.dstl.dfs.upload.max-in-flight}, the future is pending, and
 * Flink's task stops taking input until dstl's uploads drain below the limit (as with
 * Flink's own storage). The wait runs on a daemon thread started when it is first needed.
 */
final class Availability implements AvailabilityProvider {
    private final long storage;
    private CompletableFuture<?> waiting;
    private Thread waiter;
    private boolean closed;

    Availability(long storage) {
        this.storage = storage;
    }

    @Override
    public synchronized CompletableFuture<?> getAvailableFuture() {
        if (closed || Native.awaitAvailable(storage, 0)) {
            return AVAILABLE;
        }
        if (waiting == null || waiting.isDone()) {
            waiting = new CompletableFuture<>();
            notifyAll();
        }
        if (waiter == null) {
            waiter = new Thread(this::watch, "dstl-availability");
            waiter.setDaemon(true);
            waiter.start();
        }
        return waiting;
    }

    /** Completes each pending future once uploads are accepted again. */
    private void watch() {
        while (true) {
            CompletableFuture<?> future;
            synchronized (this) {
                while (!closed && (waiting == null || waiting.isDone())) {
                    try {
                        wait();
                    } catch (InterruptedException e) {
                        return;
                    }
                }
                if (closed) {
                    if (waiting != null) {
                        waiting.complete(null);
                    }
                    return;
                }
                future = waiting;
            }
            // Polls in slices so a close is noticed.
            while (!Native.awaitAvailable(storage, 200)) {
                synchronized (this) {
                    if (closed) {
                        break;
                    }
                }
            }
            future.complete(null);
        }
    }

    /** Before the native storage is freed: nothing waits on it afterwards. */
    void close() throws InterruptedException {
        Thread thread;
        synchronized (this) {
            closed = true;
            notifyAll();
            thread = waiter;
        }
        if (thread != null) {
            thread.join();
        }
    }

    @Override
    public synchronized boolean isAvailable() {
        return closed || Native.awaitAvailable(storage, 0);
    }
}
