//! The dstl writer component: exports the writer state machine, the codec, the
//! ownership rules and the upload policy of `dstl-proto` through the WIT world
//! `dstl:changelog/guest`, and implements the writer's effects with the host's imports.
//!
//! The bindings compile only for `wasm32`; natively this crate is empty (the logic and
//! its unit tests live in `dstl-proto`).

#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(target_arch = "wasm32")]
mod ownership;
#[cfg(target_arch = "wasm32")]
mod policy;
