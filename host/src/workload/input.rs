//! The operators' input: a seeded stream of changes per writer, regenerated to verify.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Workload;

/// The seeded stream of one writer's changes; regenerated to verify.
pub(super) struct Changes {
    rng: ChaCha8Rng,
    key_groups: i32,
    size: usize,
}

impl Changes {
    pub(super) fn new(workload: &Workload, index: usize) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(
                workload.seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            key_groups: workload.key_groups,
            size: workload.change_size,
        }
    }

    /// Appends the next change to packed columns.
    pub(super) fn next_into(
        &mut self,
        key_groups: &mut Vec<i32>,
        lengths: &mut Vec<u32>,
        data: &mut Vec<u8>,
    ) {
        let key_group = self.rng.random_range(0..self.key_groups);
        let start = data.len();
        data.resize(start + self.size, 0);
        self.rng.fill_bytes(&mut data[start..]);
        key_groups.push(key_group);
        lengths.push(self.size as u32);
    }
}
