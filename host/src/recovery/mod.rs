//! Recovery and clean-up: reading snapshots back ([`reader`]), the manifest JSON that names
//! them ([`manifest`]), and collecting files no manifest names ([`gc`]).

pub mod gc;
pub mod manifest;
pub mod reader;
