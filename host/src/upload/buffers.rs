//! Recycled buffers for change-set blocks copied out of a writer's sandbox (those past
//! its lending bound, see `sandbox::lease`) and for compressed files. A buffer comes back
//! here when its upload ends, so steady-state uploads allocate nothing: no fresh pages for
//! the kernel to zero, and no heap growth from blocks freed on other threads than the one
//! that allocated them.

use std::sync::Mutex;

use crate::sync::LockExt;

/// A pool of byte buffers, holding at most `max_bytes` of spare capacity.
pub(crate) struct BlockPool {
    spare: Mutex<Spare>,
    max_bytes: usize,
}

#[derive(Default)]
struct Spare {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

/// Capacities are rounded up to this, so buffers of similar sizes serve each other.
const GRANULE: usize = 64 << 10;

impl BlockPool {
    /// A pool keeping up to `max_bytes` of buffers between uses.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            spare: Mutex::default(),
            max_bytes,
        }
    }

    /// An empty buffer with room for `len` bytes: the smallest spare one that fits, else
    /// a new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let mut spare = self.spare.locked();
        let best = spare
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        if let Some(i) = best {
            let buffer = spare.buffers.swap_remove(i);
            spare.bytes -= buffer.capacity();
            return buffer;
        }
        drop(spare);
        Vec::with_capacity(len.div_ceil(GRANULE) * GRANULE)
    }

    /// Takes a buffer back for later use (or frees it, when the pool is full).
    pub fn put(&self, mut buffer: Vec<u8>) {
        buffer.clear();
        let mut spare = self.spare.locked();
        if buffer.capacity() == 0 || spare.bytes + buffer.capacity() > self.max_bytes {
            // Make room by dropping the smallest: large buffers are the costly ones.
            if let Some(i) = spare
                .buffers
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() < buffer.capacity())
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
                && spare.bytes - spare.buffers[i].capacity() + buffer.capacity() <= self.max_bytes
            {
                let dropped = spare.buffers.swap_remove(i);
                spare.bytes -= dropped.capacity();
            } else {
                return;
            }
        }
        spare.bytes += buffer.capacity();
        spare.buffers.push(buffer);
    }

    /// Spare capacity held now.
    #[cfg(test)]
    pub fn spare_bytes(&self) -> usize {
        self.spare.locked().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_the_spare_capacity_is_bounded() {
        let pool = BlockPool::new(4 * GRANULE);
        let a = pool.take(10);
        assert_eq!(a.capacity(), GRANULE);
        let ptr = a.as_ptr();
        pool.put(a);
        assert_eq!(pool.spare_bytes(), GRANULE);
        let again = pool.take(GRANULE);
        assert_eq!(again.as_ptr(), ptr, "the spare buffer is handed out again");
        assert!(again.is_empty());
        assert_eq!(pool.spare_bytes(), 0);
        // A buffer larger than the pool is freed, not kept.
        pool.put(Vec::with_capacity(5 * GRANULE));
        assert_eq!(pool.spare_bytes(), 0);
        // Small spares make way for a larger one.
        for _ in 0..4 {
            pool.put(Vec::with_capacity(GRANULE));
        }
        assert_eq!(pool.spare_bytes(), 4 * GRANULE);
        pool.put(Vec::with_capacity(2 * GRANULE));
        assert_eq!(pool.spare_bytes(), 4 * GRANULE);
        assert!(pool.take(2 * GRANULE).capacity() >= 2 * GRANULE);
    }
}
