//! The `dstl` command-line tool's library half: the checkpointing workload behind
//! `dstl run` and `dstl bench` ([`workload`]), built on the public API of the `dstl`
//! crate. The binary (`src/main.rs`) adds the subcommands, logging and the Prometheus
//! endpoint.

#![warn(missing_docs)]

pub mod workload;
