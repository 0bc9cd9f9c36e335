//! The host's error type.

use std::sync::Arc;

use dstl_proto::types::WriterError;

pub use crate::sandbox::TrapKind;

/// Everything the host API can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The writer rejected a call or a persist failed; the message names the values.
    #[error("writer {writer}: {source}")]
    Writer {
        /// The writer's name.
        writer: String,
        /// What the writer said.
        #[source]
        source: WriterError,
    },
    /// The writer's sandbox trapped (now or earlier); the writer is unusable, the others
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
    /// A bad argument given to the host API itself (a writer name, a key-group range, a
    /// memory limit above the storage's); the message names the value.
    #[error("{0}")]
    InvalidArgument(String),
    /// Configuration rejected.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The storage (or a component) could not be set up: a directory, the object store,
    /// the I/O runtime, the writer component.
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
    /// The writer error inside, if this is one.
    pub fn writer_error(&self) -> Option<&WriterError> {
        match self {
            Error::Writer { source, .. } => Some(source),
            _ => None,
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
