//! dstl: a durable short-term log of keyed-state changes, in the style of Apache Flink's
//! filesystem changelog, with each operator's writer running as a sandboxed WebAssembly
//! component.
//!
//! # The model
//!
//! A stream processor keeps keyed state per operator. Between two full copies of that
//! state (*materializations*), every change is logged here, so that a checkpoint only has
//! to make the changes since the last materialization durable, which is quick.
//!
//! - **Storage.** One [`ChangelogStorage`] per process or job owns the uploads, the
//!   registries of files and the wasm engine; its [`Config`] uses Flink's keys
//!   (`state.changelog.dstl.dfs.*`). Files go to a directory or an S3 bucket.
//! - **Writer.** Each operator gets a [`Writer`] ([`ChangelogStorage::create_writer`])
//!   for a range of key groups. [`Writer::append`] logs one change (bytes) for a key
//!   group; changes gather in an open *change set*, and
//!   [`Writer::next_sequence_number`] closes it and names the position: *sequence
//!   numbers* start at [`Writer::initial_sequence_number`] (0) and advance per non-empty
//!   change set.
//! - **Persist.** On a checkpoint, [`Writer::persist`]`(from, checkpoint)` uploads every
//!   change set from `from` on that is not uploaded yet (change sets of many writers share
//!   one file) and returns a [`PersistFuture`]: `.wait()` blocks, `.await` suspends. It
//!   completes with a [`SnapshotResult`] whose [`ChangelogHandle`] lists `(file, offset,
//!   size)` per change set: that handle is what the checkpoint stores. When open changes
//!   reach `dstl.dfs.preemptive-persist-threshold`, the writer uploads them *pre-emptively*
//!   before any checkpoint asks.
//! - **Confirm.** When the checkpoint coordinator completes a checkpoint,
//!   [`Writer::confirm`]`(from, to, checkpoint)` tells the writer: the checkpoint owns its
//!   files from then on and dstl never deletes them. [`Writer::reset`] tells it a
//!   checkpoint was aborted.
//! - **Truncate.** After a materialization at sequence number `m` is part of a completed
//!   checkpoint, the changes below `m` are not needed any more: [`Writer::truncate`]`(m)`
//!   drops them, releasing files no one else references.
//! - **Back-pressure.** Bytes in flight are limited (`dstl.dfs.upload.max-in-flight`); an
//!   upload waits while the limit is reached. Async operators await
//!   [`ChangelogStorage::availability`] instead of blocking.
//! - **Recovery.** After a failure, the handle of the last completed checkpoint is read
//!   back with [`ChangelogStorage::read`] or, for many handles sharing files,
//!   [`Recovery`]; the changes come back per change set, each key group's in append order
//!   (a batch's key group by key group, metadata first). [`manifest::Manifest`] is a JSON
//!   form of a handle.
//!
//! Every precondition violation is a typed [`Error`]; a writer whose sandbox fails is
//! [`Error::Trapped`] and the others carry on.
//!
//! ```
//! use dstl::{ChangelogStorage, Config, KeyGroupRange};
//!
//! let dir = tempfile::tempdir()?;
//! let mut config = Config::default();
//! config.set("dstl.dfs.base-path", &dir.path().to_string_lossy())?;
//! let storage = ChangelogStorage::open(config)?;
//! let writer = storage.create_writer("operator-7", KeyGroupRange { start: 0, end: 127 })?;
//!
//! // Process records: every state change is logged for its key group.
//! writer.append(5, b"count=1")?;
//! writer.append(9, b"count=4")?;
//! writer.append_meta(b"schema v1")?;
//!
//! // Checkpoint 1 (no materialization yet: everything from sequence number 0).
//! let to = writer.next_sequence_number()?;
//! let snapshot = writer.persist(0, 1)?.wait()?;
//! // The coordinator completed checkpoint 1.
//! writer.confirm(0, to, 1)?;
//!
//! // Recovery reads the checkpoint's handle back; the buffered appends went to the writer
//! // as one batch, which it keeps key group by key group, metadata first.
//! let changes = storage.read(&snapshot.remote)?;
//! let values: Vec<&[u8]> = changes.iter().map(|c| c.value.as_slice()).collect();
//! assert_eq!(values, [&b"schema v1"[..], b"count=1", b"count=4"]);
//!
//! // The state was materialized at `to`: the changes before it can go.
//! writer.truncate(to)?;
//! writer.close()?;
//! storage.close();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The examples in `host/examples/` go further: an operator loop with asynchronous
//! checkpoints and materializations (`operator_loop`), async operators on the
//! availability signal (`async_operators`), an S3 store with credentials from the
//! environment (`s3`), and recovery of a writer from a manifest (`recover`).
//!
//! # Metrics and traces
//!
//! dstl reports through the `metrics` facade and `tracing`: see [`telemetry`] for the
//! families, their labels and Flink's names, and the spans. Install a metrics recorder
//! before opening a storage. [`ChangelogStorage::metrics`] reads the upload metrics
//! in-process.
//!
//! # Layers
//!
//! Bottom up (ARCHITECTURE.md has the whole picture): [`store`] (files), `registry` (who
//! owns which file), `upload` (batching, retries, the in-flight limit), `sandbox`
//! (wasmtime), `writer` (the public [`Writer`] and its mailbox), [`ChangelogStorage`]
//! (ties them together), and [`recovery`] (reading back, manifests, collection).
//! The `dstl` command-line tool and its benchmark workload are the `dstl-cli` crate.

#![warn(missing_docs)]

// The crate README's example (what a new project starts from) runs as a doctest too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod background;
pub mod config;
mod error;
mod metrics;
pub mod recovery;
mod registry;
mod sandbox;
mod services;
mod storage;
pub mod store;
mod sync;
pub mod telemetry;
mod upload;
mod writer;

pub use config::{Config, ConfigError};
pub use dstl_proto::codec::Change;
/// The cases of [`WriterError`] and [`UploadFailure`] with their fields.
pub use dstl_proto::error as writer_error;
pub use dstl_proto::error::{UploadFailure, WriterError};
pub use dstl_proto::handoff::Budget;
pub use dstl_proto::read::FileError;
pub use dstl_proto::types::{
    ChangelogHandle, HandleEntry, KeyGroupRange, SnapshotResult, StreamHandle,
};
pub use error::{Error, SandboxError, TrapKind, describe};
pub use metrics::{HistogramSnapshot, MetricsSnapshot};
pub use recovery::reader::ReadError;
pub use recovery::{Recovery, gc, manifest, reader};
pub use registry::WriterId;
#[cfg(feature = "test-util")]
pub use registry::{LocalRegistry, TaskRegistry};
#[cfg(feature = "test-util")]
pub use sandbox::ComponentCodec;
pub use sandbox::WriterComponent;
pub use storage::{ChangelogStorage, StorageBuilder};
pub use store::{
    FileSource, LocalStore, Location, LocationError, S3Error, S3Settings, S3Store, Store,
    StoredFile,
};
pub use upload::UploadError;
pub use upload::retry::AttemptError;
pub use upload::throttle::{Availability, interruptible};
pub use writer::{CloseSignal, PersistFuture, Writer, WriterOptions};

/// Decoding of raw changelog bytes (the same codec the writer component uses).
pub mod codec {
    pub use dstl_proto::codec::*;
}
