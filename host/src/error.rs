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
        /// What made it trap.
        kind: TrapKind,
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

/// Why a writer's sandbox trapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrapKind {
    /// A call used up its guest time (`dstl.writer.call-timeout`) and was interrupted.
    Deadline,
    /// The guest's memory would have grown past its cap (`dstl.writer.memory-limit`).
    MemoryLimit,
    /// The guest panicked or aborted (its message, if it printed one, is in the cause).
    GuestPanic,
    /// The guest asked the host for something it may not have: to release, stop tracking
    /// or register a file it does not hold.
    GuestFault,
    /// Any other trap (a component that does not instantiate, an invalid call).
    Other,
}

impl TrapKind {
    /// Classifies a wasmtime error.
    pub(crate) fn of(error: &wasmtime::Error) -> Self {
        if error.downcast_ref::<crate::writer::GuestFault>().is_some() {
            return TrapKind::GuestFault;
        }
        match error.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::Interrupt) => return TrapKind::Deadline,
            Some(wasmtime::Trap::UnreachableCodeReached) => return TrapKind::GuestPanic,
            _ => {}
        }
        if format!("{error:#}").contains("forcing trap when growing memory") {
            TrapKind::MemoryLimit
        } else {
            TrapKind::Other
        }
    }
}
