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

use std::cell::Cell;
use std::mem::MaybeUninit;

use dstl_proto::codec::{FramedBatch, FramedGroups};
use dstl_proto::types::WriterError;
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

/// A batch on its way into the guest: packed columns the host frames, or bytes the caller
/// frames.
#[derive(Clone, Copy)]
pub(crate) enum Batch<'a> {
    Packed(Packed<'a>),
    Filled(&'a dyn Fill),
}

/// A caller's framing as the lowering sees it (behind a trait object, so a batch's
/// lifetime stays covariant however the caller's closure borrows).
pub(crate) trait Fill: Send + Sync {
    /// Bytes of the framed batch.
    fn len(&self) -> usize;
    /// Writes the batch into `out` (`len` bytes).
    fn write(&self, out: &mut [u8]);
}

/// Scratch space of one writer's framing, kept for its capacity.
#[derive(Default)]
pub(crate) struct Framing(FramedBatch);

impl Framing {
    /// `batch` ready to be lowered: packed columns (checked: they agree and their lengths
    /// add up to their data) ordered for framing.
    pub fn frame<'a>(&'a mut self, batch: Batch<'a>) -> Framed<'a> {
        match batch {
            Batch::Packed(batch) => {
                self.0.order(batch.key_groups, batch.lengths);
                Framed::Columns {
                    batch,
                    framing: &self.0,
                }
            }
            Batch::Filled(filling) => Framed::Filled(filling),
        }
    }
}

/// A batch its caller frames itself, written while it is lowered: `len` bytes of whole
/// groups, which `fill` writes into the guest's memory (the one copy into the sandbox
/// is the caller's). What it wrote is checked with `check` before the guest runs.
pub(crate) struct Filling<'a> {
    len: usize,
    fill: Cell<Option<&'a mut FillFn<'a>>>,
    check: &'a CheckFn<'a>,
    written: Cell<Option<Filled>>,
}

/// A caller's fill: writes a framed batch into the bytes given, false if it cannot.
pub(crate) type FillFn<'a> = dyn FnMut(&mut [u8]) -> bool + 'a;
/// The host's check of a framed batch (`WriterConfig::check_framed`).
pub(crate) type CheckFn<'a> = dyn Fn(&[u8]) -> Result<FramedGroups, WriterError> + 'a;

/// What a [`Filling`] came to.
#[derive(Debug)]
pub(crate) enum Filled {
    /// Whole groups that passed the check.
    Groups(FramedGroups),
    /// Bytes the check refused; the guest, which checks them too, appends nothing.
    Refused(WriterError),
    /// The caller gave up; the guest was handed bytes it refuses whole.
    NotWritten,
}

// SAFETY: wasmtime asks every lowered type to be `Send + Sync` because it may be lowered
// on another thread in its async calls. The writer's calls are synchronous: a `Filling`
// is made, lowered and read on the one thread of the call that owns it, never shared.
unsafe impl Send for Filling<'_> {}
// SAFETY: as above.
unsafe impl Sync for Filling<'_> {}

impl<'a> Filling<'a> {
    /// A batch of `len` framed bytes that `fill` writes (false: it could not).
    pub fn new(len: usize, fill: &'a mut FillFn<'a>, check: &'a CheckFn<'a>) -> Self {
        Self {
            len,
            fill: Cell::new(Some(fill)),
            check,
            written: Cell::new(None),
        }
    }

    /// What the lowering wrote; `None` if the call never lowered it.
    pub fn written(self) -> Option<Filled> {
        self.written.into_inner()
    }
}

impl Fill for Filling<'_> {
    fn len(&self) -> usize {
        self.len
    }

    /// Has the caller fill `out` (the lowering's bytes) and checks what it wrote.
    fn write(&self, out: &mut [u8]) {
        let written = match self.fill.take() {
            Some(fill) => out.is_empty() || fill(out),
            None => false,
        };
        let filled = match written {
            true => match (self.check)(out) {
                Ok(groups) => Filled::Groups(groups),
                Err(refused) => Filled::Refused(refused),
            },
            false => Filled::NotWritten,
        };
        // Bytes a caller did not finish are handed over as a batch the guest refuses
        // whole (a group of a negative count; shorter than a group's header, any bytes
        // are one), so a persist that takes them along fails and persists nothing.
        if let (Filled::NotWritten, Some(count)) = (&filled, out.get_mut(..4)) {
            count.copy_from_slice(&(-1i32).to_be_bytes());
        }
        self.written.set(Some(filled));
    }
}

/// A batch lowered as a `list<u8>` of framed groups.
pub(crate) enum Framed<'a> {
    /// Packed columns, framed here: a group per key group.
    Columns {
        batch: Packed<'a>,
        framing: &'a FramedBatch,
    },
    /// Framed by the caller.
    Filled(&'a dyn Fill),
}

impl Framed<'_> {
    /// Allocates the framed batch in the guest and writes it there: where, and how long.
    fn write(&self, cx: &mut LowerContext<'_, impl Sized>) -> wasmtime::Result<(usize, usize)> {
        let len = match self {
            Framed::Columns { framing, .. } => framing.len(),
            Framed::Filled(filling) => filling.len(),
        };
        let ptr = cx.realloc(0, 0, 1, len)?;
        let out = cx
            .as_slice_mut()
            .get_mut(ptr..ptr + len)
            .ok_or_else(|| wasmtime::format_err!("realloc return: beyond end of memory"))?;
        match self {
            Framed::Columns { batch, framing } => {
                framing.write(out, batch.key_groups, batch.lengths, batch.data);
                Ok((ptr, len))
            }
            Framed::Filled(filling) => {
                filling.write(out);
                Ok((ptr, len))
            }
        }
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
