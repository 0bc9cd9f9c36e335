//! The host's error type.

use std::sync::Arc;

use dstl_proto::error::{UploadFailure, WriterError};

pub use crate::sandbox::TrapKind;

/// Everything the host API can fail with.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A [`crate::Writer`] method was called against the writer's rules (an append after
    /// close, a persist from a truncated or not yet appended sequence number, a key
    /// group outside the writer's range, ...), or a persist failed because an upload of
    /// its change sets failed; [`WriterError`] says which, and the message names the
    /// values.
    #[error("writer {writer}: {}", writer_words(source, upload))]
    Writer {
        /// The writer's name.
        writer: String,
        /// What the writer said.
        source: WriterError,
        /// Why the upload task failed that `source` cites as its cause
        /// ([`WriterError::AlreadyFailed`]), while the writer remembers it (its most recent
        /// failures): its words stand in the message where Flink's have the cause, and it
        /// is this error's [`std::error::Error::source`] (the writer's error is in the
        /// message already).
        #[source]
        upload: Option<crate::upload::UploadError>,
    },
    /// A persist failed because the upload of one of its change sets failed for good
    /// (after the retry policy's attempts), or the uploader refused it (the storage or
    /// the writer was closing). [`crate::UploadError`] says which, with the store's I/O
    /// error where there is one ([`crate::UploadError::io_error_kind`], e.g.
    /// `StorageFull` for a full disk). A later persist of the same range fails with
    /// [`WriterError::AlreadyFailed`].
    #[error("writer {writer}: {}", upload_words(failure, source))]
    Upload {
        /// The writer's name.
        writer: String,
        /// What the writer reported: for a refused upload the change sets it held.
        failure: UploadFailure,
        /// Why the upload failed.
        #[source]
        source: crate::upload::UploadError,
    },
    /// The writer's sandbox trapped during this call or an earlier one (CPU deadline,
    /// memory cap, guest panic, guest fault: [`TrapKind`]); every call of that writer and
    /// every persist it had pending fail with this from then on, while the other writers
    /// carry on.
    #[error("writer {writer} failed: its sandbox trapped: {cause}")]
    Trapped {
        /// The writer's name.
        writer: String,
        /// What made it trap.
        kind: TrapKind,
        /// The trap and anything the guest printed.
        cause: String,
    },
    /// The persist's snapshot was not acknowledged because the storage's lease on its job
    /// lapsed: it was not refreshed for 5 minutes (the process was stopped or the machine
    /// suspended that long, or the lease's store was unreachable), so `dstl gc` may have
    /// collected the job's files by then. A persist naming a file written before the
    /// lapse, or completing during it, fails with this; a checkpoint taken after the task
    /// restarts uploads afresh. See README's guarantees.
    #[error("writer {writer}: {reason}")]
    LeaseLapsed {
        /// The writer's name.
        writer: String,
        /// Which of the two cases, in words.
        reason: String,
    },
    /// [`crate::ChangelogStorage::create_writer`] on a storage that was closed.
    #[error("cannot create writer {writer}: the storage is closed")]
    StorageClosed {
        /// The name of the writer that was not created.
        writer: String,
    },
    /// A bad argument given to the host API itself, rejected before any writer sees it:
    /// a writer name that is empty, longer than 256 characters or holds control
    /// characters, a key-group range with `start < 0` or `start > end`, or a per-writer
    /// memory limit above the storage's. The message names the value.
    #[error("{0}")]
    InvalidArgument(String),
    /// [`crate::ChangelogStorage::open`] found the configuration inconsistent (e.g. a
    /// batch size threshold above the in-flight limit).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// [`crate::ChangelogStorage::open`] (or
    /// [`crate::ChangelogStorage::compile_component`]) could not set something up: the
    /// changelog or local-copy directory cannot be created, the object store client
    /// cannot be built, a runtime or thread cannot start, or the writer component does
    /// not compile or does not implement the WIT world.
    #[error("{context}: {source}")]
    Setup {
        /// What was being set up.
        context: String,
        /// Why it failed.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

/// A wasmtime error, as text with its chain (wasmtime's error type is not a
/// `std::error::Error`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SandboxError(String);

impl Error {
    /// What [`Error::Setup`] failed with, for downcasting to the typed error (e.g.
    /// [`crate::S3Error`], `std::io::Error`), as `std::io::Error::get_ref` does; `None`
    /// for other variants. (Walking [`std::error::Error::source`] skips this level: the
    /// cause is shared through an `Arc`, whose own `source` is its content's.)
    pub fn setup_cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::Setup { source, .. } => Some(&**source),
            _ => None,
        }
    }

    /// What a writer's error says after the writer's name (`writer NAME: ...`), in the
    /// words every host prints: for [`Error::Writer`] and [`Error::Upload`], dstl-proto's
    /// words with the uploader's in place of a failed task's id; `None` for the others.
    pub fn writer_detail(&self) -> Option<String> {
        match self {
            Error::Writer { source, upload, .. } => Some(writer_words(source, upload)),
            Error::Upload {
                failure, source, ..
            } => Some(upload_words(failure, source)),
            _ => None,
        }
    }

    /// The writer error inside, if this is one.
    pub fn writer_error(&self) -> Option<&WriterError> {
        match self {
            Error::Writer { source, .. } => Some(source),
            _ => None,
        }
    }

    /// What a writer's guest error means for its caller: an upload failure the writer
    /// reported keeps the uploader's typed cause (the refusal it carries, or `upload`:
    /// why the failed task it names failed, if the host knows); any other is the writer's
    /// own error, with `upload` the cause of an earlier failure it cites.
    pub(crate) fn from_guest(
        writer: &str,
        source: WriterError,
        upload: Option<crate::upload::UploadError>,
    ) -> Self {
        let writer = writer.to_string();
        match (source, upload) {
            (WriterError::UploadFailed(UploadFailure::Refused(refused)), _) => Error::Upload {
                writer,
                source: refused.refusal.into(),
                failure: UploadFailure::Refused(refused),
            },
            (WriterError::UploadFailed(failure), Some(source)) => Error::Upload {
                writer,
                failure,
                source,
            },
            (source, upload) => Error::Writer {
                writer,
                source,
                upload,
            },
        }
    }

    /// The error of a writer the host dropped: for a call after the drop, and for the
    /// persists it had pending.
    pub(crate) fn dropped(writer: &str) -> Self {
        Error::Writer {
            writer: writer.to_string(),
            source: WriterError::Closed(dstl_proto::error::Closed::Dropped),
            upload: None,
        }
    }

    pub(crate) fn setup(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Setup {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn sandbox_setup(context: &str, error: &wasmtime::Error) -> Self {
        Self::setup(context, SandboxError(format!("{error:#}")))
    }
}

/// `error` and its causes as one line, joined by `: `, leaving out a cause whose text
/// is already part of the line: many errors print their source in their own message,
/// and `{:#}` would then say it twice. For messages that leave the process (the CLI's
/// last line, an exception in a JVM).
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A writer's error in its words, with `upload` the uploader's for the failed task it cites.
fn writer_words(source: &WriterError, upload: &Option<crate::upload::UploadError>) -> String {
    source.describe(upload.as_ref().map(ToString::to_string).as_deref())
}

/// A failed upload in the writer's words, with the uploader's for a task that failed.
fn upload_words(failure: &UploadFailure, source: &crate::upload::UploadError) -> String {
    failure.describe(Some(&source.to_string()))
}

#[cfg(test)]
mod tests {
    use dstl_proto::error::{AlreadyFailed, FailedTask};

    use super::*;
    use crate::upload::UploadError;

    /// A persist citing an earlier failed upload says why in the store's words, once: the
    /// uploader's error is the cause in the chain, the writer's (with the task's id) is
    /// not, so [`describe`] does not repeat the message.
    #[test]
    fn an_already_failed_persist_names_the_uploaders_cause_once() {
        let error = Error::from_guest(
            "w",
            WriterError::AlreadyFailed(AlreadyFailed {
                failed: 2,
                cause: UploadFailure::Failed(FailedTask { task: 5 }),
            }),
            Some(UploadError::Abandoned),
        );
        let words = "The upload for 2 has already failed previously (cause: the changelog \
                     storage was closed while the upload was still running; it was abandoned)";
        assert_eq!(error.to_string(), format!("writer w: {words}"));
        assert_eq!(error.writer_detail().as_deref(), Some(words));
        let source = std::error::Error::source(&error).expect("the upload's error");
        assert!(source.downcast_ref::<UploadError>().is_some(), "{source:?}");
        assert_eq!(describe(&error), format!("writer w: {words}"));
    }

    /// Without the uploader's error (forgotten, or a guest naming a task that never
    /// failed), the message names the task.
    #[test]
    fn a_failed_task_the_host_does_not_know_is_named_by_its_id() {
        let error = Error::from_guest(
            "w",
            WriterError::UploadFailed(UploadFailure::Failed(FailedTask { task: 5 })),
            None,
        );
        assert_eq!(error.to_string(), "writer w: upload task 5 failed");
        assert!(std::error::Error::source(&error).is_none());
    }
}
