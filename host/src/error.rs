//! The host's error type.

use dstl_guest::types::WriterError;

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
        /// The trap and anything the guest printed.
        cause: String,
    },
    /// A bad argument given to the host API itself.
    #[error("{0}")]
    InvalidArgument(String),
    /// Configuration rejected.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The storage could not be opened.
    #[error("{0}")]
    Setup(String),
}

impl Error {
    /// The writer error inside, if this is one.
    pub fn writer_error(&self) -> Option<&WriterError> {
        match self {
            Error::Writer { source, .. } => Some(source),
            _ => None,
        }
    }
}
