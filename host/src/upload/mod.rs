//! The upload layer: batching of upload tasks across writers (`dstl_proto::batch`'s
//! decisions, driven by [`scheduler`]), the in-flight limit ([`throttle`]), retries with
//! timeouts ([`retry`]) and one upload attempt ([`attempt`]). It knows nothing of wasm or
//! writers: each task's outcome goes back to whoever submitted it through an
//! [`OutcomeSink`].

pub(crate) mod attempt;
pub(crate) mod block;
pub(crate) mod buffers;
pub(crate) mod retry;
pub(crate) mod scheduler;
pub(crate) mod throttle;

use dstl_proto::types::UploadResult;

pub(crate) use attempt::Uploader;
pub(crate) use block::Block;
pub(crate) use retry::AttemptError;
pub(crate) use scheduler::Scheduler;

/// An upload task as the host carries it: its blocks owned or lent.
pub(crate) type Task = dstl_proto::types::UploadTask<Block>;

/// What happened to one upload task, for the writer that submitted it.
#[derive(Debug)]
pub(crate) enum UploadOutcome {
    /// The task's change sets are in a file; one result per change set.
    Succeeded {
        task: u64,
        results: Vec<UploadResult>,
    },
    /// The task failed for good.
    Failed { task: u64, error: UploadError },
}

/// Receives the outcomes of the tasks it submitted: a writer's mailbox. Called from
/// upload threads; an implementation hands the outcome over without blocking on the
/// submitter's own calls.
pub(crate) trait OutcomeSink: Send + Sync {
    /// Takes one outcome.
    fn deliver(&self, outcome: UploadOutcome);
}

/// Why an upload task failed: persists whose change sets were in the task fail with
/// [`crate::Error::Upload`] carrying it, and a later persist of their range with
/// [`crate::Error::Writer`] citing it (the writer's guest knows only which task failed,
/// or the refusal, typed).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum UploadError {
    /// The last attempt the retry policy allowed failed (an I/O error of the store after
    /// `dstl.dfs.upload.max-attempts`, or an attempt that panicked).
    #[error("{}", dstl_proto::retry::failed_message(*attempts, *attempt, cause))]
    Failed {
        /// Attempts started.
        attempts: u32,
        /// The attempt that failed last.
        attempt: u32,
        /// Why it failed.
        #[source]
        cause: AttemptError,
    },
    /// The last attempt the retry policy allowed ran past `dstl.dfs.upload.timeout` (a
    /// store that hangs).
    #[error("{}", dstl_proto::retry::timed_out_message(*attempts, *attempt, *timeout))]
    TimedOut {
        /// Attempts started.
        attempts: u32,
        /// The attempt that timed out last.
        attempt: u32,
        /// The per-attempt timeout.
        timeout: std::time::Duration,
    },
    /// The task was not accepted: it was scheduled after
    /// [`crate::ChangelogStorage::close`] began (or its writer was waiting for in-flight
    /// capacity when it did), its writer was closed while it waited for capacity, or the
    /// waiting thread was interrupted (the check given to [`crate::interruptible`] said
    /// so, e.g. a cancelled task of a JVM).
    #[error("{0}")]
    Refused(#[from] dstl_proto::error::Refusal),
    /// The storage closed while the task waited in the queue for its batch.
    #[error("{}", dstl_proto::batch::Closed::BeforeUpload)]
    ClosedBeforeStart,
    /// The storage closed and stopped waiting for the task's running upload after the
    /// grace period of close (`max-attempts × timeout`, at least 5 s).
    #[error(
        "the changelog storage was closed while the upload was still running; it was abandoned"
    )]
    Abandoned,
}

impl UploadError {
    /// The store's I/O error behind the last failed attempt, if that is why the upload
    /// failed.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            UploadError::Failed { cause, .. } => cause.io_error(),
            _ => None,
        }
    }

    /// The kind of [`UploadError::io_error`]: e.g. `StorageFull` (ENOSPC) for a full
    /// disk, `PermissionDenied`, `NotFound` for a missing directory.
    pub fn io_error_kind(&self) -> Option<std::io::ErrorKind> {
        self.io_error().map(std::io::Error::kind)
    }
}
