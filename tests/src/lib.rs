//! The shared harness of the black-box tests (`tests/tests/`):
//!
//! - [`harness`]: opening a storage with configuration pairs, reading snapshots back,
//!   listing files, picking typed errors out of results — what every test file uses;
//! - [`fault_store`]: a local store that fails, hangs or delays creates as planned or at
//!   random (the scheduler tests, the shared scenarios and the simulation);
//! - [`conformance`]: the checks every [`dstl::Store`] must pass, run against the local,
//!   S3 and fault-injecting stores by `tests/tests/store_conformance.rs`;
//! - [`seaweed`]: a real SeaweedFS server per test, for the S3 store;
//! - [`golden`]: the files Apache Flink 2.3.0 wrote (`tests/golden/`) as Rust values.

pub mod conformance;
pub mod fault_store;
pub mod golden;
pub mod harness;
pub mod seaweed;
