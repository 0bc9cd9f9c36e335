//! Why a sandbox trapped, classified from wasmtime's error, with what the guest printed.

use std::time::Duration;

use super::context::{GuestFault, WriterCtx};

/// Why a writer's sandbox trapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrapKind {
    /// A call used up its CPU time (`dstl.writer.call-timeout`) and was interrupted.
    Deadline,
    /// The guest's memory would have grown past its cap (`dstl.writer.memory-limit`).
    MemoryLimit,
    /// The guest panicked or aborted (its message, if it printed one, is in the cause).
    GuestPanic,
    /// The guest asked the host for something it may not have or told it something
    /// false: to release, stop tracking or register a file it does not hold, to upload an
    /// empty task or blocks whose claimed sizes are not what they hold, or to hand the
    /// caller a snapshot naming change sets never delivered to it.
    GuestFault,
    /// Any other trap (a component that does not instantiate, an invalid call).
    Other,
    /// The host panicked during a call of this writer (a defect in dstl). The call may
    /// have stopped half-way, so the writer's state can no longer be trusted: it fails
    /// as a trapped sandbox does, and the other writers carry on.
    HostPanic,
}

impl TrapKind {
    /// Classifies a wasmtime error.
    pub(crate) fn of(error: &wasmtime::Error) -> Self {
        if error.downcast_ref::<GuestFault>().is_some() {
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

/// A trap: its kind and a cause that says what happened, for `Error::Trapped`.
#[derive(Debug, Clone)]
pub(crate) struct Trap {
    pub kind: TrapKind,
    pub cause: String,
}

impl Trap {
    /// A panic of the host's own code during a call of a writer, with its message.
    pub fn host_panic(message: &str) -> Self {
        Self {
            kind: TrapKind::HostPanic,
            cause: format!(
                "an internal error of dstl interrupted a call of this writer: {message}"
            ),
        }
    }

    /// Describes `error`, raised in a sandbox whose calls may take `call_timeout` of guest
    /// time, with whatever the guest printed to stderr.
    pub fn new(error: &wasmtime::Error, ctx: &WriterCtx, call_timeout: Duration) -> Self {
        let kind = TrapKind::of(error);
        let mut cause = format!("{error:#}");
        if kind == TrapKind::Deadline {
            cause = format!(
                "the call used up its deadline of {} ms of CPU time (dstl.writer.call-timeout) and was interrupted: {cause}",
                call_timeout.as_millis()
            );
        }
        let printed = ctx.stderr.contents();
        if !printed.is_empty() {
            cause.push_str("; guest stderr: ");
            cause.push_str(String::from_utf8_lossy(&printed).trim());
        }
        Self { kind, cause }
    }
}
