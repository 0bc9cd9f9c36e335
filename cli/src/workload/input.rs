//! The operators' input, at the cost of the Flink harness's: each value is copied from a
//! seeded, pre-generated random pool at an offset derived from the change's index, with
//! the index in its first 8 bytes, and key group `index % key_groups`. Regenerable from
//! the seed for verification. The copy from the pool goes straight into the writer's
//! sandbox ([`dstl::Writer::append_placed`]), as an embedder that writes each value
//! where the writer keeps it does: the only copy before the file's.

use std::ops::Range;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The random bytes values are cut from.
pub(crate) struct Pool {
    bytes: Vec<u8>,
    /// Offsets are masked into `0..=mask`, so a value never runs past the end.
    mask: usize,
}

impl Pool {
    /// A pool for values of `size` bytes: at least 2 MiB, and 8 values' worth.
    pub fn new(seed: u64, size: usize) -> Self {
        let span = (size * 4).max(1 << 20).next_power_of_two() * 2;
        let mut bytes = vec![0u8; span + size];
        ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut bytes);
        Self {
            bytes,
            mask: span - 1,
        }
    }
}

/// The changes of one writer.
pub(crate) struct Changes<'a> {
    pool: &'a Pool,
    writer: u64,
    key_groups: u64,
    size: usize,
}

impl<'a> Changes<'a> {
    pub fn new(pool: &'a Pool, writer: usize, key_groups: i32, size: usize) -> Self {
        Self {
            pool,
            writer: writer as u64,
            key_groups: key_groups as u64,
            size,
        }
    }

    /// The key group of change `index`.
    pub fn key_group(&self, index: u64) -> i32 {
        (index % self.key_groups) as i32
    }

    /// Appends the value of change `index` to `out`.
    pub fn value_into(&self, index: u64, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.size, 0);
        self.write_value(index, &mut out[start..]);
    }

    /// Writes the value of change `index` into `out`, exactly its size.
    pub fn write_value(&self, index: u64, out: &mut [u8]) {
        let offset = (index
            .wrapping_mul(8191)
            .wrapping_add(self.writer.wrapping_mul(131)) as usize)
            & self.pool.mask;
        out.copy_from_slice(&self.pool.bytes[offset..offset + self.size]);
        let tag = index.to_be_bytes();
        let n = self.size.min(8);
        out[..n].copy_from_slice(&tag[..n]);
    }

    /// Change `index`: its key group and value.
    pub fn change(&self, index: u64) -> (i32, Vec<u8>) {
        let mut value = Vec::with_capacity(self.size);
        self.value_into(index, &mut value);
        (self.key_group(index), value)
    }
}

/// The key groups and lengths of a batch of changes, whose values are written into the
/// writer's sandbox during the call that appends them.
#[derive(Default)]
pub(crate) struct PlacedBatch {
    key_groups: Vec<i32>,
    lengths: Vec<u32>,
}

impl PlacedBatch {
    /// Appends changes `indexes` of `source` to `writer`, each value copied from the pool
    /// to the place the writer gives it, in as many calls as the writer's budget asks
    /// ([`dstl::Writer::budget`]): a batch ends where the writer would upload
    /// pre-emptively had it taken the changes one by one, so uploads start at the same
    /// change as in Flink's writer.
    pub fn append(
        &mut self,
        source: &Changes<'_>,
        indexes: Range<u64>,
        writer: &dstl::Writer,
    ) -> Result<(), dstl::Error> {
        let mut next = indexes.start;
        while next < indexes.end {
            let budget = writer.budget();
            // The change that brings the batch to the budget's bytes is the batch's last.
            let by_bytes = match source.size as u64 {
                0 => u64::MAX,
                size => budget.bytes.div_ceil(size),
            };
            let n = (indexes.end - next)
                .min(u64::from(budget.changes))
                .min(by_bytes)
                .max(1);
            self.append_one_call(source, next..next + n, writer)?;
            next += n;
        }
        Ok(())
    }

    fn append_one_call(
        &mut self,
        source: &Changes<'_>,
        indexes: Range<u64>,
        writer: &dstl::Writer,
    ) -> Result<(), dstl::Error> {
        self.key_groups.clear();
        self.lengths.clear();
        for index in indexes.clone() {
            self.key_groups.push(source.key_group(index));
            self.lengths.push(source.size as u32);
        }
        writer.append_placed(&self.key_groups, &self.lengths, |bytes, offsets| {
            for (index, &at) in indexes.zip(offsets) {
                let at = at as usize;
                match bytes.get_mut(at..at + source.size) {
                    Some(place) => source.write_value(index, place),
                    // Not a place for this value: the writer refuses the batch by name.
                    None => return false,
                }
            }
            true
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_carry_their_index_and_differ_by_writer() {
        let pool = Pool::new(42, 100);
        let a = Changes::new(&pool, 0, 128, 100);
        let b = Changes::new(&pool, 1, 128, 100);
        let (mut va, mut vb) = (Vec::new(), Vec::new());
        a.value_into(300, &mut va);
        b.value_into(300, &mut vb);
        assert_eq!(va.len(), 100);
        assert_eq!(&va[..8], &300u64.to_be_bytes());
        assert_eq!(&vb[..8], &300u64.to_be_bytes());
        assert_ne!(va[8..], vb[8..]);
        assert_eq!(a.key_group(300), 300 % 128);
        // Regenerable: the same pool gives the same bytes.
        let mut again = Vec::new();
        Changes::new(&Pool::new(42, 100), 0, 128, 100).value_into(300, &mut again);
        assert_eq!(va, again);
        // Short values hold a prefix of the index.
        let pool = Pool::new(1, 3);
        let mut short = Vec::new();
        Changes::new(&pool, 0, 1, 3).value_into(7, &mut short);
        assert_eq!(short, &7u64.to_be_bytes()[..3]);
    }
}
