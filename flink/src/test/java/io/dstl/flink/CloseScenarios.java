package io.dstl.flink;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.operators.MailboxExecutor;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.metrics.groups.UnregisteredMetricGroups;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.LocalRecoveryConfig;
import org.apache.flink.runtime.state.SnapshotResult;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandleStreamImpl;
import org.apache.flink.runtime.state.changelog.SequenceNumber;
import org.apache.flink.runtime.state.changelog.StateChangelogStorage;
import org.apache.flink.runtime.state.changelog.StateChangelogWriter;
import org.apache.flink.util.function.ThrowingRunnable;

/**
 * Flink-style programs that close a dstl storage in the ways a TaskManager does, each run in a
 * JVM of its own by {@code io.dstl.flink.it.StorageCloseTest}: a native abort would take the
 * whole JVM down (exit 134), which only a child process can report. Each prints
 * {@code SURVIVED <scenario>} and exits 0 when everything held; an expectation that fails
 * exits 1 with the reason.
 *
 * <ul>
 *   <li>{@code poisoned DIR}: a writer whose native call panics inside the host (injected through
 *       {@link TestHooks}) fails with a typed error; the other writer carries on; closing the
 *       storage with both writers open returns.
 *   <li>{@code back-pressured ENDPOINT BUCKET ACCESS SECRET WEED_PID}: three task threads block
 *       for upload capacity against a store that never answers (SeaweedFS stopped with SIGSTOP);
 *       an interrupt frees one at once (as Flink's task cancellation interrupts); closing a
 *       writer from another thread frees the second, its close not waiting behind the blocked
 *       call (Flink's canceler closes the task's backend before it interrupts); closing the
 *       storage frees the third, and the close returns within its grace.
 *   <li>{@code mid-create DIR}: writers are created while the storage closes, many times over;
 *       each create either succeeds or fails naming the closed storage, never touching freed
 *       memory.
 * </ul>
 */
public final class CloseScenarios {
    private CloseScenarios() {}

    public static void main(String[] args) throws Exception {
        try {
            switch (args[0]) {
                case "poisoned":
                    poisoned(Path.of(args[1]));
                    break;
                case "back-pressured":
                    backPressured(args[1], args[2], args[3], args[4], Long.parseLong(args[5]));
                    break;
                case "mid-create":
                    midCreate(Path.of(args[1]));
                    break;
                default:
                    throw new IllegalArgumentException("unknown scenario " + args[0]);
            }
        } catch (Throwable t) {
            System.out.println("FAILED " + args[0] + ": " + t);
            t.printStackTrace(System.out);
            System.out.flush();
            System.exit(1);
        }
        System.out.println("SURVIVED " + args[0]);
        System.out.flush();
        System.exit(0);
    }

    /** Runs mail at once, on the thread that completes the future. */
    public static final class DirectMailbox implements MailboxExecutor {
        @Override
        public void execute(
                MailOptions options,
                ThrowingRunnable<? extends Exception> command,
                String description,
                Object... args) {
            try {
                command.run();
            } catch (Exception e) {
                throw new RuntimeException(e);
            }
        }

        @Override
        public void yield() {
            throw new UnsupportedOperationException();
        }

        @Override
        public boolean tryYield() {
            return false;
        }

        @Override
        public boolean shouldInterrupt() {
            return false;
        }
    }

    /** A dstl storage of a new job with {@code settings}, as a TaskManager opens one. */
    public static StateChangelogStorage<?> storage(Map<String, String> settings) {
        return new DstlChangelogStorageFactory().createStorage(
                new JobID(),
                Configuration.fromMap(settings),
                UnregisteredMetricGroups.createUnregisteredTaskManagerJobMetricGroup(),
                LocalRecoveryConfig.BACKUP_AND_RECOVERY_DISABLED);
    }

    @SuppressWarnings("unchecked")
    static StateChangelogWriter<ChangelogStateHandleStreamImpl> writer(StateChangelogStorage<?> storage, String name) {
        return (StateChangelogWriter<ChangelogStateHandleStreamImpl>)
                storage.createWriter(name, new KeyGroupRange(0, 127), new DirectMailbox());
    }

    static Map<String, String> local(Path dir) {
        Map<String, String> settings = new HashMap<>();
        settings.put("state.changelog.dstl.dfs.base-path", dir.toAbsolutePath().toString());
        // Room for every writer the creators race in before a close (4 × 200).
        settings.put("state.changelog.dstl.writer.max-writers", "1024");
        return settings;
    }

    static void check(boolean condition, String what) {
        if (!condition) {
            throw new AssertionError(what);
        }
    }

    static String causes(Throwable t) {
        StringBuilder out = new StringBuilder();
        for (Throwable c = t; c != null; c = c.getCause()) {
            out.append(c).append(" / ");
        }
        return out.toString();
    }

    private static void poisoned(Path dir) throws Exception {
        Map<String, String> settings = local(dir);
        // Batches leave at 1 KiB or after a day: op-a's first persist still waits when its
        // writer fails.
        settings.put("state.changelog.dstl.dfs.batch.persist-delay", "1d");
        settings.put("state.changelog.dstl.dfs.batch.persist-size-threshold", "1kb");
        StateChangelogStorage<?> storage = storage(settings);
        StateChangelogWriter<ChangelogStateHandleStreamImpl> a = writer(storage, "op-a");
        StateChangelogWriter<ChangelogStateHandleStreamImpl> b = writer(storage, "op-b");
        SequenceNumber from = a.initialSequenceNumber();
        a.append(1, new byte[] {1});
        CompletableFuture<SnapshotResult<ChangelogStateHandleStreamImpl>> waiting = a.persist(from, 1);
        a.append(2, new byte[] {2});
        a.nextSequenceNumber();
        TestHooks.panicInNextSchedule(storage);
        try {
            a.persist(from, 2);
            throw new AssertionError("op-a's persist went through a panicking host");
        } catch (IOException e) {
            check(e.getMessage().contains("internal error of dstl"), "op-a's persist: " + e);
        }
        try {
            a.append(3, new byte[] {3});
            a.persist(from, 3);
            throw new AssertionError("op-a still works after its host call panicked");
        } catch (IOException e) {
            check(e.getMessage().contains("internal error of dstl"), "op-a's later call: " + e);
        }
        try {
            waiting.get(30, TimeUnit.SECONDS);
            throw new AssertionError("op-a's earlier persist completed although its writer failed");
        } catch (ExecutionException e) {
            check(causes(e).contains("internal error of dstl"), "op-a's earlier persist: " + causes(e));
        }
        // op-b goes through the same scheduler, whose lock the panic held.
        b.append(1, new byte[2048]);
        SnapshotResult<ChangelogStateHandleStreamImpl> snapshot =
                b.persist(b.initialSequenceNumber(), 1).get(30, TimeUnit.SECONDS);
        check(snapshot.getJobManagerOwnedSnapshot().getStateSize() >= 2048,
                "op-b's snapshot: " + snapshot.getJobManagerOwnedSnapshot());
        // Close as the TaskManager does: the storage first, the writers never closed by their tasks.
        storage.close();
        System.out.println("op-a failed with the host's panic; op-b persisted; the storage closed");
    }

    private static void backPressured(String endpoint, String bucket, String access, String secret, long weedPid)
            throws Exception {
        Map<String, String> settings = new HashMap<>();
        settings.put("state.changelog.dstl.dfs.base-path", "s3://" + bucket + "/back-pressured");
        settings.put("state.changelog.dstl.s3.endpoint", endpoint);
        settings.put("state.changelog.dstl.s3.region", "us-east-1");
        settings.put("state.changelog.dstl.s3.access-key-id", access);
        settings.put("state.changelog.dstl.s3.secret-access-key", secret);
        settings.put("state.changelog.dstl.s3.allow-http", "true");
        // An upload that never ends: no retry timeout, and the store's requests wait a day.
        settings.put("state.changelog.dstl.dfs.upload.retry-policy", "none");
        settings.put("state.changelog.dstl.s3.request-timeout", "1d");
        settings.put("state.changelog.dstl.dfs.upload.max-in-flight", "1kb");
        settings.put("state.changelog.dstl.dfs.batch.persist-size-threshold", "1kb");
        settings.put("state.changelog.dstl.dfs.preemptive-persist-threshold", "1kb");
        settings.put("state.changelog.dstl.writer.max-writers", "64");
        StateChangelogStorage<?> storage = storage(settings);
        // The first writer opens the storage, which writes its lease: retry while the fresh
        // server is still coming up.
        StateChangelogWriter<ChangelogStateHandleStreamImpl> a = null;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (a == null) {
            try {
                a = writer(storage, "op-a");
            } catch (UncheckedIOException e) {
                if (System.nanoTime() > deadline) {
                    throw e;
                }
                storage.close();
                storage = storage(settings);
                Thread.sleep(200);
            }
        }
        StateChangelogWriter<ChangelogStateHandleStreamImpl> b = writer(storage, "op-b");
        StateChangelogWriter<ChangelogStateHandleStreamImpl> c = writer(storage, "op-c");
        new ProcessBuilder("kill", "-STOP", Long.toString(weedPid)).inheritIO().start().waitFor();
        try {
            AtomicLong progress = new AtomicLong();
            List<Throwable> ended = new CopyOnWriteArrayList<>();
            Thread ta = appender(a, progress, ended);
            Thread tb = appender(b, progress, ended);
            Thread tc = appender(c, progress, ended);
            ta.start();
            tb.start();
            tc.start();
            // Both block once the in-flight limit is reached: no append for a second.
            long last = -1;
            long still = System.nanoTime();
            while (System.nanoTime() - still < TimeUnit.SECONDS.toNanos(1)) {
                long now = progress.get();
                if (now != last) {
                    last = now;
                    still = System.nanoTime();
                }
                check(ended.isEmpty(), "an appender ended before blocking: " + ended);
                Thread.sleep(20);
            }
            check(ta.isAlive() && tb.isAlive() && tc.isAlive(), "the task threads are blocked");
            // Flink's task cancellation interrupts the task thread.
            long interrupted = System.nanoTime();
            ta.interrupt();
            ta.join(5_000);
            check(!ta.isAlive(), "the interrupted task thread is still blocked in dstl after 5 s");
            System.out.printf("the interrupted task thread left dstl after %d ms: %s%n",
                    (System.nanoTime() - interrupted) / 1_000_000, ended);
            // Flink's canceler closes the task's backend, and so its writer, from a thread of its
            // own before it interrupts the task thread, which holds the writer in its wait.
            long closingWriter = System.nanoTime();
            Thread closer = new Thread(c::close, "canceler-" + c);
            closer.setDaemon(true);
            closer.start();
            closer.join(5_000);
            check(!closer.isAlive(), "closing a writer waits behind its blocked task thread (5 s)");
            tc.join(5_000);
            check(!tc.isAlive(), "the task thread of the closed writer is still blocked in dstl after 5 s");
            System.out.printf("a writer closed from another thread in %d ms; its task thread left: %s%n",
                    (System.nanoTime() - closingWriter) / 1_000_000, ended);
            check(tb.isAlive(), "the other task thread should still wait for capacity");
            // The TaskManager closes the storage with the other task still blocked.
            long closing = System.nanoTime();
            storage.close();
            long closedMs = (System.nanoTime() - closing) / 1_000_000;
            tb.join(5_000);
            check(!tb.isAlive(), "the other task thread is still blocked after the storage closed");
            System.out.printf("storage.close() returned after %d ms; the other task thread left too: %s%n",
                    closedMs, ended);
            check(closedMs < 20_000, "close took " + closedMs + " ms, beyond its grace");
        } finally {
            new ProcessBuilder("kill", "-CONT", Long.toString(weedPid)).inheritIO().start().waitFor();
        }
    }

    /** A task thread appending 2 KiB changes until a call fails. */
    private static Thread appender(
            StateChangelogWriter<ChangelogStateHandleStreamImpl> writer, AtomicLong progress, List<Throwable> ended) {
        Thread t = new Thread(() -> {
            try {
                for (int i = 0; ; i++) {
                    writer.append(i % 128, new byte[2048]);
                    progress.incrementAndGet();
                }
            } catch (Throwable e) {
                ended.add(e);
            }
        }, "task-" + writer);
        t.setDaemon(true);
        return t;
    }

    private static void midCreate(Path dir) throws Exception {
        int created = 0;
        int refused = 0;
        for (int round = 0; round < 40; round++) {
            Path base = Files.createDirectories(dir.resolve("round-" + round));
            StateChangelogStorage<?> storage = storage(local(base));
            writer(storage, "first").close();
            List<Throwable> unexpected = new CopyOnWriteArrayList<>();
            AtomicLong ok = new AtomicLong();
            AtomicLong closedErrors = new AtomicLong();
            List<Thread> creators = new ArrayList<>();
            for (int t = 0; t < 4; t++) {
                int id = t;
                Thread creator = new Thread(() -> {
                    for (int i = 0; i < 200; i++) {
                        try {
                            writer(storage, "w-" + id + "-" + i);
                            ok.incrementAndGet();
                        } catch (IllegalStateException | UncheckedIOException e) {
                            if (!String.valueOf(e.getMessage()).contains("closed")) {
                                unexpected.add(e);
                            }
                            closedErrors.incrementAndGet();
                            return;
                        } catch (Throwable e) {
                            unexpected.add(e);
                            return;
                        }
                    }
                });
                creators.add(creator);
                creator.start();
            }
            Thread.sleep(round % 5);
            storage.close();
            for (Thread creator : creators) {
                creator.join(30_000);
                check(!creator.isAlive(), "a creator is stuck");
            }
            check(unexpected.isEmpty(), "creates racing close failed unexpectedly: " + unexpected);
            created += ok.get();
            refused += closedErrors.get();
        }
        System.out.printf("%d writers created and %d creates refused as closed, racing 40 closes%n", created, refused);
    }
}
