//! A change-set block on its way into a file: bytes the host owns (copied out of a
//! sandbox into a recycled buffer), or pieces of memory lent to the upload (a writer's
//! sandbox memory, `sandbox::lease`), which the file is written from directly.

/// One block of an upload task.
pub(crate) struct Block {
    /// The block's bytes in order.
    pieces: Vec<Piece>,
    len: usize,
    hold: Hold,
}

/// What keeps the pieces readable.
enum Hold {
    /// The buffer the one piece lies in.
    Owned(Vec<u8>),
    /// What keeps the memory the pieces lie in (a lease on a sandbox's memory).
    Lent { _lease: Box<dyn Send + Sync> },
}

/// Where a piece lies.
#[derive(Clone, Copy)]
struct Piece {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a block only reads its pieces, which stay mapped and in place while it exists:
// a buffer it owns, or memory its lease keeps (see `sandbox::lease`). Nothing
// else writes them while the block exists, except a guest that breaks its word, whose
// changes reach only its own block's bytes.
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

impl Block {
    /// A block in a buffer of its own.
    pub fn owned(bytes: Vec<u8>) -> Self {
        Self {
            pieces: vec![Piece {
                ptr: bytes.as_ptr(),
                len: bytes.len(),
            }],
            len: bytes.len(),
            hold: Hold::Owned(bytes),
        }
    }

    /// A block read where it lies in memory lent to the upload.
    ///
    /// # Safety
    /// `pieces` lie in memory that `lease` keeps mapped and in place while it lasts.
    pub unsafe fn lent(pieces: &[&[u8]], lease: Box<dyn Send + Sync>) -> Self {
        Self {
            pieces: pieces
                .iter()
                .map(|p| Piece {
                    ptr: p.as_ptr(),
                    len: p.len(),
                })
                .collect(),
            len: pieces.iter().map(|p| p.len()).sum(),
            hold: Hold::Lent { _lease: lease },
        }
    }

    /// The block's bytes, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> + Clone + '_ {
        // SAFETY: see `Block`'s `Send`: every piece stays readable while `self` lives.
        self.pieces
            .iter()
            .map(|p| unsafe { std::slice::from_raw_parts(p.ptr, p.len) })
    }

    /// Bytes of the whole block.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The buffer of an owned block, for reuse.
    pub fn into_buffer(self) -> Option<Vec<u8>> {
        match self.hold {
            Hold::Owned(bytes) => Some(bytes),
            Hold::Lent { .. } => None,
        }
    }
}
