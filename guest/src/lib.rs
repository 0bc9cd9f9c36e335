//! The dstl writer component.
//!
//! - [`writer`]: the writer as a sans-IO state machine (spec §2), driven by calls from the
//!   operator and by upload outcomes that the host delivers.
//! - [`codec`]: the changelog file format (spec §6), the only place that knows its bytes.
//!   The host links this crate natively to read files, so the format is never written twice.
//! - `component` (wasm32 only): the wit-bindgen glue that exports both through `wit/`.
//!
//! The bindings compile only for `wasm32`: natively this crate is a plain library whose
//! logic unit-tests without a runtime.

pub mod codec;
pub mod types;
pub mod writer;

#[cfg(target_arch = "wasm32")]
mod component;
