//! Appends collected on the host side as packed columns, handed to the guest as one
//! `append-batch` call when `dstl_proto::handoff::HandOff` says so, or along with a
//! `persist` (ARCHITECTURE.md, "Costs that shaped the design").

use crate::sandbox::Packed;

/// Packed columns of appends not yet handed to the guest.
#[derive(Default)]
pub(crate) struct AppendBuffer {
    pub key_groups: Vec<i32>,
    pub lengths: Vec<u32>,
    pub data: Vec<u8>,
}

impl AppendBuffer {
    pub fn push(&mut self, key_group: i32, value: &[u8]) {
        self.key_groups.push(key_group);
        self.lengths.push(value.len() as u32);
        self.data.extend_from_slice(value);
    }

    pub fn is_empty(&self) -> bool {
        self.key_groups.is_empty()
    }

    pub fn packed(&self) -> Packed<'_> {
        Packed::new(&self.key_groups, &self.lengths, &self.data)
    }

    pub fn clear(&mut self) {
        self.key_groups.clear();
        self.lengths.clear();
        self.data.clear();
    }
}
