//! The dstl writer's domain, as plain Rust with no runtime: what the writer component
//! (`guest/`) exports through WIT, and what the host links natively to read files.
//!
//! - [`writer`]: the writer as a sans-IO state machine, driven by calls from the operator
//!   and by upload outcomes that the host delivers; every effect goes through
//!   [`writer::Effects`].
//! - [`codec`]: the changelog file format, the only place that knows its bytes.
//! - [`read`]: reading a handle's change sets back from the files it names: which
//!   files, the checks on their bytes, the words of every failure.
//! - [`types`]: the values both sides exchange (mirrors of the WIT `types` interface), and
//!   [`wit_conversions!`] ([`wit`]), the conversions to and from the generated types.
//! - [`retry`]: an upload's retry policy as a sans-IO state machine, time as an input.
//! - [`batch`]: which upload tasks of many writers leave together as one file, and when.
//! - [`time`]: the instants those machines take as inputs.
//! - [`handoff`]: when a host's append buffer hands its batch to the writer.
//! - [`ownership`]: who owns which file (reference counts, per-writer claims on local
//!   copies): the rules that decide when a file may be deleted.
//! - [`settings`]: the configuration keys, their defaults, value syntax and checks.
//! - [`writer_request`]: what a host checks before it creates a writer (name, key
//!   groups, sandbox limits).
//! - [`manifest`] and [`lease`]: the JSON records other tools and `dstl gc` read (a
//!   snapshot's manifest; an open storage's lease on its job).
//!
//! `ARCHITECTURE.md` at the repository root describes how the pieces fit together.

#![warn(missing_docs)]

pub mod batch;
pub mod codec;
pub mod error;
pub mod handoff;
pub mod lease;
pub mod manifest;
pub mod ownership;
pub mod read;
pub mod retry;
pub mod settings;
pub mod time;
pub mod types;
pub mod wit;
pub mod writer;
pub mod writer_request;
