//! Packed columns lowered into the guest already framed as a change-set block frames them:
//! a group per key group of the batch (`changeCount keyGroup (length value)*`, the batch's
//! changes ordered by a counting sort, append order kept within a key group). The guest
//! keeps those bytes as they arrived and lends them to the upload as they are, so the copy
//! into the sandbox, which also orders the values, is the only one before the file's
//! (ARCHITECTURE.md, "The data path").
//!
//! wasmtime writes a value into a guest's memory only while it lowers it, so [`Framed`]
//! is lowered as the `list<u8>` of `append-framed` and `persist-framed` and does the
//! framing itself: it asks the guest's allocator for the bytes (as wasmtime's own
//! lowering of a list does) and writes them through the memory slice of the lowering,
//! bounds-checked. This uses wasmtime's hidden `__internal` lowering API, the one its
//! derive macros generate code for.

use std::mem::MaybeUninit;

use dstl_proto::codec::FramedBatch;
use wasmtime::ValRaw;
use wasmtime::component::__internal::{
    CanonicalAbiInfo, InstanceType, InterfaceType, LowerContext,
};
use wasmtime::component::{ComponentType, Lower};

/// Changes as packed columns, as a writer call takes them: `lengths[i]` bytes of `data`
/// belong to `key_groups[i]`.
#[derive(Clone, Copy)]
pub(crate) struct Packed<'a> {
    pub key_groups: &'a [i32],
    pub lengths: &'a [u32],
    pub data: &'a [u8],
}

impl<'a> Packed<'a> {
    /// The columns of a batch.
    pub fn new(key_groups: &'a [i32], lengths: &'a [u32], data: &'a [u8]) -> Self {
        Self {
            key_groups,
            lengths,
            data,
        }
    }
}

/// Scratch space of one writer's framing, kept for its capacity.
#[derive(Default)]
pub(crate) struct Framing(FramedBatch);

impl Framing {
    /// `batch` (checked: its columns agree and its lengths add up to its data) ordered
    /// for framing.
    pub fn frame<'a>(&'a mut self, batch: Packed<'a>) -> Framed<'a> {
        self.0.order(batch.key_groups, batch.lengths);
        Framed {
            batch,
            framing: &self.0,
        }
    }
}

/// A batch lowered as a `list<u8>` of framed groups, one per key group.
pub(crate) struct Framed<'a> {
    batch: Packed<'a>,
    framing: &'a FramedBatch,
}

impl Framed<'_> {
    /// Allocates the framed batch in the guest and writes it there: where, and how long.
    fn write(&self, cx: &mut LowerContext<'_, impl Sized>) -> wasmtime::Result<(usize, usize)> {
        let len = self.framing.len();
        let ptr = cx.realloc(0, 0, 1, len)?;
        let out = cx
            .as_slice_mut()
            .get_mut(ptr..ptr + len)
            .ok_or_else(|| wasmtime::format_err!("realloc return: beyond end of memory"))?;
        let batch = &self.batch;
        self.framing
            .write(out, batch.key_groups, batch.lengths, batch.data);
        Ok((ptr, len))
    }
}

// SAFETY: lowers exactly as a `list<u8>` (same ABI and type check).
unsafe impl ComponentType for Framed<'_> {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <[u8] as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: as above; the bytes go through the lowering's realloc and memory slice.
unsafe impl Lower for Framed<'_> {
    fn linear_lower_to_flat<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        _ty: InterfaceType,
        dst: &mut MaybeUninit<[ValRaw; 2]>,
    ) -> wasmtime::Result<()> {
        let (ptr, len) = self.write(cx)?;
        // SAFETY: `[ValRaw; 2]` is two `ValRaw`s.
        let dst = unsafe {
            &mut *(dst as *mut MaybeUninit<[ValRaw; 2]> as *mut [MaybeUninit<ValRaw>; 2])
        };
        dst[0].write(ValRaw::i64(ptr as i64));
        dst[1].write(ValRaw::i64(len as i64));
        Ok(())
    }

    fn linear_lower_to_memory<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        _ty: InterfaceType,
        offset: usize,
    ) -> wasmtime::Result<()> {
        let (ptr, len) = self.write(cx)?;
        *cx.get::<4>(offset) = u32::try_from(ptr)?.to_le_bytes();
        *cx.get::<4>(offset + 4) = u32::try_from(len)?.to_le_bytes();
        Ok(())
    }
}
