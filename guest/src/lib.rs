//! The dstl writer component: exports the writer state machine and the codec of
//! `dstl-proto` through the WIT world `dstl:changelog/changelog`, and implements the
//! writer's effects with the host's imports. The ownership rules and the upload policy
//! are a component of their own (`dstl-rules`).
//!
//! The bindings compile only for `wasm32`; natively this crate is empty (the logic and
//! its unit tests live in `dstl-proto`).

#[cfg(target_arch = "wasm32")]
mod component;
