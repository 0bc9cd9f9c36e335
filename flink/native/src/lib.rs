//! The native half of dstl's Flink plugin: the JNI entry points of the Java class
//! `io.dstl.flink.Native`, each a thin call into the dstl host (`dstl::ChangelogStorage`,
//! `dstl::Writer`).
//!
//! Rules every entry point keeps:
//! - **No panic crosses JNI.** Each body runs under `catch_unwind`; an error or a panic
//!   becomes a Java exception naming the writer (or storage) and the operation.
//! - **No native thread calls into Java.** Persist outcomes are queued per storage and
//!   taken by a Java daemon thread that blocks in [`nextCompletion`]; dstl's own threads
//!   are never attached to the JVM, so none can linger as a non-daemon Java thread. The
//!   one call into Java is the Java writer's own `frame`, on its thread, inside its
//!   native call (`appendFramed`, `persistFramed`).
//! - **Handles are boxed pointers** owned by the Java objects that hold them: a storage
//!   from `openStorage` until `freeStorage`, a writer from `createWriter` until
//!   `truncateAndClose`/`closeWriter`/`freeWriter`. The Java side never uses one after
//!   freeing it (its writer is confined to the task thread; see `DstlWriter.java`).

/// Declares JNI entry points of the Java class `io.dstl.flink.<class>`: each
/// `fn name(env, class, args..) -> R { .. }` is exported as
/// `Java_io_dstl_flink_<class>_<name>` with the JNI environment and class first, and its
/// body sees `OPERATION`, the name, for the errors it raises. Every body goes through
/// [`entry`] or one of its forms, so no panic crosses JNI.
macro_rules! jni_entry_points {
    ($class:literal: $(
        $(#[$attr:meta])*
        fn $name:ident($env:ident, $jclass:ident $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?
        $body:block
    )*) => {$(
        $(#[$attr])*
        #[unsafe(export_name = concat!("Java_io_dstl_flink_", $class, "_", stringify!($name)))]
        #[allow(non_snake_case)]
        pub extern "system" fn $name(
            $env: *mut jni_sys::JNIEnv,
            $jclass: jni_sys::jclass,
            $($arg: $ty),*
        ) $(-> $ret)? {
            #[allow(dead_code)]
            const OPERATION: &str = stringify!($name);
            $body
        }
    )*};
}

mod completion;
mod jni;
mod metrics;
mod object_files;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use dstl::{ChangelogStorage, Config, Error, KeyGroupRange, Writer, WriterError};
use jni_sys::{JNIEnv, jboolean, jbyteArray, jclass, jint, jlong, jlongArray, jobject};

use crate::completion::Completions;
use crate::jni::Env;

/// One job's storage on this TaskManager, with the queue its persists complete into.
struct StorageHandle {
    /// Taken by `closeStorage`.
    storage: Mutex<Option<ChangelogStorage>>,
    availability: dstl::Availability,
    completions: Completions,
}

/// One Flink operator's writer and the Java buffers of its batches.
struct WriterHandle {
    writer: Writer,
    completions: Completions,
    /// Key group per change of a batch (native-order `int`s), from the Java writer's
    /// direct buffer.
    key_groups: (*mut u8, usize),
    /// Length per change (native-order `int`s).
    lengths: (*mut u8, usize),
    /// Where each change's value goes in the framed batch (native-order `int`s), written
    /// here for the Java writer's `frame`.
    offsets: (*mut u8, usize),
    /// Where the writer's hand-off budget is published after every call that changes it
    /// ([`WriterHandle::budgeted`]), for the Java writer to count down.
    budget: (*mut u8, usize),
    /// The Java writer's `frame(ByteBuffer)` (a `jmethodID`), looked up by the first batch.
    frame: OnceLock<usize>,
}

/// Bytes of a published budget: `bytes` (a native-order `long`), `changes` and `aloneAt`
/// (native-order `int`s), as `DstlChangelogWriter.java` reads them.
const BUDGET_BYTES: usize = 16;

/// Why the Java writer did not write its batch's values.
enum Unframed {
    /// `frame` threw this (a local reference of the call, no longer pending).
    Thrown(jni_sys::jthrowable),
    /// The framer has no `frame(ByteBuffer)` method.
    NoMethod,
    /// The framed batch, this many bytes, is more than a `ByteBuffer` covers.
    TooLarge(usize),
    /// The VM made no direct buffer over the batch (and threw nothing).
    NoBuffer,
}

impl WriterHandle {
    /// The key groups and lengths of the first `count` changes of the Java writer's batch.
    fn columns(&self, count: jint) -> Result<(&[i32], &[u32]), Thrown> {
        let count = count.max(0) as usize;
        let capacity = self.key_groups.1.min(self.lengths.1).min(self.offsets.1) / 4;
        if count > capacity {
            return Err(Thrown::argument(format!(
                "dstl: writer {}: a batch of {count} changes exceeds its buffers ({capacity})",
                self.writer.name()
            )));
        }
        // SAFETY: the Java writer owns these direct buffers for the writer's lifetime, does
        // not touch them during a native call, and allocated them aligned (direct buffers
        // are page-aligned); the count was checked against their capacities.
        Ok(unsafe {
            (
                std::slice::from_raw_parts(self.key_groups.0 as *const i32, count),
                std::slice::from_raw_parts(self.lengths.0 as *const u32, count),
            )
        })
    }

    /// Runs `call`, one that may change the hand-off budget (an append, a rollover, a
    /// persist), then publishes the budget it leaves, whether the call failed or not.
    fn budgeted<R>(&self, call: impl FnOnce(&Writer) -> R) -> R {
        let result = call(&self.writer);
        self.publish_budget();
        result
    }

    /// Writes the writer's hand-off budget ([`Writer::budget`]) into the Java writer's
    /// budget buffer: how much it may pack before it hands the batch over, so a
    /// pre-emptive persist happens exactly where it would without packing. Java keeps no
    /// threshold of its own.
    fn publish_budget(&self) {
        let budget = self.writer.budget();
        let mut out = [0u8; BUDGET_BYTES];
        out[..8].copy_from_slice(&(budget.bytes.min(i64::MAX as u64) as i64).to_ne_bytes());
        out[8..12].copy_from_slice(&(budget.changes.min(i32::MAX as u32) as i32).to_ne_bytes());
        out[12..].copy_from_slice(&(budget.alone_at.min(i32::MAX as u32) as i32).to_ne_bytes());
        // SAFETY: the Java writer owns this direct buffer for the writer's lifetime and
        // reads it only between native calls; its capacity was checked at creation.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), self.budget.0, BUDGET_BYTES) };
    }

    /// Has the Java writer `framer` write its batch's values into `out`, the bytes of the
    /// sandbox the batch is lowered into, at `offsets`: publishes the offsets into its
    /// buffer and calls back its `frame(ByteBuffer)`; why not, if it did not.
    fn frame(
        &self,
        env: Env,
        framer: jobject,
        out: &mut [u8],
        offsets: &[u32],
    ) -> Result<(), Unframed> {
        if out.len() > i32::MAX as usize || offsets.len() * 4 > self.offsets.1 {
            return Err(Unframed::TooLarge(out.len()));
        }
        // SAFETY: the Java writer owns this direct buffer for the writer's lifetime and
        // reads it only in `frame`, during this call; the length was checked above.
        unsafe {
            std::ptr::copy_nonoverlapping(
                offsets.as_ptr().cast::<u8>(),
                self.offsets.0,
                offsets.len() * 4,
            )
        };
        let method = match self.frame.get() {
            Some(&method) => method as jni_sys::jmethodID,
            None => {
                let method = env
                    .method(framer, c"frame", c"(Ljava/nio/ByteBuffer;)V")
                    .ok_or(Unframed::NoMethod)?;
                self.frame.get_or_init(|| method as usize);
                method
            }
        };
        env.call_with_buffer(framer, method, out)
            .map_err(|thrown| thrown.map_or(Unframed::NoBuffer, Unframed::Thrown))
    }

    /// Runs `call` on the first `count` changes of the Java writer's batch, with a
    /// `place` that has the Java writer `framer` write their values, then answers as the
    /// entry point: an exception `frame` threw is rethrown as it was.
    fn placed_call<R>(
        &self,
        env: Env,
        framer: jobject,
        count: jint,
        call: impl FnOnce(&Writer, &[i32], &[u32], &mut PlaceFn<'_>) -> Result<R, Error>,
    ) -> Result<Option<R>, Thrown> {
        if framer.is_null() {
            return Err(Thrown::argument(format!(
                "dstl: writer {}: no Java writer to write the batch (null)",
                self.writer.name()
            )));
        }
        let (key_groups, lengths) = self.columns(count)?;
        let mut unframed = None;
        let result = self.budgeted(|writer| {
            call(writer, key_groups, lengths, &mut |out, offsets| match self
                .frame(env, framer, out, offsets)
            {
                Ok(()) => true,
                Err(why) => {
                    unframed = Some(why);
                    false
                }
            })
        });
        match unframed {
            Some(Unframed::Thrown(thrown)) => {
                env.rethrow(thrown);
                Ok(None)
            }
            Some(Unframed::NoMethod) => Err(Thrown::io(format!(
                "dstl: writer {}: the Java writer has no frame(ByteBuffer) method",
                self.writer.name()
            ))),
            Some(Unframed::NoBuffer) => Err(Thrown::io(format!(
                "dstl: writer {}: the JVM made no direct ByteBuffer over the batch",
                self.writer.name()
            ))),
            Some(Unframed::TooLarge(len)) => Err(Thrown::argument(format!(
                "dstl: writer {}: a batch of {len} bytes does not fit a ByteBuffer",
                self.writer.name()
            ))),
            None => Ok(Some(result?)),
        }
    }
}

/// A caller's writing of a batch's values, as [`Writer::append_placed`] takes it.
type PlaceFn<'a> = dyn FnMut(&mut [u8], &[u32]) -> bool + 'a;

/// An error for Java: the exception class and its message.
pub(crate) struct Thrown {
    pub(crate) class: &'static str,
    pub(crate) message: String,
}

impl Thrown {
    pub(crate) fn io(message: impl Into<String>) -> Self {
        Self {
            class: "java/io/IOException",
            message: message.into(),
        }
    }

    pub(crate) fn argument(message: impl Into<String>) -> Self {
        Self {
            class: "java/lang/IllegalArgumentException",
            message: message.into(),
        }
    }
}

impl From<Error> for Thrown {
    /// Flink's writer throws `IllegalStateException` for calls on a closed writer,
    /// `IllegalArgumentException` for bad sequence numbers and arguments, and
    /// `IOException` for failed uploads; dstl's errors map onto the same classes.
    fn from(error: Error) -> Self {
        let class = match &error {
            Error::Writer { source, .. } => match source {
                WriterError::Closed(_) => "java/lang/IllegalStateException",
                WriterError::Truncated(_)
                | WriterError::NotYetAppended(_)
                | WriterError::InvalidRange(_)
                | WriterError::InvalidArgument(_) => "java/lang/IllegalArgumentException",
                _ => "java/io/IOException",
            },
            Error::InvalidArgument(_) | Error::Config(_) => "java/lang/IllegalArgumentException",
            Error::StorageClosed { .. } => "java/lang/IllegalStateException",
            _ => "java/io/IOException",
        };
        Self {
            class,
            message: format!("dstl: {}", dstl::describe(&error)),
        }
    }
}

/// Runs the body of the entry point `operation`: an `Err` or a panic becomes a pending
/// Java exception and the call returns `fallback`.
pub(crate) fn entry<R>(
    env: *mut JNIEnv,
    operation: &str,
    fallback: R,
    body: impl FnOnce(Env) -> Result<R, Thrown>,
) -> R {
    entry_for(env, || operation.into(), fallback, body)
}

/// [`entry`] for a call about `what` (a writer, named only if the call fails).
fn entry_for<R>(
    env: *mut JNIEnv,
    what: impl FnOnce() -> String,
    fallback: R,
    body: impl FnOnce(Env) -> Result<R, Thrown>,
) -> R {
    let env = Env(env);
    match catch_unwind(AssertUnwindSafe(|| body(env))) {
        Ok(Ok(value)) => value,
        Ok(Err(thrown)) => {
            env.throw(thrown.class, &thrown.message);
            fallback
        }
        Err(panic) => {
            let cause = panic_message(&*panic);
            // Whatever the panic left behind was dropped while unwinding inside
            // `catch_unwind`; naming the call cannot panic again.
            let what = catch_unwind(AssertUnwindSafe(what)).unwrap_or_else(|_| "a call".into());
            env.throw(
                "java/io/IOException",
                &format!("dstl: internal error in {what}: {cause}"),
            );
            fallback
        }
    }
}

/// The message a panic was raised with.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// An entry point of a writer call: [`entry`], with the calling Java thread's interrupt
/// status consulted while the call waits for upload capacity ([`dstl::interruptible`]),
/// so that a task cancelled while back-pressured (Flink interrupts its thread) is not
/// held in dstl until the storage closes.
fn writer_entry<R>(
    env: *mut JNIEnv,
    class: jclass,
    handle: jlong,
    fallback: R,
    body: impl FnOnce(Env) -> Result<R, Thrown>,
) -> R {
    entry_for(
        env,
        || writer_name(handle),
        fallback,
        |env| {
            let interrupted = || env.thread_interrupted(class);
            dstl::interruptible(&interrupted, || body(env))
        },
    )
}

/// Takes back the writer a handle owns, for the calls that close it and free the handle:
/// `body` runs under [`entry`], and the writer is dropped afterwards, outside it, in a
/// `catch_unwind` of its own. Dropping it inside would make a panic of `body` drop it
/// while unwinding, where a second panic (in the writer's destructor) aborts the process.
fn closing_entry(
    env: *mut JNIEnv,
    handle: jlong,
    body: impl FnOnce(&WriterHandle) -> Result<(), Thrown>,
) {
    if handle == 0 {
        Env(env).throw(
            "java/lang/IllegalStateException",
            "dstl: the writer is already closed",
        );
        return;
    }
    // Named before the body runs: naming it afterwards could meet a half-closed writer.
    let name = writer_name(handle);
    // SAFETY: the handle came from `createWriter`; the Java writer gives it up (sets its
    // field to 0) before this call, so it is freed exactly once.
    let owned = unsafe { Box::from_raw(handle as *mut WriterHandle) };
    entry_for(env, || name.clone(), (), |_| body(&owned));
    if let Err(panic) = catch_unwind(AssertUnwindSafe(move || drop(owned))) {
        tracing::error!(writer = %name, cause = %panic_message(&*panic), "dropping a closed writer panicked");
    }
}

/// Frees a boxed handle of type `T` that its Java owner gives up (0: nothing to free),
/// as the entry point `operation`. Only for the entry points that free a handle: a
/// non-zero `handle` came from `Box::into_raw` of a `T`, and its owner passes it here once
/// and never uses it again (each such entry point says why).
pub(crate) fn free_boxed<T>(env: *mut JNIEnv, operation: &'static str, handle: jlong) {
    entry(env, operation, (), |_| {
        if handle != 0 {
            // SAFETY: the handle is a `Box<T>` its owner gives up (see above).
            drop(unsafe { Box::from_raw(handle as *mut T) });
        }
        Ok(())
    })
}

/// The storage behind a handle from `openStorage`.
///
/// # Safety
/// `handle` came from `openStorage` and was not freed yet.
unsafe fn storage<'a>(handle: jlong) -> &'a StorageHandle {
    unsafe { &*(handle as *const StorageHandle) }
}

/// The writer behind a handle from `createWriter`.
///
/// # Safety
/// `handle` came from `createWriter` and was not freed yet.
unsafe fn writer<'a>(handle: jlong) -> &'a WriterHandle {
    unsafe { &*(handle as *const WriterHandle) }
}

fn writer_name(handle: jlong) -> String {
    // SAFETY: only called from entry points given a live writer handle.
    let name = unsafe { writer(handle) }.writer.name().to_string();
    format!("writer {name}")
}

/// A configuration from the `key\0value\0` pairs of a Java `byte[]` (the keys the Java
/// side collected); an unknown key or a bad value fails naming it.
pub(crate) fn configuration(env: Env, settings: jbyteArray) -> Result<Config, Thrown> {
    let text = String::from_utf8(env.bytes(settings))
        .map_err(|_| Thrown::argument("dstl: the configuration is not UTF-8"))?;
    let mut parts = text.split('\0');
    let mut config = Config::default();
    while let (Some(key), Some(value)) = (parts.next(), parts.next()) {
        config
            .set(key, value)
            .map_err(|e| Thrown::argument(format!("dstl: {}", dstl::describe(&e))))?;
    }
    Ok(config)
}

jni_entry_points! { "Native":
    /// `long openStorage(byte[] settings)`: opens a storage from `key\0value\0` pairs (the
    /// configuration keys the Java side collected; an unknown key fails with its name).
    fn openStorage(env, _class, settings: jbyteArray) -> jlong {
        entry(env, OPERATION, 0, |env| {
            let config = configuration(env, settings)?;
            let storage = ChangelogStorage::open(config)?;
            let availability = storage.availability();
            let completions = Completions::start().map_err(|e| {
                Thrown::io(format!("dstl: cannot start the completion thread: {e}"))
            })?;
            let handle = Box::new(StorageHandle {
                storage: Mutex::new(Some(storage)),
                availability,
                completions,
            });
            Ok(Box::into_raw(handle) as jlong)
        })
    }

    /// `void closeStorage(long storage)`: closes the storage (uploads still running get
    /// their grace, see `ChangelogStorage::close`) and ends `nextCompletion`'s wait once the
    /// persists still pending have completed. The handle stays valid for `freeStorage`.
    fn closeStorage(env, _class, handle: jlong) {
        entry(env, OPERATION, (), |_| {
            // SAFETY: the Java storage passes its live handle.
            let storage = unsafe { storage(handle) };
            let taken = storage
                .storage
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            // The completion queue closes whatever closing the storage does, so the
            // Java completion thread always ends and the storage can be freed.
            let closed = taken.map(|open| catch_unwind(AssertUnwindSafe(move || open.close())));
            storage.completions.close();
            if let Some(Err(panic)) = closed {
                return Err(Thrown::io(format!(
                    "dstl: internal error while closing the storage: {}",
                    panic_message(&*panic)
                )));
            }
            Ok(())
        })
    }

    /// `void freeStorage(long storage)`: frees a closed storage's handle, after the Java
    /// completion thread has left `nextCompletion`.
    fn freeStorage(env, _class, handle: jlong) {
        // The handle came from `openStorage`; the Java storage frees it once.
        free_boxed::<StorageHandle>(env, OPERATION, handle)
    }

    /// `byte[] nextCompletion(long storage)`: blocks until a persist completes and returns
    /// its outcome (the format `Completion.java` reads), or null once the storage is closed
    /// and every pending persist has been delivered.
    fn nextCompletion(env, _class, handle: jlong) -> jbyteArray {
        entry(env, OPERATION, std::ptr::null_mut(), |env| {
            // SAFETY: the completion thread holds the handle until it returns null.
            let storage = unsafe { storage(handle) };
            Ok(match storage.completions.next() {
                Some(bytes) => env.new_bytes(&bytes),
                None => std::ptr::null_mut(),
            })
        })
    }

    /// `boolean awaitAvailable(long storage, long timeoutMs)`: whether uploads are accepted
    /// without blocking, after waiting up to `timeoutMs` for that.
    fn awaitAvailable(env, _class, handle: jlong, timeout_ms: jlong) -> jboolean {
        entry(env, OPERATION, true, |_| {
            // SAFETY: live handle.
            let storage = unsafe { storage(handle) };
            let mut availability = storage.availability.clone();
            if availability.is_available() || timeout_ms <= 0 {
                return Ok(availability.is_available());
            }
            let timeout = Duration::from_millis(timeout_ms as u64);
            Ok(storage
                .completions
                // The timer is created inside the runtime: it needs its time driver.
                .block_on(async { tokio::time::timeout(timeout, availability.available()).await })
                .is_ok())
        })
    }

    /// `long batchLimits()`: what a Java writer's batch holds at most, as `changes << 32 |
    /// aloneAt` ([`dstl::Budget::MOST`]): `changes` changes; a value of `aloneAt` bytes or
    /// more goes in a batch of its own.
    fn batchLimits(env, _class) -> jlong {
        entry(env, OPERATION, 0, |_| {
            let most = dstl::Budget::MOST;
            Ok((i64::from(most.changes) << 32) | i64::from(most.alone_at))
        })
    }

    /// `byte[] metricNames()`: the metrics `metrics` reports, a UTF-8 line `KIND NAME` each,
    /// in its order (`crate::metrics`).
    fn metricNames(env, _class) -> jbyteArray {
        entry(env, OPERATION, std::ptr::null_mut(), |env| {
            Ok(env.new_bytes(crate::metrics::names().as_bytes()))
        })
    }

    /// `long[] metrics(long storage)`: the storage's upload metrics, in the order
    /// `metricNames` lists them.
    fn metrics(env, _class, handle: jlong) -> jlongArray {
        entry(env, OPERATION, std::ptr::null_mut(), |env| {
            // SAFETY: live handle.
            let storage = unsafe { storage(handle) };
            let guard = storage.storage.lock().unwrap_or_else(|e| e.into_inner());
            let Some(open) = guard.as_ref() else {
                return Ok(std::ptr::null_mut());
            };
            let values = crate::metrics::values(&open.metrics());
            Ok(env.new_longs(&values))
        })
    }

    /// `long createWriter(long storage, byte[] name, int start, int end, ByteBuffer keyGroups,
    /// ByteBuffer lengths, ByteBuffer offsets, ByteBuffer budget)`: a new sandboxed writer for
    /// key groups `[start, end]` whose batches' key groups and lengths come from the first
    /// two direct buffers, whose values' offsets go into the third, and whose hand-off
    /// budget is published into `budget`.
    #[allow(clippy::too_many_arguments)]
    fn createWriter(
        env,
        class,
        handle: jlong,
        name: jbyteArray,
        start: jint,
        end: jint,
        key_groups: jobject,
        lengths: jobject,
        offsets: jobject,
        budget: jobject,
    ) -> jlong {
        entry(env, OPERATION, 0, |env| {
            // SAFETY: live handle.
            let storage = unsafe { storage(handle) };
            let name = String::from_utf8_lossy(&env.bytes(name)).into_owned();
            let direct = |buffer| {
                env.direct_buffer(buffer).ok_or_else(|| {
                    Thrown::argument(format!(
                        "dstl: writer {name}: the batch buffers must be direct ByteBuffers"
                    ))
                })
            };
            let (key_groups, lengths, offsets, budget) = (
                direct(key_groups)?,
                direct(lengths)?,
                direct(offsets)?,
                direct(budget)?,
            );
            if budget.1 < BUDGET_BYTES {
                return Err(Thrown::argument(format!(
                    "dstl: writer {name}: the budget buffer holds {} bytes, not {BUDGET_BYTES}",
                    budget.1
                )));
            }
            let guard = storage.storage.lock().unwrap_or_else(|e| e.into_inner());
            // A closed storage refuses as a closed writer does: IllegalStateException.
            let closed = || {
                Thrown::from(Error::StorageClosed {
                    writer: name.clone(),
                })
            };
            let open = guard.as_ref().ok_or_else(closed)?;
            // A new sandbox may wait for a slot of the instance pool (sandboxes kept for
            // blocks on their way to a file); a cancelled task does not.
            let interrupted = || env.thread_interrupted(class);
            let writer = dstl::interruptible(&interrupted, || {
                open.create_writer(&name, KeyGroupRange { start, end })
            })?;
            drop(guard);
            let handle = WriterHandle {
                writer,
                completions: storage.completions.clone(),
                key_groups,
                lengths,
                offsets,
                budget,
                frame: OnceLock::new(),
            };
            handle.publish_budget();
            Ok(Box::into_raw(Box::new(handle)) as jlong)
        })
    }

    /// `void appendFramed(long writer, DstlChangelogWriter framer, int count)`: appends the
    /// `count` changes of the Java writer's batch (key groups and lengths in its buffers),
    /// framed here, whose values it writes straight into the writer's sandbox when this
    /// call has it do so (`framer.frame(ByteBuffer)`, called back on the calling thread).
    fn appendFramed(env, class, handle: jlong, framer: jobject, count: jint) {
        writer_entry(env, class, handle, (), |env| {
            // SAFETY: live handle, used by its writer's task thread only.
            let w = unsafe { writer(handle) };
            w.placed_call(env, framer, count, |writer, key_groups, lengths, place| {
                writer.append_placed(key_groups, lengths, place)
            })?;
            Ok(())
        })
    }

    /// `void append(long writer, int keyGroup, byte[] value)`: one change on its own (the
    /// Java writer sends a key group outside its range this way, for the writer's error).
    fn append(env, class, handle: jlong, key_group: jint, value: jbyteArray) {
        writer_entry(env, class, handle, (), |env| {
            // SAFETY: live handle.
            let w = unsafe { writer(handle) };
            Ok(w.budgeted(|writer| {
                env.with_bytes(value, |value| {
                    writer.append_batch(&[key_group], &[value.len() as u32], value)
                })
            })?)
        })
    }

    /// `long nextSequenceNumber(long writer)`.
    fn nextSequenceNumber(env, class, handle: jlong) -> jlong {
        writer_entry(env, class, handle, -1, |_| {
            // SAFETY: live handle.
            let w = unsafe { writer(handle) };
            Ok(w.budgeted(Writer::next_sequence_number)? as jlong)
        })
    }

    /// `void persistFramed(long writer, DstlChangelogWriter framer, int count, long from,
    /// long checkpoint, long request)`: appends the Java writer's batch as `appendFramed`
    /// does and starts a persist, in one call into the writer; its outcome is delivered by
    /// `nextCompletion` under `request`.
    fn persistFramed(
        env, class, handle: jlong, framer: jobject, count: jint, from: jlong, checkpoint: jlong,
        request: jlong,
    ) {
        writer_entry(env, class, handle, (), |env| {
            // SAFETY: live handle.
            let w = unsafe { writer(handle) };
            let from = sequence(from)?;
            let future = w.placed_call(env, framer, count, |writer, key_groups, lengths, place| {
                writer.append_placed_and_persist(key_groups, lengths, place, from, checkpoint)
            })?;
            if let Some(future) = future {
                w.completions.deliver(request, future);
            }
            Ok(())
        })
    }

    /// `void truncate(long writer, long to)`.
    fn truncate(env, class, handle: jlong, to: jlong) {
        writer_entry(env, class, handle, (), |_| {
            // SAFETY: live handle.
            Ok(unsafe { writer(handle) }.writer.truncate(sequence(to)?)?)
        })
    }

    /// `void confirm(long writer, long from, long to, long checkpoint)`.
    fn confirm(env, class, handle: jlong, from: jlong, to: jlong, checkpoint: jlong) {
        checkpoint_call(env, class, handle, [from, to, checkpoint], Writer::confirm)
    }

    /// `void reset(long writer, long from, long to, long checkpoint)`.
    fn reset(env, class, handle: jlong, from: jlong, to: jlong, checkpoint: jlong) {
        checkpoint_call(env, class, handle, [from, to, checkpoint], Writer::reset)
    }

    /// `void truncateAndClose(long writer, long from)`: releases change sets from `from` on,
    /// closes the writer and frees its handle (its sandbox goes back to the pool), even when
    /// the close itself failed.
    fn truncateAndClose(env, _class, handle: jlong, from: jlong) {
        closing_entry(env, handle, |w| {
            Ok(w.writer.truncate_and_close(sequence(from)?)?)
        })
    }

    /// `void closeWriter(long writer)`: closes the writer and frees its handle.
    fn closeWriter(env, _class, handle: jlong) {
        closing_entry(env, handle, |w| Ok(w.writer.close()?))
    }

    /// `long closeSignal(long writer)`: a handle that announces the writer's close from
    /// another thread (`raiseClose`), owned by the Java writer until `freeCloseSignal`. Flink's
    /// canceler closes a task's backend, and so its writers, before it interrupts the task
    /// thread; a task thread blocked for upload capacity holds the writer's monitor, which
    /// the close must take: raising the signal first ends that wait.
    fn closeSignal(env, _class, handle: jlong) -> jlong {
        entry_for(env, || writer_name(handle), 0, |_| {
            // SAFETY: live handle.
            let w = unsafe { writer(handle) };
            Ok(Box::into_raw(Box::new(w.writer.close_signal())) as jlong)
        })
    }

    /// `void raiseClose(long signal)`: marks the writer closing; a call of it waiting for
    /// upload capacity gives up at once. Never blocks; harmless after the writer closed.
    fn raiseClose(env, _class, signal: jlong) {
        entry(env, OPERATION, (), |_| {
            if signal != 0 {
                // SAFETY: a live handle from `closeSignal`; the Java writer frees it only
                // under the same lock it raises it under.
                unsafe { &*(signal as *const dstl::CloseSignal) }.raise();
            }
            Ok(())
        })
    }

    /// `void freeCloseSignal(long signal)`.
    fn freeCloseSignal(env, _class, signal: jlong) {
        // From `closeSignal`; the Java writer zeroes its field under the lock it frees it
        // under, so it is freed once.
        free_boxed::<dstl::CloseSignal>(env, OPERATION, signal)
    }

    /// `String failure(long writer)` as UTF-8: why the writer's sandbox trapped, or null.
    fn failure(env, _class, handle: jlong) -> jbyteArray {
        entry_for(env, || writer_name(handle), std::ptr::null_mut(), |env| {
            // SAFETY: live handle.
            let w = unsafe { writer(handle) };
            Ok(match w.writer.failure() {
                Some(cause) => env.new_bytes(cause.as_bytes()),
                None => std::ptr::null_mut(),
            })
        })
    }
}

fn sequence(value: jlong) -> Result<u64, Thrown> {
    u64::try_from(value)
        .map_err(|_| Thrown::argument(format!("dstl: sequence number {value} is negative")))
}

/// A writer call about the checkpoint `checkpoint` holding `[from, to)`.
fn checkpoint_call(
    env: *mut JNIEnv,
    class: jclass,
    handle: jlong,
    [from, to, checkpoint]: [jlong; 3],
    call: fn(&Writer, u64, u64, i64) -> Result<(), Error>,
) {
    writer_entry(env, class, handle, (), |_| {
        // SAFETY: live handle.
        let w = unsafe { writer(handle) };
        Ok(call(&w.writer, sequence(from)?, sequence(to)?, checkpoint)?)
    })
}

/// Fault injection for the plugin's tests, in a library built with the feature
/// `test-hooks` only (flink/test.sh builds one beside the plugin's); the Java class
/// `io.dstl.flink.TestHooks` exists only among the tests.
#[cfg(feature = "test-hooks")]
mod test_hooks {
    use super::*;

    jni_entry_points! { "TestHooks":
        /// `void panicInNextSchedule(long storage)`: the next upload a writer of the
        /// storage schedules panics inside the host, with the writer and the scheduler
        /// locked (see `ChangelogStorage::panic_in_next_schedule`).
        fn panicInNextSchedule(env, _class, handle: jlong) {
            entry(env, OPERATION, (), |_| {
                // SAFETY: the test passes a live storage handle.
                let storage = unsafe { storage(handle) };
                let guard = storage.storage.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(open) = guard.as_ref() {
                    open.panic_in_next_schedule();
                }
                Ok(())
            })
        }
    }
}
