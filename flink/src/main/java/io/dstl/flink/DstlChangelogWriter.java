package io.dstl.flink;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;

import org.apache.flink.api.common.operators.MailboxExecutor;
import org.apache.flink.runtime.state.KeyGroupRange;
import org.apache.flink.runtime.state.SnapshotResult;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandleStreamImpl;
import org.apache.flink.runtime.state.changelog.SequenceNumber;
import org.apache.flink.runtime.state.changelog.StateChangelogWriter;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One Flink operator's changelog writer: a sandboxed dstl writer (its own component instance)
 * behind JNI, with Flink's writer semantics.
 *
 * <p>Appends are kept as they come (the value arrays, not copies) and cross JNI as one batch:
 * before any other call of this writer (so the writer sees every operation in order), and when
 * the batch uses up the budget the native writer publishes after each hand-off (dstl's one
 * hand-off rule, which hands a batch over exactly when the open change set reaches the
 * pre-emptive persist threshold, so pre-emptive uploads start when Flink's would). A value at
 * or above the budget's {@code aloneAt} goes across in a batch of its own. This class keeps no
 * threshold of its own.
 *
 * <p>A batch crosses as its key groups and lengths, packed into direct buffers; the native side
 * frames it in memory the native writer's sandbox allocated for it and, during the same call,
 * has this writer write the values into their places there ({@link #frame}). So that is the one
 * copy of a value before the file's, and the format is the native side's alone.
 *
 * <p>Flink calls a writer from its task thread only; the native calls are synchronized all
 * the same, so the storage can free a writer its task never closed. A call that waits for
 * upload capacity holds the writer's monitor; it ends when its thread is interrupted (a
 * cancelled task), when the writer is closed from another thread (which raises the writer's
 * close signal before it takes the monitor: Flink's canceler closes a task's state backend
 * before it interrupts the task thread), or when the storage closes, which the storage does
 * before it frees its writers.
 */
final class DstlChangelogWriter implements StateChangelogWriter<ChangelogStateHandleStreamImpl> {
    private static final Logger LOG = LoggerFactory.getLogger(DstlChangelogWriter.class);

    /** What a batch holds at most, as the native side says: {@code changes << 32 | aloneAt}. */
    private static final long LIMITS = Native.batchLimits();
    /** Changes a batch holds at most. */
    private static final int MAX_CHANGES = (int) (LIMITS >>> 32);
    /** Values this large or larger go in a batch of their own. */
    private static final int ALONE_AT = (int) LIMITS;

    private static final int META = -1;

    private final DstlChangelogStorage storage;
    private final String name;
    private final KeyGroupRange range;
    private final MailboxExecutor mailbox;
    private final Availability availability;

    /** The batch: each change's key group and length (native-order ints, read in place) ... */
    private final ByteBuffer keyGroups;
    private final ByteBuffer lengths;
    /** ... and value, as appended ... */
    private final byte[][] values;
    /** ... and where each value goes in the framed batch, as the native side says, for {@link #frame}. */
    private final ByteBuffer offsets;
    /** The native writer's hand-off budget, published after each call that changes it. */
    private final ByteBuffer budget;
    private int count;
    private long bytes;
    /** The batch is handed over by the append that brings its bytes to this ... */
    private long budgetBytes;
    /** ... or its count to this. */
    private int budgetChanges;
    /** Values this large or larger go alone. */
    private int aloneAt;

    /** The native writer; 0 once closed (and freed). */
    private long handle;
    private boolean closed;
    /** Guards {@link #closeSignal}, which a close raises without the writer's monitor. */
    private final Object signalLock = new Object();
    /** The native writer's close signal ({@code Native.closeSignal}); 0 once freed. */
    private long closeSignal;

    DstlChangelogWriter(
            DstlChangelogStorage storage,
            NativeStorage nativeStorage,
            String name,
            KeyGroupRange range,
            MailboxExecutor mailbox,
            Availability availability)
            throws IOException {
        this.availability = availability;
        this.storage = storage;
        this.name = name;
        this.range = range;
        this.mailbox = mailbox;
        // Native order: the native side reads and writes these in place.
        this.keyGroups = ByteBuffer.allocateDirect(MAX_CHANGES * 4).order(ByteOrder.nativeOrder());
        this.lengths = ByteBuffer.allocateDirect(MAX_CHANGES * 4).order(ByteOrder.nativeOrder());
        this.offsets = ByteBuffer.allocateDirect(MAX_CHANGES * 4).order(ByteOrder.nativeOrder());
        this.values = new byte[MAX_CHANGES][];
        this.budget = ByteBuffer.allocateDirect(16).order(ByteOrder.nativeOrder());
        byte[] utf8 = name.getBytes(StandardCharsets.UTF_8);
        this.handle = nativeStorage.open("createWriter", h -> Native.createWriter(
                h, utf8, range.getStartKeyGroup(), range.getEndKeyGroup(), keyGroups, lengths, offsets, budget));
        readBudget();
        try {
            this.closeSignal = Native.closeSignal(handle);
        } catch (IOException | RuntimeException e) {
            try {
                Native.closeWriter(handle);
            } catch (IOException | RuntimeException closing) {
                e.addSuppressed(closing);
            }
            handle = 0;
            throw e;
        }
    }

    @Override
    public SequenceNumber initialSequenceNumber() {
        return SequenceNumber.of(0);
    }

    @Override
    public SequenceNumber nextSequenceNumber() {
        synchronized (this) {
            try {
                flush();
                return SequenceNumber.of(Native.nextSequenceNumber(open("nextSequenceNumber")));
            } catch (IOException e) {
                // Flink's signature has no IOException here; the cause names the writer.
                throw new IllegalStateException(e.getMessage(), e);
            } finally {
                readBudget();
            }
        }
    }

    @Override
    public void appendMeta(byte[] value) throws IOException {
        add(META, value);
    }

    @Override
    public void append(int keyGroup, byte[] value) throws IOException {
        if (keyGroup < 0) {
            throw new IllegalArgumentException(
                    "dstl: writer " + name + ": key group " + keyGroup + " is negative");
        }
        add(keyGroup, value);
    }

    private void add(int keyGroup, byte[] value) throws IOException {
        if (closed) {
            // As Flink's writer: a change after close is dropped with a warning.
            LOG.warn("dstl: writer {} is closed; a change for key group {} is ignored", name, keyGroup);
            return;
        }
        if (keyGroup != META && !range.contains(keyGroup)) {
            // Outside the range: on its own, for the native writer's error, so the batch
            // before it is not refused with it.
            synchronized (this) {
                flush();
                try {
                    Native.append(open("append"), keyGroup, value);
                } finally {
                    readBudget();
                }
            }
            return;
        }
        int length = value.length;
        if (length >= aloneAt && count > 0) {
            flush();
        }
        int slot = count * 4;
        keyGroups.putInt(slot, keyGroup);
        lengths.putInt(slot, length);
        values[count] = value;
        count++;
        bytes += length;
        if (bytes >= budgetBytes || count >= budgetChanges || length >= aloneAt) {
            flush();
        }
    }

    /**
     * Writes the batch's values into {@code out}: each at the offset the native side put into
     * {@link #offsets}. The native writer calls this during {@link Native#appendFramed} or
     * {@link Native#persistFramed}, with {@code out} over the memory its sandbox allocated for
     * the batch, which it has framed; {@code out} is not used past the call.
     */
    void frame(ByteBuffer out) {
        for (int i = 0; i < count; i++) {
            out.put(offsets.getInt(i * 4), values[i]);
        }
    }

    /** Empties the batch, whether it reached the native writer or not. */
    private void clearBatch() {
        Arrays.fill(values, 0, count, null);
        count = 0;
        bytes = 0;
    }

    /** Hands the batch to the native writer. */
    private synchronized void flush() throws IOException {
        if (count == 0) {
            return;
        }
        try {
            Native.appendFramed(open("append"), this, count);
        } finally {
            clearBatch();
            readBudget();
        }
        availability.refresh();
    }

    /** Reads the budget the native writer published with its last call. */
    private void readBudget() {
        budgetBytes = budget.getLong(0);
        budgetChanges = Math.min(budget.getInt(8), MAX_CHANGES);
        aloneAt = Math.min(budget.getInt(12), ALONE_AT);
    }

    @Override
    public CompletableFuture<SnapshotResult<ChangelogStateHandleStreamImpl>> persist(
            SequenceNumber from, long checkpointId) throws IOException {
        Objects.requireNonNull(from, "from");
        synchronized (this) {
            long writer = open("persist");
            long start = number(from);
            CompletableFuture<SnapshotResult<ChangelogStateHandleStreamImpl>> future =
                    new CompletableFuture<>();
            long request = storage.expect(future, mailbox, range, name);
            // The batch goes along with the persist, in one native call.
            try {
                Native.persistFramed(writer, this, count, start, checkpointId, request);
            } catch (IOException | RuntimeException e) {
                storage.cancel(request);
                throw e;
            } finally {
                clearBatch();
                readBudget();
            }
            availability.refresh();
            return future;
        }
    }

    @Override
    public void truncate(SequenceNumber to) {
        synchronized (this) {
            unchecked(h -> {
                flush();
                Native.truncate(h, number(to));
            }, open("truncate"));
        }
    }

    @Override
    public void confirm(SequenceNumber from, SequenceNumber to, long checkpointId) {
        unlessClosed(h -> Native.confirm(h, number(from), number(to), checkpointId));
    }

    @Override
    public void reset(SequenceNumber from, SequenceNumber to, long checkpointId) {
        unlessClosed(h -> Native.reset(h, number(from), number(to), checkpointId));
    }

    /** A native call on the writer's handle that returns nothing. */
    @FunctionalInterface
    private interface Call {
        void run(long handle) throws IOException;
    }

    /** Runs {@code call} on {@code writer}, for a Flink signature without IOException. */
    private static void unchecked(Call call, long writer) {
        try {
            call.run(writer);
        } catch (IOException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
    }

    /**
     * Flushes and runs {@code call} on the open writer; nothing once it is closed: the files of
     * returned snapshots stay tracked until the storage closes.
     */
    private void unlessClosed(Call call) {
        synchronized (this) {
            if (handle != 0) {
                unchecked(h -> {
                    flush();
                    call.run(h);
                }, handle);
            }
        }
    }

    @Override
    public void truncateAndClose(SequenceNumber from) {
        closeWith("truncateAndClose", h -> Native.truncateAndClose(h, number(from)));
    }

    @Override
    public void close() {
        closeWith("close", Native::closeWriter);
    }

    /** Closes the writer with {@code call}, which gets the handle the writer gives up and frees it. */
    private void closeWith(String operation, Call call) {
        raiseClose();
        synchronized (this) {
            unchecked(call, closing(operation));
        }
    }

    /**
     * Ends a wait for upload capacity of a call that holds this writer's monitor, so that a
     * close from another thread does not wait behind it; takes no monitor of the writer's.
     */
    private void raiseClose() {
        synchronized (signalLock) {
            if (closeSignal != 0) {
                Native.raiseClose(closeSignal);
            }
        }
    }

    /** Frees the close signal; under the writer's monitor, once its handle is given up. */
    private void freeCloseSignal() {
        synchronized (signalLock) {
            Native.freeCloseSignal(closeSignal);
            closeSignal = 0;
        }
    }

    /**
     * Marks the writer closed and gives up its handle (the native call that follows frees it).
     * Buffered changes are dropped: they belong to the open change set, which a close releases.
     */
    private long closing(String operation) {
        if (closed) {
            throw new IllegalStateException("dstl: writer " + name + " is already closed (" + operation + ")");
        }
        closed = true;
        clearBatch();
        long writer = handle;
        handle = 0;
        freeCloseSignal();
        storage.forget(this);
        return writer;
    }

    /** Frees the native writer of a task that never closed it (at storage close). */
    synchronized void free() {
        if (handle == 0) {
            return;
        }
        closed = true;
        long writer = handle;
        handle = 0;
        freeCloseSignal();
        try {
            Native.closeWriter(writer);
        } catch (IOException | RuntimeException e) {
            LOG.warn("dstl: closing writer {} at storage close failed", name, e);
        }
    }

    private long open(String operation) {
        if (handle == 0) {
            throw new IllegalStateException("dstl: writer " + name + " is closed (" + operation + ")");
        }
        return handle;
    }

    private long number(SequenceNumber sqn) {
        Objects.requireNonNull(sqn, "sequence number");
        if (sqn instanceof SequenceNumber.GenericSequenceNumber) {
            return ((SequenceNumber.GenericSequenceNumber) sqn).number;
        }
        throw new IllegalArgumentException(
                "dstl: writer " + name + ": unsupported sequence number " + sqn + " (" + sqn.getClass() + ")");
    }

    @Override
    public String toString() {
        return "DstlChangelogWriter{" + name + ", " + range + "}";
    }
}
