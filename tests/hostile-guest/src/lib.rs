//! A misbehaving writer component, built for the sandbox tests only.
//!
//! It implements the `dstl:changelog` world, but `append-batch` runs its data as a
//! command instead of appending, so a test can make a guest do what a buggy or hostile
//! one would:
//!
//! - `release PATH`, `stop-tracking PATH`: the registry imports, for any path;
//! - `register PATH CHECKPOINT`, `discard CHECKPOINT`: the local-registry imports;
//! - `schedule BYTES`: upload one well-formed change set of that many payload bytes;
//!   `schedule-lying BYTES` claims it holds none; `schedule-garbage BYTES` sends bytes
//!   that are no change-set block; `schedule-empty` a task without change sets;
//!   `schedule-descending` change sets whose sequence numbers go down;
//! - `forge PATH`: the next `persist` answers at once with a snapshot naming `PATH`,
//!   a file this writer never wrote;
//! - `spin`: compute forever; `grow BYTES`: allocate; `panic MESSAGE`: panic.
//!
//! Every other call answers trivially. Natively the crate is empty: the bindings compile
//! only for `wasm32`.

#[cfg(target_arch = "wasm32")]
mod component;
