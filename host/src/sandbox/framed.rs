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

/// A batch on its way into the guest: packed columns, or columns whose values the caller
/// writes into the sandbox itself.
#[derive(Clone, Copy)]
pub(crate) enum Batch<'a> {
    Packed(Packed<'a>),
    Placed(Placed<'a>),
}

/// Changes whose key groups and lengths the host has and whose values the caller writes
/// where the framing puts them ([`Placing`]).
#[derive(Clone, Copy)]
pub(crate) struct Placed<'a> {
    pub key_groups: &'a [i32],
    pub lengths: &'a [u32],
    pub place: &'a dyn Place,
}

/// A caller's writing of values as the lowering sees it (behind a trait object, so a
/// batch's lifetime stays covariant however the caller's closure borrows).
pub(crate) trait Place: Send + Sync {
    /// Has the caller write each change's value into `out`, change `i`'s at `offsets[i]`.
    fn place(&self, out: &mut [u8], offsets: &[u32]);
}

/// Scratch space of one writer's framing, kept for its capacity.
#[derive(Default)]
pub(crate) struct Framing(FramedBatch);

impl Framing {
    /// `batch` ready to be lowered: its columns (checked: they agree, and a packed batch's
    /// lengths add up to its data) ordered for framing.
    pub fn frame<'a>(&'a mut self, batch: Batch<'a>) -> Framed<'a> {
        let (key_groups, lengths) = match &batch {
            Batch::Packed(packed) => (packed.key_groups, packed.lengths),
            Batch::Placed(placed) => (placed.key_groups, placed.lengths),
        };
        self.0.order(key_groups, lengths);
        Framed {
            batch,
            framing: &self.0,
        }
    }
}

/// Values a caller writes straight into the sandbox, while the batch is lowered: `place`
/// gets the batch's bytes, framed by the host, and where each value goes (the one copy
/// into the sandbox is the caller's). What the bytes hold afterwards is checked with
/// `check` before the guest runs.
pub(crate) struct Placing<'a> {
    place: Cell<Option<&'a mut PlaceFn<'a>>>,
    check: &'a CheckFn<'a>,
    placed: Cell<Option<Filled>>,
}

/// A caller's writing of values: each change's into the bytes given at its offset; false
/// if it cannot.
pub(crate) type PlaceFn<'a> = dyn FnMut(&mut [u8], &[u32]) -> bool + 'a;
/// The host's check of a framed batch (`WriterConfig::check_framed`).
pub(crate) type CheckFn<'a> = dyn Fn(&[u8]) -> Result<FramedGroups, WriterError> + 'a;

/// What a [`Placing`] came to.
#[derive(Debug)]
pub(crate) enum Filled {
    /// Whole groups that passed the check.
    Groups(FramedGroups),
    /// Bytes the check refused (the caller wrote beyond its values); the guest, which
    /// checks them too, appends nothing.
    Refused(WriterError),
    /// The caller gave up; the guest was handed bytes it refuses whole.
    NotWritten,
}

// SAFETY: wasmtime asks every lowered type to be `Send + Sync` because it may be lowered
// on another thread in its async calls. The writer's calls are synchronous: a `Placing`
// is made, lowered and read on the one thread of the call that owns it, never shared.
unsafe impl Send for Placing<'_> {}
// SAFETY: as above.
unsafe impl Sync for Placing<'_> {}

impl<'a> Placing<'a> {
    /// Values that `place` writes (false: it could not), checked with `check`.
    pub fn new(place: &'a mut PlaceFn<'a>, check: &'a CheckFn<'a>) -> Self {
        Self {
            place: Cell::new(Some(place)),
            check,
            placed: Cell::new(None),
        }
    }

    /// What the lowering came to; `None` if the call never lowered the batch.
    pub fn placed(self) -> Option<Filled> {
        self.placed.into_inner()
    }
}

impl Place for Placing<'_> {
    fn place(&self, out: &mut [u8], offsets: &[u32]) {
        let written = match self.place.take() {
            Some(place) => offsets.is_empty() || place(out, offsets),
            None => false,
        };
        let filled = match written {
            true => match (self.check)(out) {
                Ok(groups) => Filled::Groups(groups),
                Err(refused) => Filled::Refused(refused),
            },
            false => Filled::NotWritten,
        };
        // A batch a caller did not finish is handed over as one the guest refuses whole
        // (its first group of a negative count), so a persist that takes it along fails
        // and persists nothing.
        if let (Filled::NotWritten, Some(count)) = (&filled, out.get_mut(..4)) {
            count.copy_from_slice(&(-1i32).to_be_bytes());
        }
        self.placed.set(Some(filled));
    }
}

/// A batch lowered as a `list<u8>` of framed groups, one per key group.
pub(crate) struct Framed<'a> {
    batch: Batch<'a>,
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
        match self.batch {
            Batch::Packed(batch) => {
                self.framing
                    .write(out, batch.key_groups, batch.lengths, batch.data);
            }
            Batch::Placed(batch) => {
                let mut offsets = Vec::new();
                self.framing
                    .place(out, batch.key_groups, batch.lengths, &mut offsets);
                batch.place.place(out, &offsets);
            }
        }
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
