//! The host side of the component's imports, for one writer: the uploader, the registries
//! and logging. The guest is not trusted: a call naming a file the writer does not hold is
//! a [`GuestFault`], which traps the writer.

use std::sync::Arc;

use dstl_proto::codec;
use dstl_proto::types::{ChangeSetBlock, UploadTask};
use wasmtime::StoreContextMut;
use wasmtime::component::{ComponentType, HasSelf, Lift, Linker, WasmList};

use super::bindings::dstl::changelog::{local_registry, logging, registry};
use super::bindings::{to_wit_refusal, wit};
use super::context::{GuestFault, WriterCtx};
use crate::upload::Block;

impl wit::Host for WriterCtx {}

/// `uploader.schedule`'s task as it lies in the guest's memory: its blocks are read in
/// place, checked there, and lent to the upload (`lease`) or copied once into recycled
/// buffers (see `upload::buffers`), instead of being lifted into fresh allocations.
#[derive(ComponentType, Lift)]
#[component(record)]
struct GuestTask {
    id: u64,
    #[component(name = "change-sets")]
    change_sets: WasmList<GuestBlock>,
    preemptive: bool,
}

#[derive(ComponentType, Lift)]
#[component(record)]
struct GuestBlock {
    #[component(name = "sequence-number")]
    sequence_number: u64,
    size: u64,
    pieces: WasmList<WasmList<u8>>,
}

/// Adds every import of the world to `linker`: `uploader.schedule` by hand (above), the
/// others through the generated bindings.
pub(crate) fn add_to_linker(linker: &mut Linker<WriterCtx>) -> wasmtime::Result<()> {
    wit::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    registry::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    local_registry::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    logging::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    linker
        .instance("dstl:changelog/uploader@0.1.0")?
        .func_wrap("schedule", schedule)
}

fn schedule(
    mut store: StoreContextMut<'_, WriterCtx>,
    (task,): (GuestTask,),
) -> wasmtime::Result<(Result<bool, wit::Refusal>,)> {
    let fault = |message: String| -> wasmtime::Error {
        GuestFault(format!("schedule of upload task {}: {message}", task.id)).into()
    };
    if task.change_sets.len() == 0 {
        return Err(fault("the task has no change sets".into()));
    }
    // Bytes of the task's blocks so far. An honest task's blocks (and each block's pieces)
    // are distinct parts of the guest's memory, so they fit in it; more means the guest
    // lends some bytes twice, which would make the host allocate without bound.
    let mut task_len = 0u64;
    let memory_limit = store.data().memory_limit;
    // Every block and its list of pieces first (reading a list needs the store mutably),
    // then the pieces' bytes where they lie.
    let mut lists: Vec<(GuestBlock, Vec<WasmList<u8>>)> =
        Vec::with_capacity(task.change_sets.len());
    for i in 0..task.change_sets.len() {
        let block = task
            .change_sets
            .get(&mut store, i)
            .ok_or_else(|| fault(format!("change set {i} is missing from its list")))??;
        if let Some((previous, _)) = lists.last()
            && block.sequence_number <= previous.sequence_number
        {
            return Err(fault(format!(
                "sequence number {} does not ascend after {}",
                block.sequence_number, previous.sequence_number
            )));
        }
        let mut pieces = Vec::with_capacity(block.pieces.len());
        for p in 0..block.pieces.len() {
            let piece = block.pieces.get(&mut store, p).ok_or_else(|| {
                fault(format!(
                    "piece {p} of change set {} is missing from its list",
                    block.sequence_number
                ))
            })??;
            task_len += piece.len() as u64;
            if task_len > memory_limit {
                return Err(fault(format!(
                    "its blocks add up to more than the writer's memory ({memory_limit} bytes) at change set {}",
                    block.sequence_number
                )));
            }
            pieces.push(piece);
        }
        lists.push((block, pieces));
    }
    // Each block as (sequence number, payload, its pieces where they lie).
    let mut blocks: Vec<(u64, u64, Vec<&[u8]>)> = Vec::with_capacity(lists.len());
    for (block, pieces) in &lists {
        let pieces: Vec<&[u8]> = pieces.iter().map(|p| p.as_le_slice(&store)).collect();
        // The size counted against the in-flight limit (and reported in handles) is what
        // the block holds, never what the guest says it holds.
        let payload = codec::block_payload(&pieces).map_err(|e| {
            fault(format!(
                "change set {} is not one change-set block: {e}",
                block.sequence_number
            ))
        })?;
        if payload != block.size {
            return Err(fault(format!(
                "change set {} claims {} payload bytes, its block holds {payload}",
                block.sequence_number, block.size
            )));
        }
        blocks.push((block.sequence_number, payload, pieces));
    }
    // Lent while the writer's lent bytes stay within bounds (`lease`), else copied.
    let ctx = store.data();
    let lease = (ctx.keeper.as_ref())
        .and_then(|keeper| keeper.try_lend(task.id, task_len, memory_limit))
        .map(Arc::new);
    let lent = lease.is_some();
    let change_sets: Vec<ChangeSetBlock<Block>> = blocks
        .into_iter()
        .map(|(sequence_number, size, pieces)| {
            let block = match &lease {
                // SAFETY: the pieces lie in this sandbox's memory, which does not move
                // (`memory_may_move(false)`) and which the lease keeps.
                Some(lease) => unsafe { Block::lent(&pieces, Box::new(lease.clone())) },
                None => {
                    let len = pieces.iter().map(|p| p.len()).sum();
                    let mut copy = ctx.services.scheduler.blocks.take(len);
                    for piece in pieces {
                        copy.extend_from_slice(piece);
                    }
                    Block::owned(copy)
                }
            };
            ChangeSetBlock {
                sequence_number,
                size,
                block,
            }
        })
        .collect();
    let ctx = store.data_mut();
    // Blocks while the in-flight limit is reached: that uses no CPU, so it does not count
    // against the call's deadline.
    let result = ctx.services.scheduler.submit(
        ctx.sink.clone(),
        ctx.id,
        &ctx.closing,
        UploadTask {
            id: task.id,
            change_sets,
            preemptive: task.preemptive,
        },
    );
    if result.is_ok() && task.preemptive {
        ctx.count_preemptive_upload();
    }
    Ok((result.map(|()| lent).map_err(to_wit_refusal),))
}

impl registry::Host for WriterCtx {
    fn release(&mut self, handle: wit::StreamHandle) -> wasmtime::Result<()> {
        let local = self.holdings.release(&handle.path)?;
        self.services
            .registries
            .release(self.id, &handle.path, local);
        Ok(())
    }

    fn stop_tracking(&mut self, handle: wit::StreamHandle) -> wasmtime::Result<()> {
        let registries = &self.services.registries;
        if self.holdings.check(&handle.path, "stop-tracking")? {
            registries.local.stop_tracking(self.id, &handle.path);
        } else {
            registries.task.stop_tracking(&handle.path);
        }
        Ok(())
    }
}

impl local_registry::Host for WriterCtx {
    fn register(&mut self, handle: wit::StreamHandle, checkpoint: i64) -> wasmtime::Result<()> {
        if !self.holdings.check(&handle.path, "local register")? {
            return Err(GuestFault(format!(
                "local register of {}, a store file rather than a local copy",
                handle.path
            ))
            .into());
        }
        self.services
            .registries
            .local
            .register(self.id, &handle.path, checkpoint);
        Ok(())
    }

    fn discard_up_to(&mut self, checkpoint: i64) -> wasmtime::Result<Vec<String>> {
        let discarded = self
            .services
            .registries
            .local
            .discard_up_to(self.id, checkpoint);
        self.holdings.forget(&discarded);
        Ok(discarded)
    }
}

impl logging::Host for WriterCtx {
    fn log(&mut self, level: logging::Level, message: String) -> wasmtime::Result<()> {
        let writer = &self.name;
        match level {
            logging::Level::Trace => tracing::trace!(writer, "{message}"),
            logging::Level::Debug => tracing::debug!(writer, "{message}"),
            logging::Level::Info => tracing::info!(writer, "{message}"),
            logging::Level::Warn => tracing::warn!(writer, "{message}"),
            logging::Level::Error => tracing::error!(writer, "{message}"),
        }
        Ok(())
    }
}
