//! dstl: a durable short-term log of keyed-state changes, in the style of Apache Flink's
//! filesystem changelog, with each operator's writer running as a sandboxed WebAssembly
//! component.
//!
//! ```no_run
//! use dstl::{ChangelogStorage, Config, KeyGroupRange};
//! let storage = ChangelogStorage::open(Config::default())?;
//! let writer = storage.create_writer("operator-7", KeyGroupRange { start: 0, end: 127 })?;
//! writer.append(5, b"change")?;
//! let sqn = writer.next_sequence_number()?;
//! let snapshot = writer.persist(0, 1)?.wait()?;
//! writer.confirm(0, sqn, 1)?;
//! for change in storage.read(&snapshot.remote)? {
//!     println!("{} {:?}", change.key_group, change.value);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The layers, bottom up (ARCHITECTURE.md has the whole picture): [`store`] (files),
//! `registry` (who owns which file), `upload` (batching, retries, the in-flight limit),
//! `sandbox` (wasmtime), `writer` (the public [`Writer`] and its mailbox),
//! [`ChangelogStorage`] (ties them together), and [`recovery`] (reading back, manifests,
//! collection). [`workload`] is the benchmark and `dstl run` harness on top.

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
mod upload;
pub mod workload;
mod writer;

pub use config::{Config, ConfigError};
pub use dstl_proto::codec::Change;
pub use dstl_proto::types::{
    ChangelogHandle, HandleEntry, KeyGroupRange, SnapshotResult, StreamHandle, WriterError,
};
pub use error::{Error, SandboxError, TrapKind};
pub use metrics::{HistogramSnapshot, MetricsSnapshot};
pub use recovery::reader::ReadError;
pub use recovery::{Recovery, gc, manifest, reader};
pub use registry::{LocalRegistry, TaskRegistry, WriterId};
pub use sandbox::{ComponentCodec, WriterComponent};
pub use storage::ChangelogStorage;
pub use store::{
    FileSource, LocalStore, Location, LocationError, S3Settings, S3Store, Store, StoredFile,
};
pub use upload::UploadError;
pub use upload::retry::AttemptError;
pub use upload::throttle::Availability;
pub use writer::{PersistFuture, Writer, WriterOptions};

/// Decoding of raw changelog bytes (the same codec the writer component uses).
pub mod codec {
    pub use dstl_proto::codec::*;
}
