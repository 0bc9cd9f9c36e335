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

mod background;
mod component;
pub mod config;
mod error;
pub mod gc;
pub mod manifest;
mod metrics;
pub mod reader;
mod registry;
mod retry;
mod scheduler;
mod storage;
pub mod store;
mod throttle;
mod uploader;
pub mod workload;
mod writer;

pub use component::WriterComponent;
pub use config::{Config, ConfigError};
pub use dstl_guest::codec::Change;
pub use dstl_guest::types::{
    ChangelogHandle, HandleEntry, KeyGroupRange, SnapshotResult, StreamHandle, WriterError,
};
pub use error::{Error, TrapKind};
pub use metrics::{HistogramSnapshot, MetricsSnapshot};
pub use reader::ReadError;
pub use registry::{LocalRegistry, TaskRegistry, WriterId};
pub use storage::ChangelogStorage;
pub use store::{FileSource, LocalStore, Location, S3Settings, S3Store, Store, StoredFile};
pub use throttle::Availability;
pub use writer::{ComponentDecoder, PersistFuture, Writer, WriterOptions};

/// Decoding of raw changelog bytes (the same codec the writer component uses).
pub mod codec {
    pub use dstl_guest::codec::*;
}
