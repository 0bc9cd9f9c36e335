//! Appends collected on the host side, handed to the guest as one batch when
//! `dstl_proto::handoff::HandOff` says so, or along with a `persist` (ARCHITECTURE.md,
//! "Costs that shaped the design").

use bytes::Bytes;

use crate::sandbox::Packed;

/// Appends not yet handed to the guest: packed columns of values copied in here
/// (`Writer::append`), or the key groups and lengths of values the caller gave away
/// (`Writer::append_owned`), kept as they are until their batch is framed in the sandbox
/// and each is copied to its place there. Never both at once: a writer hands over what it
/// holds before it buffers the other kind, so the order of appends holds.
#[derive(Default)]
pub(crate) struct AppendBuffer {
    pub key_groups: Vec<i32>,
    pub lengths: Vec<u32>,
    pub data: Vec<u8>,
    owned: Vec<Bytes>,
}

impl AppendBuffer {
    /// Buffers a copy of `value`. The buffer holds no owned values.
    pub fn push(&mut self, key_group: i32, value: &[u8]) {
        debug_assert!(self.owned.is_empty(), "owned values are handed over first");
        self.key_groups.push(key_group);
        self.lengths.push(value.len() as u32);
        self.data.extend_from_slice(value);
    }

    /// Keeps `value` itself. The buffer holds no copied values.
    pub fn push_owned(&mut self, key_group: i32, value: Bytes) {
        debug_assert_eq!(
            self.owned.len(),
            self.key_groups.len(),
            "copied values are handed over first"
        );
        self.key_groups.push(key_group);
        self.lengths.push(value.len() as u32);
        self.owned.push(value);
    }

    pub fn is_empty(&self) -> bool {
        self.key_groups.is_empty()
    }

    /// Whether the buffer holds values of the other kind than `owned` says.
    pub fn holds_other_kind(&self, owned: bool) -> bool {
        !self.is_empty() && self.holds_owned() != owned
    }

    /// Whether the buffered values are owned ones (`place_owned` writes them).
    pub fn holds_owned(&self) -> bool {
        !self.owned.is_empty()
    }

    pub fn packed(&self) -> Packed<'_> {
        Packed::new(&self.key_groups, &self.lengths, &self.data)
    }

    /// Copies each owned value to its offset in `out`, the batch the host framed from
    /// these key groups and lengths; false if an offset does not fit.
    pub fn place_owned(&self, out: &mut [u8], offsets: &[u32]) -> bool {
        place_values(out, offsets, self.owned.iter().map(|value| &value[..]))
    }

    pub fn clear(&mut self) {
        self.key_groups.clear();
        self.lengths.clear();
        self.data.clear();
        self.owned.clear();
    }
}

/// Copies `values` to their `offsets` in `out`, a batch the host framed from their
/// lengths; false if there are not as many offsets as values or an offset does not fit.
pub(crate) fn place_values<'v>(
    out: &mut [u8],
    offsets: &[u32],
    values: impl ExactSizeIterator<Item = &'v [u8]>,
) -> bool {
    if offsets.len() != values.len() {
        return false;
    }
    for (value, &at) in values.zip(offsets) {
        let at = at as usize;
        match out.get_mut(at..at + value.len()) {
            Some(place) => place.copy_from_slice(value),
            None => return false,
        }
    }
    true
}
