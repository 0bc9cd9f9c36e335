//! The wasmtime side: everything that knows wasm. One engine and one pre-linked
//! component per storage ([`engine`], with the precompiled-component [`cache`]); per
//! writer a store and an instance ([`instance`]) whose data ([`context`]) serves the
//! component's imports ([`imports`]); the generated [`bindings`] and their conversions to
//! `dstl_proto` types; traps and their kinds ([`trap`]); and the component's exported
//! codec in a sandbox of its own for the tests (`codec`, crate feature `test-util`). Above this layer nothing sees a wasmtime type.

pub(crate) mod bindings;
pub(crate) mod cache;
#[cfg(feature = "test-util")]
pub(crate) mod codec;
pub(crate) mod context;
pub(crate) mod engine;
pub(crate) mod framed;
pub(crate) mod imports;
pub(crate) mod instance;
pub(crate) mod lease;
pub(crate) mod trap;

#[cfg(feature = "test-util")]
pub use codec::ComponentCodec;
pub(crate) use context::WriterLinks;
pub use engine::WriterComponent;
pub(crate) use engine::{EngineSettings, MAX_POOL_RESERVATION, Runtime, pool_reservation};
pub(crate) use instance::{Batch, Call, Filled, Instance, Limits, Packed, Placed, Placing};
pub(crate) use trap::Trap;
pub use trap::TrapKind;
