package io.dstl.flink;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.operators.MailboxExecutor;
import org.apache.flink.changelog.fs.FsStateChangelogStorageFactory;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.fs.Path;
import org.apache.flink.runtime.io.AvailabilityProvider;
import org.apache.flink.runtime.metrics.groups.TaskManagerJobMetricGroup;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.LocalRecoveryConfig;
import org.apache.flink.runtime.state.LocalSnapshotDirectoryProvider;
import org.apache.flink.runtime.state.SnapshotResult;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandleStreamImpl;
import org.apache.flink.runtime.state.changelog.StateChangelogHandleReader;
import org.apache.flink.runtime.state.changelog.StateChangelogStorage;
import org.apache.flink.runtime.state.changelog.StateChangelogStorageView;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One job's changelog storage on one TaskManager: every writer of the job on this TaskManager
 * is a sandboxed dstl writer of one native {@code ChangelogStorage}, so their uploads batch into
 * shared files as Flink's own do.
 *
 * <p>Nothing starts before the first {@link #createWriter}: Flink creates a storage for every
 * task of every job, changelog on or off. The first writer opens the native storage (the
 * configuration is checked then: an unknown {@code state.changelog.dstl.*} key fails that
 * writer with the key named), registers the metrics and starts one daemon thread that takes
 * persist outcomes from the native side and completes their futures through the writers'
 * mailboxes.
 */
final class DstlChangelogStorage implements StateChangelogStorage<ChangelogStateHandleStreamImpl> {
    private static final Logger LOG = LoggerFactory.getLogger(DstlChangelogStorage.class);

    /** The prefix of Flink's changelog keys; dstl's are also accepted without it, as Flink's are. */
    static final String FLINK_PREFIX = "state.changelog.";

    /** The prefix of every key dstl reads from Flink's configuration. */
    static final String PREFIX = FLINK_PREFIX + "dstl.";

    /**
     * The plugin's own key: the scheme of the handles of changelog objects on an object store,
     * {@code dstl-s3} (served by the plugin's own file system) or {@code s3} (for a cluster that
     * runs Flink's S3 file system and wants plain {@code s3://} handles).
     */
    static final String HANDLE_SCHEME = PREFIX + "flink.handle-scheme";

    private static final String BASE_PATH = PREFIX + "dfs.base-path";

    private final JobID jobId;
    private final Configuration configuration;
    private final TaskManagerJobMetricGroup metricGroup;
    private final LocalRecoveryConfig localRecovery;

    /** The native storage; null until the first writer. */
    private NativeStorage nativeStorage;

    private boolean closed;
    private Thread completionThread;
    /** Set once the native storage is open. */
    private volatile Availability availability;

    /**
     * What Flink gets, possibly before the first writer and kept: available until the native
     * storage exists, then the native storage's availability.
     */
    private final AvailabilityProvider availabilityProvider = new AvailabilityProvider() {
        @Override
        public CompletableFuture<?> getAvailableFuture() {
            Availability a = availability;
            return a == null ? AVAILABLE : a.getAvailableFuture();
        }

        @Override
        public boolean isAvailable() {
            Availability a = availability;
            return a == null || a.isAvailable();
        }
    };
    private DstlMetrics metrics;
    private StateChangelogStorageView<ChangelogStateHandleStreamImpl> view;

    /** Persists whose outcome has not arrived yet, by request id. */
    private final Map<Long, Pending> pending = new ConcurrentHashMap<>();

    private final AtomicLong nextRequest = new AtomicLong();

    /** Open writers, freed at close if their task did not close them. */
    private final List<DstlChangelogWriter> writers = new ArrayList<>();

    DstlChangelogStorage(
            JobID jobId,
            Configuration configuration,
            TaskManagerJobMetricGroup metricGroup,
            LocalRecoveryConfig localRecovery) {
        this.jobId = jobId;
        this.configuration = configuration;
        this.metricGroup = metricGroup;
        this.localRecovery = localRecovery;
    }

    @Override
    public DstlChangelogWriter createWriter(
            String operatorId, KeyGroupRange keyGroupRange, MailboxExecutor mailboxExecutor) {
        try {
            return newWriter(operatorId, keyGroupRange, mailboxExecutor);
        } catch (IOException e) {
            // Flink's signature allows no IOException: the task fails with this one as cause.
            throw new UncheckedIOException(e.getMessage(), e);
        }
    }

    private DstlChangelogWriter newWriter(
            String operatorId, KeyGroupRange keyGroupRange, MailboxExecutor mailboxExecutor)
            throws IOException {
        // A close from here on makes the native create fail by name (the handle stays valid
        // for it: NativeStorage), or finds the writer below and frees it.
        NativeStorage storage = open();
        // Subtasks of one operator share its id; the key groups tell them apart.
        String name = operatorId + "/" + keyGroupRange.getStartKeyGroup() + "-" + keyGroupRange.getEndKeyGroup();
        DstlChangelogWriter writer =
                new DstlChangelogWriter(this, storage, name, keyGroupRange, mailboxExecutor, availability);
        synchronized (this) {
            if (closed) {
                writer.free();
                throw new IllegalStateException("dstl: the changelog storage of job " + jobId + " is closed");
            }
            writers.add(writer);
        }
        return writer;
    }

    @Override
    public StateChangelogHandleReader<ChangelogStateHandleStreamImpl> createReader() {
        synchronized (this) {
            if (view == null) {
                @SuppressWarnings("unchecked")
                StateChangelogStorageView<ChangelogStateHandleStreamImpl> fs =
                        (StateChangelogStorageView<ChangelogStateHandleStreamImpl>)
                                new FsStateChangelogStorageFactory().createStorageView(configuration);
                view = fs;
            }
            return view.createReader();
        }
    }

    @Override
    public AvailabilityProvider getAvailabilityProvider() {
        return availabilityProvider;
    }

    /**
     * Closes the native storage first, then frees the writers their tasks did not close. A
     * task thread back-pressured in a native call holds its writer's monitor until uploads
     * drain; closing the storage wakes it (its call fails), so freeing its writer never waits
     * on uploads that may never finish. Blocks for at most the native close's grace for the
     * uploads still running ({@code max-attempts × timeout}, at least 5 s).
     */
    @Override
    public void close() throws Exception {
        List<DstlChangelogWriter> open;
        NativeStorage storage;
        StateChangelogStorageView<?> reader;
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
            open = new ArrayList<>(writers);
            writers.clear();
            storage = nativeStorage;
            reader = view;
        }
        Throwable failure = null;
        if (storage != null) {
            availability.close();
            metrics.close();
            try {
                storage.close();
            } catch (IOException | RuntimeException e) {
                // The native close still ended the completion queue: go on freeing.
                failure = e;
            }
        }
        for (DstlChangelogWriter writer : open) {
            writer.free();
        }
        if (storage != null) {
            completionThread.join();
            storage.free();
        }
        for (Pending p : pending.values()) {
            p.future().completeExceptionally(new IOException("dstl: the changelog storage was closed"));
        }
        pending.clear();
        if (reader != null) {
            reader.close();
        }
        if (failure != null) {
            throw new IOException("dstl: closing the changelog storage of job " + jobId + " failed", failure);
        }
    }

    synchronized void forget(DstlChangelogWriter writer) {
        writers.remove(writer);
    }

    /** Registers a persist's future under a new request id. */
    long expect(
            CompletableFuture<SnapshotResult<ChangelogStateHandleStreamImpl>> future,
            MailboxExecutor mailbox,
            KeyGroupRange range,
            String writer) {
        long request = nextRequest.incrementAndGet();
        pending.put(request, new Pending(future, mailbox, range, writer));
        return request;
    }

    void cancel(long request) {
        pending.remove(request);
    }

    /** Opens the native storage on first use and returns it. */
    private synchronized NativeStorage open() throws IOException {
        if (closed) {
            throw new IllegalStateException("dstl: the changelog storage of job " + jobId + " is closed");
        }
        if (nativeStorage != null) {
            return nativeStorage;
        }
        Native.load();
        Map<String, String> settings = settings();
        StringBuilder packed = new StringBuilder();
        for (Map.Entry<String, String> e : settings.entrySet()) {
            packed.append(e.getKey()).append('\0').append(e.getValue()).append('\0');
        }
        NativeStorage storage = new NativeStorage(
                jobId.toString(), Native.openStorage(packed.toString().getBytes(StandardCharsets.UTF_8)));
        nativeStorage = storage;
        availability = new Availability(storage);
        metrics = DstlMetrics.register(metricGroup, storage);
        completionThread = new Thread(() -> deliverCompletions(storage), "dstl-completions-" + jobId);
        // A daemon: it never keeps a TaskManager (or a test JVM) alive.
        completionThread.setDaemon(true);
        completionThread.start();
        LOG.info("dstl changelog storage for job {} opened with {}", jobId, redacted(settings));
        return storage;
    }

    /**
     * dstl's settings from Flink's configuration: every {@code state.changelog.dstl.*} key as
     * given (Flink's {@code dfs.*} keys and dstl's own), the job id, local recovery as Flink
     * configured it for this TaskManager, and the engine settings an embedding in a JVM needs.
     */
    private Map<String, String> settings() throws IOException {
        Map<String, String> settings = new LinkedHashMap<>();
        Map<String, String> all = configuration.toMap();
        for (Map.Entry<String, String> e : all.entrySet()) {
            String key = e.getKey();
            if (key.startsWith(PREFIX + "flink.") || key.startsWith("dstl.flink.")) {
                continue; // The plugin's own keys (HANDLE_SCHEME), read on the Java side.
            }
            if (key.startsWith(PREFIX)) {
                settings.put(key, e.getValue());
            } else if (key.startsWith("dstl.") && !all.containsKey(FLINK_PREFIX + key)) {
                // Flink's older spelling (`dstl.dfs.base-path`), which Flink's own storage
                // still accepts; the full key wins where both are set.
                settings.put(FLINK_PREFIX + key, e.getValue());
            }
        }
        handleScheme();
        String base = settings.get(BASE_PATH);
        if (base == null || base.isBlank()) {
            throw new IOException("dstl: " + BASE_PATH + " is not set: say where the changelog files go");
        }
        settings.put(BASE_PATH, nativeBase(base));
        settings.put("dstl.job-id", jobId.toHexString());
        // The JVM's own SIGSEGV handler (null checks, safepoints) must stay in front; with
        // explicit bounds checks wasmtime installs none (measured: no cost to appends).
        settings.putIfAbsent(PREFIX + "writer.signals-based-traps", "false");
        // One instance pool per TaskManager, however many jobs run on it.
        settings.putIfAbsent(PREFIX + "writer.engine", "process");
        if (localRecovery.isLocalBackupEnabled()) {
            Optional<LocalSnapshotDirectoryProvider> dirs = localRecovery.getLocalStateDirectoryProvider();
            if (dirs.isPresent()) {
                // The directory Flink's own storage uses: <allocation dir>/jid_<job>/taskowned.
                int count = dirs.get().allocationBaseDirsCount();
                File dir = dirs.get().selectAllocationBaseDirectory((jobId.hashCode() & 0x7fffffff) % count);
                settings.put("dstl.local-recovery.enabled", "true");
                settings.put("dstl.local-recovery.dir", dir.getAbsolutePath());
            }
        }
        return settings;
    }

    /** The settings for a log line: secrets (the S3 secret key) shown as set, not spelled. */
    private static Map<String, String> redacted(Map<String, String> settings) {
        Map<String, String> shown = new LinkedHashMap<>(settings);
        shown.replaceAll((key, value) -> key.contains("secret") ? "(set)" : value);
        return shown;
    }

    /**
     * A local base path as a plain absolute path (dstl's form); an object store as
     * {@code s3://bucket/prefix}, also when given as {@code dstl-s3://} (the scheme its handles
     * carry).
     */
    private static String nativeBase(String base) {
        Path path = new Path(base);
        String scheme = path.toUri().getScheme();
        if (scheme == null || scheme.equals("file")) {
            return new File(path.toUri().getPath()).getAbsolutePath();
        }
        if (scheme.equals(DstlS3FileSystem.SCHEME)) {
            return "s3" + base.trim().substring(DstlS3FileSystem.SCHEME.length());
        }
        return base;
    }

    /** The scheme handles give objects of an object store: {@link #HANDLE_SCHEME}, checked by name. */
    String handleScheme() {
        String value = configuration.toMap().getOrDefault(HANDLE_SCHEME,
                configuration.toMap().getOrDefault("dstl.flink.handle-scheme", DstlS3FileSystem.SCHEME)).trim();
        if (!value.equals(DstlS3FileSystem.SCHEME) && !value.equals("s3")) {
            throw new IllegalArgumentException("dstl: invalid value `" + value + "` for `" + HANDLE_SCHEME
                    + "`: expected `" + DstlS3FileSystem.SCHEME + "` (the plugin's own file system) or `s3` (Flink's)");
        }
        return value;
    }

    /** Whether local handles go into snapshots (Flink's switch for the writer side). */
    boolean localRecoveryEnabled() {
        return localRecovery.isLocalRecoveryEnabled();
    }

    private void deliverCompletions(NativeStorage storage) {
        while (true) {
            byte[] bytes;
            try {
                bytes = storage.nextCompletion();
            } catch (RuntimeException e) {
                LOG.error("dstl: taking a persist outcome failed; persists still pending fail at close", e);
                return;
            }
            if (bytes == null) {
                return;
            }
            Pending p;
            try {
                p = pending.remove(Completion.request(bytes));
            } catch (IOException | RuntimeException e) {
                // Unreadable even where the request id goes: nobody to tell but the log.
                LOG.error("dstl: a persist outcome without a readable request id", e);
                continue;
            }
            if (p == null) {
                continue;
            }
            try {
                complete(p, Completion.decode(bytes));
            } catch (Throwable t) {
                // The outcome was taken out of `pending`: its future must not stay pending.
                LOG.error("dstl: cannot deliver the outcome of a persist of writer {}", p.writer(), t);
                p.future().completeExceptionally(new IOException(
                        "dstl: writer " + p.writer() + ": the outcome of its persist cannot be read: " + t, t));
            }
        }
    }

    private void complete(Pending p, Completion completion) {
        Runnable finish;
        if (completion.failure != null) {
            IOException error = new IOException(completion.failure);
            finish = () -> p.future().completeExceptionally(error);
        } else {
            SnapshotResult<ChangelogStateHandleStreamImpl> result =
                    completion.snapshot(p.range(), localRecoveryEnabled(), handleScheme());
            finish = () -> p.future().complete(result);
        }
        try {
            // As Flink's writer: futures complete on the task thread, between records.
            p.mailbox().execute(finish::run, "dstl persist of %s completed", p.writer());
        } catch (RejectedExecutionException | IllegalStateException e) {
            // The task is shutting down and takes no more mail (a closed mailbox): complete
            // here instead, so no future is left pending.
            finish.run();
        }
    }

    /** A persist waiting for its outcome. */
    private record Pending(
            CompletableFuture<SnapshotResult<ChangelogStateHandleStreamImpl>> future,
            MailboxExecutor mailbox,
            KeyGroupRange range,
            String writer) {}
}
