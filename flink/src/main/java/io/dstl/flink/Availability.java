package io.dstl.flink;

import java.util.concurrent.CompletableFuture;

import org.apache.flink.runtime.io.AvailabilityProvider;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The storage's availability, driven by dstl's in-flight limit: while uploads in flight
 * reach {@code state.changelog.dstl.dfs.upload.max-in-flight}, the future is pending, and
 * Flink's task stops taking input until dstl's uploads drain below the limit (as with
 * Flink's own storage).
 *
 * <p>Flink asks often (between records), so the answer is a volatile read. Uploads are
 * admitted only inside a writer's native calls, so the writers {@link #refresh} the flag after
 * each call that may have scheduled one; the way back (uploads completing) is watched by a
 * daemon thread started when first needed, which completes the pending future.
 */
final class Availability implements AvailabilityProvider {
    private static final Logger LOG = LoggerFactory.getLogger(Availability.class);

    private final NativeStorage storage;
    private volatile boolean available = true;
    private CompletableFuture<?> waiting;
    private Thread waiter;
    private boolean closed;

    Availability(NativeStorage storage) {
        this.storage = storage;
    }

    @Override
    public CompletableFuture<?> getAvailableFuture() {
        if (available) {
            return AVAILABLE;
        }
        synchronized (this) {
            if (closed || available) {
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
    }

    @Override
    public boolean isAvailable() {
        return available;
    }

    /** After a writer's native call that may have admitted an upload. */
    void refresh() {
        if (!storage.awaitAvailable(0)) {
            synchronized (this) {
                if (!closed) {
                    available = false;
                    notifyAll();
                }
            }
        }
    }

    /** Waits, while the flag is down, for uploads to be accepted again. */
    private void watch() {
        while (true) {
            synchronized (this) {
                while (!closed && available) {
                    try {
                        wait();
                    } catch (InterruptedException e) {
                        return;
                    }
                }
                if (closed) {
                    return;
                }
            }
            // Polls in slices so a close is noticed.
            boolean again = false;
            while (!again) {
                try {
                    again = storage.awaitAvailable(200);
                } catch (Exception e) { // the native side reports panics as IOException
                    // Never leave the task waiting on a future nobody completes: report
                    // available (uploads still block on the limit inside the writer calls).
                    LOG.error("dstl: waiting for upload capacity failed; reporting available", e);
                    again = true;
                }
                synchronized (this) {
                    if (closed) {
                        return;
                    }
                }
            }
            CompletableFuture<?> future;
            synchronized (this) {
                available = true;
                future = waiting;
                waiting = null;
            }
            if (future != null) {
                future.complete(null);
            }
        }
    }

    /** Before the native storage is freed: nothing waits on it afterwards. */
    void close() throws InterruptedException {
        Thread thread;
        CompletableFuture<?> future;
        synchronized (this) {
            closed = true;
            available = true;
            future = waiting;
            waiting = null;
            notifyAll();
            thread = waiter;
        }
        if (future != null) {
            future.complete(null);
        }
        if (thread != null) {
            thread.join();
        }
    }
}
