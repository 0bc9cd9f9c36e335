//! The changelog file format, byte-compatible with Apache Flink 2.x `StateChangeFormat`.
//!
//! This module is the only place that knows the layout (ARCHITECTURE.md, "The file
//! format"):
//!
//! ```text
//! file        := flag:u8 body                 flag 0x00 = plain, 0x01 = Snappy framed
//! body        := L | snappy_framed(L)         one framed stream for all of L
//! L (logical) := changeSetBlock*              handle offsets point into L
//! changeSetBlock := groupCount:i32 group{groupCount}
//! group       := changeCount:i32 keyGroup:i32 change{changeCount}
//! change      := length:i32 payload[length]
//! ```
//!
//! All integers are big-endian `i32`. Decoding never trusts a length: every count and
//! length is checked against the bytes that remain before anything is sized by it.

use std::io::{Read, Write};
use std::ops::Range;
use std::rc::Rc;

/// Key group of a metadata change.
pub const META_KEY_GROUP: i32 = -1;

/// Flag byte of an uncompressed file.
pub const FLAG_PLAIN: u8 = 0;
/// Flag byte of a Snappy-framed file.
pub const FLAG_SNAPPY: u8 = 1;

/// The chunk that opens every Snappy framed stream.
pub const SNAPPY_STREAM_IDENTIFIER: [u8; 10] = [0xff, 6, 0, 0, b's', b'N', b'a', b'P', b'p', b'Y'];

/// A decoded change; key group [`META_KEY_GROUP`] marks metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Key group, or -1 for metadata.
    pub key_group: i32,
    /// The payload.
    pub value: Vec<u8>,
}

/// Why bytes could not be decoded. Offsets are logical (after the flag byte).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The file has no flag byte.
    #[error("empty file: no compression flag byte")]
    Empty,
    /// The flag byte is neither 0 nor 1.
    #[error("unknown compression flag {0:#04x} (expected 0x00 or 0x01)")]
    UnknownFlag(u8),
    /// The Snappy framed stream is malformed.
    #[error("corrupt snappy framed stream: {0}")]
    Snappy(String),
    /// An offset lies beyond the logical bytes.
    #[error("offset {offset} is beyond the logical length {len}")]
    OffsetOutOfRange {
        /// The requested offset.
        offset: u64,
        /// Logical length of the file.
        len: u64,
    },
    /// A block ends before its declared content.
    #[error(
        "truncated change set at logical position {position}: need {needed} more bytes, {available} left"
    )]
    Truncated {
        /// Where the read started.
        position: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes that remain.
        available: u64,
    },
    /// A count or length is negative or cannot fit in what remains.
    #[error("invalid {what} {value} at logical position {position}")]
    InvalidField {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: i64,
        /// Where it stands.
        position: u64,
    },
    /// Bytes follow the end of a change-set block that must stand alone.
    #[error("{extra} bytes after the change set, which ends at position {end}")]
    TrailingBytes {
        /// Where the change set ends.
        end: u64,
        /// Bytes after it.
        extra: u64,
    },
}

/// An open change set. Values stay where they arrived: a packed batch handed over whole
/// is kept as one shared segment (no copy), single values are copied into the builder's
/// own buffer. Each change is one small entry; encoding puts the values in the format's
/// order (metadata, then ascending key group, append order within a group) with a
/// counting sort and copies every value once, straight into the block. Batches a host
/// framed itself, groups as a block holds them ([`ChangeSetBuilder::push_framed_groups`]),
/// follow those groups as they are, never copied: a key group may then have several groups
/// in one block, each key group's changes still in append order.
#[derive(Debug, Default, Clone)]
pub struct ChangeSetBuilder {
    /// Bytes of values pushed one by one.
    own: Vec<u8>,
    /// Shared batches values point into.
    segments: Vec<Rc<Vec<u8>>>,
    entries: Vec<Entry>,
    /// Groups handed over already framed, in arrival order (`push_framed_groups`).
    framed: Vec<FramedRange>,
    /// Changes added after framed groups, framed here (segment [`OWN`] of `framed`).
    own_framed: Vec<u8>,
    framed_groups: usize,
    framed_changes: usize,
    payload: u64,
    /// Scratch of `encode`, kept for its capacity.
    order: Vec<u32>,
    counts: Vec<u32>,
}

/// Where one change's value lies.
#[derive(Debug, Clone, Copy)]
struct Entry {
    key_group: i32,
    /// Index into `segments`, or [`OWN`] for the builder's own buffer.
    segment: u32,
    start: u32,
    len: u32,
}

/// Whole groups, framed as the block frames them, at `segments[segment][start..start + len]`
/// (or at `own_framed[start..start + len]` for segment [`OWN`]).
#[derive(Debug, Clone, Copy)]
struct FramedRange {
    segment: u32,
    start: u32,
    len: u32,
}

/// The segment index of the builder's own buffer.
const OWN: u32 = u32::MAX;

/// Widest key-group span sorted by counting; wider ones use a comparison sort.
const COUNTING_SORT_SPAN: i64 = 1 << 16;

impl ChangeSetBuilder {
    /// Adds a change, copying its value. The caller has validated the key group and
    /// that `value.len()` fits in an `i32`.
    pub fn push(&mut self, key_group: i32, value: &[u8]) {
        if !self.framed.is_empty() {
            return self.push_after_framed(key_group, value);
        }
        let start = self.own.len() as u32;
        self.own.extend_from_slice(value);
        self.record(key_group, OWN, start, value.len() as u32);
    }

    /// Adds a change whose value is `segment[range]`, without copying it. Consecutive
    /// pushes of the same segment share one reference.
    pub fn push_shared(&mut self, key_group: i32, segment: &Rc<Vec<u8>>, range: Range<usize>) {
        if !self.framed.is_empty() {
            return self.push_after_framed(key_group, &segment[range]);
        }
        let index = match self.segments.last() {
            Some(last) if Rc::ptr_eq(last, segment) => self.segments.len() - 1,
            _ => {
                self.segments.push(segment.clone());
                self.segments.len() - 1
            }
        };
        self.record(
            key_group,
            index as u32,
            range.start as u32,
            (range.end - range.start) as u32,
        );
    }

    /// A change added after framed groups: the block's groups of single changes come
    /// before the framed ones, so it is framed too (copied, a group of its own) to keep
    /// its key group's order.
    fn push_after_framed(&mut self, key_group: i32, value: &[u8]) {
        let start = self.own_framed.len();
        self.own_framed.extend_from_slice(&1i32.to_be_bytes());
        self.own_framed.extend_from_slice(&key_group.to_be_bytes());
        self.own_framed
            .extend_from_slice(&(value.len() as i32).to_be_bytes());
        self.own_framed.extend_from_slice(value);
        let len = (self.own_framed.len() - start) as u32;
        match self.framed.last_mut() {
            Some(last) if last.segment == OWN && last.start + last.len == start as u32 => {
                last.len += len;
            }
            _ => self.framed.push(FramedRange {
                segment: OWN,
                start: start as u32,
                len,
            }),
        }
        self.framed_groups += 1;
        self.framed_changes += 1;
        self.payload += value.len() as u64;
    }

    /// Adds `groups` whole groups (holding `changes` changes and `payload` value bytes)
    /// that lie framed as in a block at `segment[range]`: they are lent as they are,
    /// in arrival order, after the groups of the other changes.
    pub fn push_framed_groups(
        &mut self,
        segment: &Rc<Vec<u8>>,
        range: Range<usize>,
        groups: usize,
        changes: usize,
        payload: u64,
    ) {
        let index = match self.segments.last() {
            Some(last) if Rc::ptr_eq(last, segment) => self.segments.len() - 1,
            _ => {
                self.segments.push(segment.clone());
                self.segments.len() - 1
            }
        };
        self.framed.push(FramedRange {
            segment: index as u32,
            start: range.start as u32,
            len: (range.end - range.start) as u32,
        });
        self.framed_groups += groups;
        self.framed_changes += changes;
        self.payload += payload;
    }

    fn record(&mut self, key_group: i32, segment: u32, start: u32, len: u32) {
        self.entries.push(Entry {
            key_group,
            segment,
            start,
            len,
        });
        self.payload += len as u64;
    }

    /// Number of changes.
    pub fn len(&self) -> usize {
        self.entries.len() + self.framed_changes
    }

    /// True when no change was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.framed.is_empty()
    }

    /// Payload bytes (the sum of value lengths).
    pub fn payload_size(&self) -> u64 {
        self.payload
    }

    /// Encodes the change set as one block and leaves the builder empty.
    ///
    /// Groups are written metadata first, then by ascending key group; changes keep their
    /// append order within a group; framed batches follow as they came. Flink writes
    /// groups in `HashMap` order, which readers must not rely on; ascending order
    /// coincides with it for small cases.
    pub fn encode(&mut self) -> Vec<u8> {
        self.finish(u32::MAX).inline
    }

    /// Like [`ChangeSetBuilder::encode`], but values of [`GATHER_MIN`] bytes and more that
    /// arrived in a shared segment, and framed batches, stay there: the [`Block`]
    /// references them, so the one who copies the block out (a host, out of the sandbox)
    /// copies those bytes once instead of twice.
    pub fn block(&mut self) -> Block {
        self.finish(GATHER_MIN)
    }

    /// The block, copying every value shorter than `gather_min` (and every value of the
    /// builder's own buffer) next to its headers; leaves the builder empty.
    fn finish(&mut self, gather_min: u32) -> Block {
        self.sort();
        let order = std::mem::take(&mut self.order);
        let mut groups = 0usize;
        let mut last = None;
        let mut gathered_bytes = 0usize;
        for &i in &order {
            let entry = self.entries[i as usize];
            if last != Some(entry.key_group) {
                groups += 1;
                last = Some(entry.key_group);
            }
            if entry.segment != OWN && entry.len >= gather_min {
                gathered_bytes += entry.len as usize;
            }
        }
        let n = order.len();
        let framed_len: usize = self.framed.iter().map(|f| f.len as usize).sum();
        let framed_payload = framed_len - self.framed_changes * 4 - self.framed_groups * 8;
        let len = 4 + groups * 8 + n * 4 + (self.payload as usize - framed_payload) + framed_len;
        let keep_framed = gather_min != u32::MAX;
        if keep_framed {
            gathered_bytes += self
                .framed
                .iter()
                .filter(|f| f.segment != OWN)
                .map(|f| f.len as usize)
                .sum::<usize>();
        }
        let mut block = Block {
            inline: Vec::with_capacity(len - gathered_bytes),
            segments: Vec::new(),
            gathered: Vec::new(),
            len,
        };
        let out = &mut block.inline;
        out.extend_from_slice(&((groups + self.framed_groups) as i32).to_be_bytes());
        let mut i = 0;
        while i < n {
            let key_group = self.entries[order[i] as usize].key_group;
            let end = i + order[i..]
                .iter()
                .take_while(|&&e| self.entries[e as usize].key_group == key_group)
                .count();
            out.extend_from_slice(&((end - i) as i32).to_be_bytes());
            out.extend_from_slice(&key_group.to_be_bytes());
            for &e in &order[i..end] {
                let entry = self.entries[e as usize];
                out.extend_from_slice(&(entry.len as i32).to_be_bytes());
                let keep = entry.len >= gather_min;
                let range = (entry.segment, entry.start, entry.len);
                self.place(out, &mut block.gathered, &self.own, range, keep);
            }
            i = end;
        }
        for f in &self.framed {
            let range = (f.segment, f.start, f.len);
            self.place(
                out,
                &mut block.gathered,
                &self.own_framed,
                range,
                keep_framed,
            );
        }
        debug_assert_eq!(out.len() + gathered_bytes, len);
        if block.gathered.is_empty() {
            self.segments.clear();
        } else {
            block.segments = std::mem::take(&mut self.segments);
        }
        self.order = order;
        self.order.clear();
        self.own.clear();
        self.entries.clear();
        self.framed.clear();
        self.own_framed.clear();
        self.framed_groups = 0;
        self.framed_changes = 0;
        self.payload = 0;
        block
    }

    /// Puts the bytes `(segment, start, len)` next in the block: copied after `out` if
    /// they are the builder's own (`own`, for segment [`OWN`]) or `keep` is false, else
    /// left where they lie as a piece of the block after `out`'s bytes so far.
    fn place(
        &self,
        out: &mut Vec<u8>,
        gathered: &mut Vec<Gathered>,
        own: &[u8],
        (segment, start, len): (u32, u32, u32),
        keep: bool,
    ) {
        let range = start as usize..(start + len) as usize;
        if segment == OWN {
            out.extend_from_slice(&own[range]);
        } else if keep {
            gathered.push(Gathered {
                at: out.len(),
                segment,
                start,
                len,
            });
        } else {
            out.extend_from_slice(&self.segments[segment as usize][range]);
        }
    }

    /// Fills `order` with the entry indexes sorted by key group, append order kept.
    fn sort(&mut self) {
        let entries = &self.entries;
        order_by_key_group(
            entries.len(),
            |i| entries[i].key_group,
            &mut self.order,
            &mut self.counts,
        );
    }
}

/// Fills `order` with the indexes `0..n`, sorted by `key_group(i)` with append order kept
/// within a key group (a counting sort, `counts` its scratch, unless the key groups span
/// too widely); returns the number of distinct key groups.
fn order_by_key_group(
    n: usize,
    key_group: impl Fn(usize) -> i32,
    order: &mut Vec<u32>,
    counts: &mut Vec<u32>,
) -> usize {
    order.clear();
    let Some(min) = (0..n).map(&key_group).min() else {
        return 0;
    };
    let max = (0..n).map(&key_group).max().unwrap_or(min);
    let span = max as i64 - min as i64 + 1;
    if span > COUNTING_SORT_SPAN {
        order.extend(0..n as u32);
        order.sort_by_key(|&i| key_group(i as usize));
        return order
            .windows(2)
            .filter(|w| key_group(w[0] as usize) != key_group(w[1] as usize))
            .count()
            + 1;
    }
    // Counting sort: where each key group starts, then every index in append order.
    counts.clear();
    counts.resize(span as usize + 1, 0);
    for i in 0..n {
        counts[(key_group(i) as i64 - min as i64) as usize + 1] += 1;
    }
    let groups = counts.iter().filter(|&&c| c > 0).count();
    for k in 1..counts.len() {
        counts[k] += counts[k - 1];
    }
    order.resize(n, 0);
    for i in 0..n {
        let slot = &mut counts[(key_group(i) as i64 - min as i64) as usize];
        order[*slot as usize] = i as u32;
        *slot += 1;
    }
    groups
}

/// What whole framed groups hold ([`framed_groups`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FramedGroups {
    /// Groups.
    pub groups: usize,
    /// Changes in them.
    pub changes: usize,
    /// Their values' bytes.
    pub payload: u64,
}

/// Reads `data` as whole change-set groups (`changeCount keyGroup (length value)*`, as a
/// host frames a batch), checking each group's key group with `key_group`. A frame that
/// does not fit is `Err(Ok(end))`, `end` being where the frames, read as far as they go,
/// say the data ends; a key group `key_group` refuses is `Err(Err(e))`.
pub fn framed_groups<E>(
    data: &[u8],
    mut key_group: impl FnMut(i32) -> Result<(), E>,
) -> Result<FramedGroups, Result<usize, E>> {
    let i32_at = |at: usize| -> Option<i32> {
        Some(i32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?))
    };
    let mut read = FramedGroups::default();
    let mut at = 0usize;
    while at < data.len() {
        let (Some(count), Some(group)) = (i32_at(at), i32_at(at + 4)) else {
            return Err(Ok(at + 8));
        };
        if count < 0 {
            return Err(Ok(at + 8));
        }
        key_group(group).map_err(Err)?;
        at += 8;
        for _ in 0..count {
            let len = i32_at(at).ok_or(Ok(at + 4))?;
            if len < 0 {
                return Err(Ok(at + 4));
            }
            at += 4;
            if data.len() - at < len as usize {
                return Err(Ok(at + len as usize));
            }
            at += len as usize;
            read.payload += len as u64;
        }
        read.groups += 1;
        read.changes += count as usize;
    }
    Ok(read)
}

/// A packed batch (`lengths[i]` bytes of `data` belong to `key_groups[i]`; its columns
/// agree and its lengths add up to its data) as change-set groups, one per key group in
/// ascending order, each key group's changes in append order: what a host hands a writer
/// framed ([`ChangeSetBuilder::push_framed_groups`]), ordering the values in the one copy
/// that brings them to the writer.
#[derive(Debug, Default)]
pub struct FramedBatch {
    order: Vec<u32>,
    counts: Vec<u32>,
    /// Where each value starts in `data`.
    starts: Vec<usize>,
    len: usize,
}

impl FramedBatch {
    /// Orders a batch for [`FramedBatch::write`]; `self` keeps its scratch memory for the
    /// next batch.
    pub fn order(&mut self, key_groups: &[i32], lengths: &[u32]) {
        let groups = order_by_key_group(
            key_groups.len(),
            |i| key_groups[i],
            &mut self.order,
            &mut self.counts,
        );
        self.starts.clear();
        let mut start = 0usize;
        for &len in lengths {
            self.starts.push(start);
            start += len as usize;
        }
        self.len = start + 4 * key_groups.len() + 8 * groups;
    }

    /// Bytes of the framed batch last ordered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a batch of no changes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes the batch last ordered (the same columns) into `out`, [`FramedBatch::len`]
    /// bytes.
    pub fn write(&self, out: &mut [u8], key_groups: &[i32], lengths: &[u32], data: &[u8]) {
        self.write_frames(out, key_groups, lengths, |i, slot| {
            let from = self.starts[i];
            slot.copy_from_slice(&data[from..from + slot.len()]);
        });
    }

    /// Writes the frames of the batch last ordered (the same lengths) into `out`,
    /// [`FramedBatch::len`] bytes, and records where each change's value goes: `offsets[i]`
    /// for change `i`, its `lengths[i]` bytes left for a caller to write (see
    /// [`FramedBatch::write`] for one that copies them).
    pub fn place(
        &self,
        out: &mut [u8],
        key_groups: &[i32],
        lengths: &[u32],
        offsets: &mut Vec<u32>,
    ) {
        offsets.clear();
        offsets.resize(lengths.len(), 0);
        let base = out.as_ptr() as usize;
        self.write_frames(out, key_groups, lengths, |i, slot| {
            offsets[i] = (slot.as_ptr() as usize - base) as u32;
        });
    }

    /// The frames of the batch: group headers and length fields, each change's value slot
    /// handed to `value` with the change's index.
    fn write_frames(
        &self,
        out: &mut [u8],
        key_groups: &[i32],
        lengths: &[u32],
        mut value: impl FnMut(usize, &mut [u8]),
    ) {
        let n = self.order.len();
        let (mut at, mut k) = (0usize, 0usize);
        while k < n {
            let key_group = key_groups[self.order[k] as usize];
            let end = k + self.order[k..]
                .iter()
                .take_while(|&&i| key_groups[i as usize] == key_group)
                .count();
            out[at..at + 4].copy_from_slice(&((end - k) as i32).to_be_bytes());
            out[at + 4..at + 8].copy_from_slice(&key_group.to_be_bytes());
            at += 8;
            for &i in &self.order[k..end] {
                let len = lengths[i as usize] as usize;
                out[at..at + 4].copy_from_slice(&(len as i32).to_be_bytes());
                value(i as usize, &mut out[at + 4..at + 4 + len]);
                at += 4 + len;
            }
            k = end;
        }
    }
}

/// Encodes changes given as `(key group, value)` into one change-set block.
pub fn encode_change_set<'a>(changes: impl IntoIterator<Item = (i32, &'a [u8])>) -> Vec<u8> {
    let mut builder = ChangeSetBuilder::default();
    for (key_group, value) in changes {
        builder.push(key_group, value);
    }
    builder.encode()
}

/// Values of this many bytes and more stay in their segment when a change set becomes a
/// [`Block`]: a smaller value costs less to copy next to its headers than to hand out as
/// a piece of its own.
pub const GATHER_MIN: u32 = 1024;

/// One change-set block as a writer keeps it until upload: the format's bytes in order,
/// as pieces. Headers and small values lie in one inline buffer; large values and framed
/// batches stay in the shared segment they arrived in (see [`ChangeSetBuilder::block`]).
#[derive(Debug, Clone, Default)]
pub struct Block {
    /// Headers and copied values, in block order, with the gathered values left out.
    inline: Vec<u8>,
    /// The segments gathered values lie in.
    segments: Vec<Rc<Vec<u8>>>,
    /// The values left in their segments, by ascending `at`.
    gathered: Vec<Gathered>,
    /// Bytes of the whole block.
    len: usize,
}

/// A value left in its segment: it belongs after the first `at` bytes of `inline`.
#[derive(Debug, Clone, Copy)]
struct Gathered {
    at: usize,
    segment: u32,
    start: u32,
    len: u32,
}

impl Block {
    /// Bytes of the whole block.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a block of no bytes (never one a writer makes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block's bytes in order, as non-empty pieces: concatenated, they are the block.
    pub fn pieces(&self) -> Vec<&[u8]> {
        let mut pieces = Vec::with_capacity(2 * self.gathered.len() + 1);
        let mut from = 0;
        for g in &self.gathered {
            if g.at > from {
                pieces.push(&self.inline[from..g.at]);
            }
            let segment = &self.segments[g.segment as usize];
            pieces.push(&segment[g.start as usize..(g.start + g.len) as usize]);
            from = g.at;
        }
        if self.inline.len() > from {
            pieces.push(&self.inline[from..]);
        }
        pieces
    }

    /// The block's bytes in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        if self.gathered.is_empty() {
            return self.inline.clone();
        }
        let mut out = Vec::with_capacity(self.len);
        for piece in self.pieces() {
            out.extend_from_slice(piece);
        }
        out
    }
}

impl From<Vec<u8>> for Block {
    /// A block whose bytes are all inline.
    fn from(bytes: Vec<u8>) -> Self {
        Self {
            len: bytes.len(),
            inline: bytes,
            segments: Vec::new(),
            gathered: Vec::new(),
        }
    }
}

/// Writes a changelog file: the flag byte, then the logical stream, plain or Snappy framed.
///
/// `position` counts logical bytes written so far; it is the offset the next change-set
/// block will have.
pub struct FileWriter<W: Write> {
    body: Body<W>,
    position: u64,
}

enum Body<W: Write> {
    Plain(W),
    // Boxed: the encoder carries its 64 KiB buffers inline.
    Snappy(Box<snap::write::FrameEncoder<W>>),
}

impl<W: Write> FileWriter<W> {
    /// Starts a file on `out`, writing the flag byte.
    pub fn new(mut out: W, compression: bool) -> std::io::Result<Self> {
        let body = if compression {
            out.write_all(&[FLAG_SNAPPY])?;
            Body::Snappy(Box::new(snap::write::FrameEncoder::new(out)))
        } else {
            out.write_all(&[FLAG_PLAIN])?;
            Body::Plain(out)
        };
        Ok(Self { body, position: 0 })
    }

    /// Logical bytes written so far: the offset of the next block.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Appends one encoded change-set block and returns its logical offset.
    pub fn write_block<'p>(
        &mut self,
        pieces: impl IntoIterator<Item = &'p [u8]>,
    ) -> std::io::Result<u64> {
        let offset = self.position;
        for piece in pieces {
            match &mut self.body {
                Body::Plain(w) => w.write_all(piece)?,
                Body::Snappy(w) => w.write_all(piece)?,
            }
            self.position += piece.len() as u64;
        }
        Ok(offset)
    }

    /// Ends the stream (flushing the last Snappy chunk) and returns the writer.
    pub fn finish(self) -> std::io::Result<W> {
        match self.body {
            Body::Plain(mut w) => {
                w.flush()?;
                Ok(w)
            }
            Body::Snappy(w) => {
                let mut out = w
                    .into_inner()
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                // The encoder writes the stream identifier with the first chunk; an empty
                // stream still gets one, as Flink's writer does.
                if self.position == 0 {
                    out.write_all(&SNAPPY_STREAM_IDENTIFIER)?;
                }
                Ok(out)
            }
        }
    }
}

/// An uncompressed file holding `blocks`, each given as its pieces in order, as parts to
/// write one after the other (the flag byte, then every piece as it is, so nothing is
/// copied), with each block's logical offset and the logical length.
pub fn plain_file<'a, B: IntoIterator<Item = &'a [u8]>>(
    blocks: impl IntoIterator<Item = B>,
) -> (Vec<&'a [u8]>, Vec<u64>, u64) {
    let mut parts: Vec<&'a [u8]> = vec![&[FLAG_PLAIN]];
    let mut offsets = Vec::new();
    let mut position = 0u64;
    for block in blocks {
        offsets.push(position);
        for piece in block {
            position += piece.len() as u64;
            parts.push(piece);
        }
    }
    (parts, offsets, position)
}

/// The layout of an uncompressed file of blocks with these sizes: the header to write
/// before the blocks (the flag byte), each block's logical offset, and the logical
/// length. For hosts that write the blocks themselves, without handing them to the codec.
pub fn plain_layout(block_sizes: impl IntoIterator<Item = u64>) -> (Vec<u8>, Vec<u64>, u64) {
    let mut offsets = Vec::new();
    let mut position = 0u64;
    for size in block_sizes {
        offsets.push(position);
        position += size;
    }
    (vec![FLAG_PLAIN], offsets, position)
}

/// Turns the bytes of a whole changelog file into its logical stream.
///
/// A plain file's logical bytes are borrowed; a compressed one is decompressed once.
pub fn logical_bytes(file: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, FormatError> {
    match file.split_first() {
        None => Err(FormatError::Empty),
        Some((&FLAG_PLAIN, rest)) => Ok(std::borrow::Cow::Borrowed(rest)),
        Some((&FLAG_SNAPPY, rest)) => {
            let mut out = Vec::new();
            snap::read::FrameDecoder::new(rest)
                .read_to_end(&mut out)
                .map_err(|e| FormatError::Snappy(e.to_string()))?;
            Ok(std::borrow::Cow::Owned(out))
        }
        Some((&flag, _)) => Err(FormatError::UnknownFlag(flag)),
    }
}

/// A change-set block located in a logical stream; yields its changes in file order,
/// group by group.
pub struct ChangeSetReader<'a> {
    input: &'a [u8],
    /// The logical position of `input[0]`: positions in errors are the file's.
    base: u64,
    pos: usize,
    groups_left: u32,
    changes_left: u32,
    key_group: i32,
}

impl<'a> ChangeSetReader<'a> {
    /// Opens the block at `offset` of `logical`.
    pub fn new(logical: &'a [u8], offset: u64) -> Result<Self, FormatError> {
        Self::in_range(logical, 0, offset)
    }

    /// Opens the block at logical `offset` of a file whose logical bytes from `start` on
    /// are `range` (a ranged read); errors give the file's logical positions.
    pub fn in_range(range: &'a [u8], start: u64, offset: u64) -> Result<Self, FormatError> {
        let end = start.saturating_add(range.len() as u64);
        if offset < start || offset > end {
            return Err(FormatError::OffsetOutOfRange { offset, len: end });
        }
        let mut reader = Self {
            input: range,
            base: start,
            pos: (offset - start) as usize,
            groups_left: 0,
            changes_left: 0,
            key_group: 0,
        };
        let groups = reader.read_count("group count", 8)?;
        reader.groups_left = groups;
        Ok(reader)
    }

    /// Logical position just past what was read so far.
    pub fn position(&self) -> u64 {
        self.here()
    }

    /// [`ChangeSetReader::position`], by a name `Iterator::position` does not shadow.
    fn here(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    fn read_i32(&mut self) -> Result<i32, FormatError> {
        let Some(bytes) = self.input.get(self.pos..self.pos + 4) else {
            return Err(FormatError::Truncated {
                position: self.here(),
                needed: 4,
                available: self.remaining() as u64,
            });
        };
        self.pos += 4;
        Ok(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Reads a count whose every unit needs at least `min_unit` more bytes, so a count the
    /// remaining bytes cannot hold is rejected before anything is sized by it.
    fn read_count(&mut self, what: &'static str, min_unit: u64) -> Result<u32, FormatError> {
        let position = self.here();
        let value = self.read_i32()?;
        check_count(what, value, position, min_unit, self.remaining() as u64)
    }

    /// The next change, `None` at the end of the block.
    pub fn next_change(&mut self) -> Result<Option<Change>, FormatError> {
        Ok(self.next_borrowed()?.map(|(key_group, value)| Change {
            key_group,
            value: value.to_vec(),
        }))
    }

    /// The next change's key group and value, borrowed from the logical bytes (nothing is
    /// copied); `None` at the end of the block.
    pub fn next_borrowed(&mut self) -> Result<Option<(i32, &'a [u8])>, FormatError> {
        while self.changes_left == 0 {
            if self.groups_left == 0 {
                return Ok(None);
            }
            self.groups_left -= 1;
            let changes = self.read_count("change count", 4)?;
            let position = self.here();
            self.key_group = key_group_field(self.read_i32()?, position)?;
            self.changes_left = changes;
        }
        let position = self.here();
        let len = length_field(self.read_i32()?, position)? as usize;
        if len > self.remaining() {
            return Err(FormatError::Truncated {
                position: self.here(),
                needed: len as u64,
                available: self.remaining() as u64,
            });
        }
        let value = &self.input[self.pos..self.pos + len];
        self.pos += len;
        self.changes_left -= 1;
        Ok(Some((self.key_group, value)))
    }
}

impl Iterator for ChangeSetReader<'_> {
    type Item = Result<Change, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_change() {
            Ok(Some(change)) => Some(Ok(change)),
            Ok(None) => None,
            Err(e) => {
                // Stop after the first error: nothing after it can be trusted.
                self.groups_left = 0;
                self.changes_left = 0;
                Some(Err(e))
            }
        }
    }
}

/// The payload (the sum of the value lengths) of the block that `pieces` make when put
/// together, which must be exactly one well-formed change-set block: what a host counts
/// against its limits instead of the size a writer claims for the block. The pieces are
/// read where they lie (a host checks a block in a sandbox's memory without joining it);
/// errors name positions in the joined block, as [`ChangeSetReader`]'s do.
pub fn block_payload(pieces: &[&[u8]]) -> Result<u64, FormatError> {
    let mut input = Pieces::new(pieces);
    let groups = input.read_count("group count", 8)?;
    let mut payload = 0u64;
    for _ in 0..groups {
        let changes = input.read_count("change count", 4)?;
        let position = input.position;
        key_group_field(input.read_i32()?, position)?;
        for _ in 0..changes {
            let position = input.position;
            let len = length_field(input.read_i32()?, position)?;
            input.skip(len)?;
            payload += len;
        }
    }
    match input.remaining() {
        0 => Ok(payload),
        extra => Err(FormatError::TrailingBytes {
            end: input.position,
            extra,
        }),
    }
}

/// A group's key group read at `position`: metadata's or a data key group.
fn key_group_field(key_group: i32, position: u64) -> Result<i32, FormatError> {
    if key_group < META_KEY_GROUP {
        return Err(FormatError::InvalidField {
            what: "key group",
            value: key_group as i64,
            position,
        });
    }
    Ok(key_group)
}

/// A value's length read at `position`.
fn length_field(len: i32, position: u64) -> Result<u64, FormatError> {
    u64::try_from(len).map_err(|_| FormatError::InvalidField {
        what: "value length",
        value: len as i64,
        position,
    })
}

/// `value`, a count read at `position`, if every unit it counts can have at least
/// `min_unit` of the `remaining` bytes: a count they cannot hold is refused before
/// anything is sized by it.
fn check_count(
    what: &'static str,
    value: i32,
    position: u64,
    min_unit: u64,
    remaining: u64,
) -> Result<u32, FormatError> {
    if value < 0 || (value as u64).saturating_mul(min_unit) > remaining {
        return Err(FormatError::InvalidField {
            what,
            value: value as i64,
            position,
        });
    }
    Ok(value as u32)
}

/// Byte pieces read front to back as if they were joined.
struct Pieces<'a> {
    pieces: &'a [&'a [u8]],
    /// The piece being read, and the position in it.
    piece: usize,
    at: usize,
    /// Position in the joined bytes.
    position: u64,
    len: u64,
}

impl<'a> Pieces<'a> {
    fn new(pieces: &'a [&'a [u8]]) -> Self {
        Self {
            pieces,
            piece: 0,
            at: 0,
            position: 0,
            len: pieces.iter().map(|p| p.len() as u64).sum(),
        }
    }

    fn remaining(&self) -> u64 {
        self.len - self.position
    }

    /// Moves `n` bytes on; the caller has checked that they remain.
    fn advance(&mut self, mut n: usize) {
        self.position += n as u64;
        while n > 0 {
            let left = self.pieces[self.piece].len() - self.at;
            if n < left {
                self.at += n;
                return;
            }
            n -= left;
            self.piece += 1;
            self.at = 0;
        }
    }

    fn truncated(&self, needed: u64) -> FormatError {
        FormatError::Truncated {
            position: self.position,
            needed,
            available: self.remaining(),
        }
    }

    fn read_i32(&mut self) -> Result<i32, FormatError> {
        if self.remaining() < 4 {
            return Err(self.truncated(4));
        }
        while self.at == self.pieces[self.piece].len() {
            self.piece += 1;
            self.at = 0;
        }
        let mut bytes = [0u8; 4];
        match self.pieces[self.piece].get(self.at..self.at + 4) {
            // The common case: the field lies in one piece.
            Some(field) => {
                bytes.copy_from_slice(field);
                self.advance(4);
            }
            None => {
                for byte in &mut bytes {
                    while self.at == self.pieces[self.piece].len() {
                        self.piece += 1;
                        self.at = 0;
                    }
                    *byte = self.pieces[self.piece][self.at];
                    self.advance(1);
                }
            }
        }
        Ok(i32::from_be_bytes(bytes))
    }

    /// As [`ChangeSetReader`]'s.
    fn read_count(&mut self, what: &'static str, min_unit: u64) -> Result<u32, FormatError> {
        let position = self.position;
        let value = self.read_i32()?;
        check_count(what, value, position, min_unit, self.remaining())
    }

    fn skip(&mut self, n: u64) -> Result<(), FormatError> {
        if n > self.remaining() {
            return Err(self.truncated(n));
        }
        self.advance(n as usize);
        Ok(())
    }
}

/// Decodes the change-set block at `offset` of `logical` into its changes.
pub fn decode_change_set(logical: &[u8], offset: u64) -> Result<Vec<Change>, FormatError> {
    ChangeSetReader::new(logical, offset)?.collect()
}

/// Writes a whole file holding `blocks` in order; returns the bytes and each block's offset.
pub fn encode_file(blocks: &[Vec<u8>], compression: bool) -> std::io::Result<(Vec<u8>, Vec<u64>)> {
    let mut writer = FileWriter::new(Vec::new(), compression)?;
    let offsets = blocks
        .iter()
        .map(|b| writer.write_block([b.as_slice()]))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok((writer.finish()?, offsets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A worked example, checked byte for byte against Flink 2.3.0's own classes.
    fn example_blocks() -> Vec<Vec<u8>> {
        vec![
            encode_change_set([
                (5, &[1u8, 2][..]),
                (META_KEY_GROUP, &[0x4d][..]),
                (2, &[0xaa][..]),
                (5, &[3][..]),
            ]),
            encode_change_set([(7, &[0xbb, 0xcc][..])]),
        ]
    }

    const EXAMPLE_PLAIN: [u8; 68] = [
        0x00, // flag
        0, 0, 0, 3, // 3 groups
        0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0x4d, // meta
        0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0xaa, // kg 2
        0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 2, 1, 2, 0, 0, 0, 1, 3, // kg 5
        0, 0, 0, 1, // 1 group
        0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 2, 0xbb, 0xcc, // kg 7
    ];

    #[test]
    fn worked_example_bytes_are_exact() {
        let (file, offsets) = encode_file(&example_blocks(), false).unwrap();
        assert_eq!(file, EXAMPLE_PLAIN);
        assert_eq!(offsets, vec![0, 49]);
    }

    #[test]
    fn plain_parts_match_the_written_file() {
        let blocks = example_blocks();
        let (parts, offsets, logical) = plain_file(blocks.iter().map(|b| [b.as_slice()]));
        assert_eq!(parts.concat(), EXAMPLE_PLAIN);
        assert_eq!((offsets, logical), (vec![0, 49], 67));
    }

    #[test]
    fn worked_example_reads_back_metadata_first() {
        let logical = logical_bytes(&EXAMPLE_PLAIN).unwrap();
        assert_eq!(logical.len(), 67);
        let mut all = decode_change_set(&logical, 0).unwrap();
        all.extend(decode_change_set(&logical, 49).unwrap());
        let got: Vec<(i32, Vec<u8>)> = all.into_iter().map(|c| (c.key_group, c.value)).collect();
        assert_eq!(
            got,
            vec![
                (-1, vec![0x4d]),
                (2, vec![0xaa]),
                (5, vec![1, 2]),
                (5, vec![3]),
                (7, vec![0xbb, 0xcc])
            ]
        );
    }

    #[test]
    fn flink_compressed_example_decodes() {
        // The same data as Flink writes it with compression on.
        let mut file = vec![
            0x01, 0xff, 0x06, 0x00, 0x00, 0x73, 0x4e, 0x61, 0x50, 0x70, 0x59,
        ];
        file.extend_from_slice(&[0x00, 0x3c, 0x00, 0x00, 0x7a, 0x3c, 0x7c, 0x55]);
        file.extend_from_slice(&[
            0x43, 0x2c, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0xff, 0xff, 0xff, 0xff,
            0x01, 0x08, 0x00, 0x4d, 0x01, 0x05, 0x0c, 0x00, 0x00, 0x00, 0x02, 0x01, 0x08, 0x00,
            0xaa, 0x0d, 0x09, 0x00, 0x05, 0x01, 0x08, 0x00, 0x01, 0x05, 0x13, 0x05, 0x2d, 0x34,
            0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x02, 0xbb, 0xcc,
        ]);
        assert_eq!(file.len(), 75);
        let logical = logical_bytes(&file).unwrap();
        assert_eq!(&logical[..], &EXAMPLE_PLAIN[1..]);
    }

    #[test]
    fn compressed_round_trip_has_same_offsets() {
        let (file, offsets) = encode_file(&example_blocks(), true).unwrap();
        assert_eq!(file[0], FLAG_SNAPPY);
        assert_eq!(
            &file[1..11],
            &[0xff, 6, 0, 0, b's', b'N', b'a', b'P', b'p', b'Y']
        );
        assert_eq!(offsets, vec![0, 49]);
        assert_eq!(&logical_bytes(&file).unwrap()[..], &EXAMPLE_PLAIN[1..]);
    }

    #[test]
    fn empty_change_set_reads_as_nothing() {
        assert_eq!(decode_change_set(&[0, 0, 0, 0], 0).unwrap(), vec![]);
        assert_eq!(encode_change_set([]), vec![0, 0, 0, 0]);
    }

    #[test]
    fn corrupt_input_is_a_typed_error() {
        assert_eq!(logical_bytes(&[]), Err(FormatError::Empty));
        assert_eq!(logical_bytes(&[7, 1]), Err(FormatError::UnknownFlag(7)));
        assert!(matches!(
            logical_bytes(&[1, 0xff, 6, 0, 0, b'x']),
            Err(FormatError::Snappy(_))
        ));
        assert!(matches!(
            decode_change_set(&EXAMPLE_PLAIN[1..], 68),
            Err(FormatError::OffsetOutOfRange {
                offset: 68,
                len: 67
            })
        ));
        // A huge group count is refused before anything is sized by it.
        assert!(matches!(
            decode_change_set(&[0x7f, 0xff, 0xff, 0xff], 0),
            Err(FormatError::InvalidField {
                what: "group count",
                ..
            })
        ));
        // A negative value length.
        let bad = [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xfe];
        assert!(matches!(
            decode_change_set(&bad, 0),
            Err(FormatError::InvalidField {
                what: "value length",
                value: -2,
                ..
            })
        ));
        // Every strict prefix of a valid block fails cleanly.
        let block = &EXAMPLE_PLAIN[1..50];
        for cut in 0..block.len() {
            assert!(decode_change_set(&block[..cut], 0).is_err(), "prefix {cut}");
        }
    }

    #[test]
    fn block_payload_counts_values_and_refuses_anything_but_one_block() {
        let block = encode_change_set([(3, &b"abc"[..]), (-1, b""), (3, b"de")]);
        assert_eq!(block_payload(&[&block]), Ok(5));
        assert_eq!(
            block_payload(&[&block[..3], &[], &block[3..9], &block[9..]]),
            Ok(5)
        );
        assert_eq!(block_payload(&[&encode_change_set([])]), Ok(0));
        let mut trailing = block.clone();
        trailing.push(0);
        assert_eq!(
            block_payload(&[&trailing]),
            Err(FormatError::TrailingBytes {
                end: block.len() as u64,
                extra: 1
            })
        );
        assert!(matches!(
            block_payload(&[&block[..block.len() - 1]]),
            Err(FormatError::Truncated { .. })
        ));
        assert!(block_payload(&[]).is_err());
        assert!(
            block_payload(&[&[0; 4096]]).is_err(),
            "zeros are not a block"
        );
    }

    /// The payload of one block by [`ChangeSetReader`], the reader of files.
    fn reader_payload(block: &[u8]) -> Result<u64, FormatError> {
        let mut reader = ChangeSetReader::new(block, 0)?;
        let mut payload = 0u64;
        while let Some((_, value)) = reader.next_borrowed()? {
            payload += value.len() as u64;
        }
        match block.len() as u64 - reader.position() {
            0 => Ok(payload),
            extra => Err(FormatError::TrailingBytes {
                end: reader.position(),
                extra,
            }),
        }
    }

    /// A builder holding `changes`: the first `split` pushed one by one (copied), the rest
    /// handed over as `segments` shared segments.
    fn builder_of(changes: &[(i32, Vec<u8>)], split: usize, segments: usize) -> ChangeSetBuilder {
        let split = split.min(changes.len());
        let mut builder = ChangeSetBuilder::default();
        for (k, v) in &changes[..split] {
            builder.push(*k, v);
        }
        let shared = &changes[split..];
        for part in shared.chunks(shared.len().div_ceil(segments).max(1)) {
            let segment = Rc::new(
                part.iter()
                    .flat_map(|(_, v)| v.clone())
                    .collect::<Vec<u8>>(),
            );
            let mut start = 0;
            for (k, v) in part {
                builder.push_shared(*k, &segment, start..start + v.len());
                start += v.len();
            }
        }
        builder
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), offset in 0u64..600) {
            if let Ok(logical) = logical_bytes(&bytes) {
                let _ = decode_change_set(&logical, offset);
            }
            let _ = decode_change_set(&bytes, offset);
            let _ = block_payload(&[&bytes]);
        }

        /// Checking a block in pieces gives the reader's verdict on the joined bytes:
        /// the same payload, or the same error at the same position.
        #[test]
        fn block_payload_in_pieces_agrees_with_the_reader(
            changes in proptest::collection::vec((-2i32..5, 0usize..20), 0..12),
            corrupt in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
            cut in 0usize..4,
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let values: Vec<(i32, Vec<u8>)> = changes.iter().map(|&(k, n)| (k.max(-1), vec![7; n])).collect();
            let mut block = encode_change_set(values.iter().map(|(k, v)| (*k, &v[..])));
            if let Some((at, byte)) = corrupt {
                let at = at.index(block.len());
                block[at] = byte;
            }
            block.truncate(block.len() - cut.min(block.len()));
            let mut bounds: Vec<usize> = cuts.iter().map(|i| i.index(block.len() + 1)).collect();
            bounds.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for b in bounds.into_iter().chain([block.len()]) {
                pieces.push(&block[from..b]);
                from = b;
            }
            prop_assert_eq!(block_payload(&pieces), reader_payload(&block));
        }

        /// Values handed over as shared segments, copied one by one, or both, and key
        /// groups spread wide enough to leave the counting sort: the same block.
        #[test]
        fn shared_segments_encode_like_copied_values(
            changes in proptest::collection::vec((-1i32..20, proptest::collection::vec(any::<u8>(), 0..40)), 0..60),
            split in 0usize..60,
            wide in any::<bool>(),
        ) {
            let changes: Vec<(i32, Vec<u8>)> = changes
                .into_iter()
                .map(|(k, v)| (if wide && k > 10 { k * 1_000_000 } else { k }, v))
                .collect();
            let copied = encode_change_set(changes.iter().map(|(k, v)| (*k, &v[..])));
            let mut builder = builder_of(&changes, split, 1);
            prop_assert_eq!(builder.payload_size(), changes.iter().map(|c| c.1.len() as u64).sum::<u64>());
            let encoded = builder.encode();
            prop_assert_eq!(block_payload(&[&encoded]), Ok(changes.iter().map(|c| c.1.len() as u64).sum::<u64>()));
            prop_assert_eq!(encoded, copied);
            prop_assert!(builder.is_empty());
        }

        /// `place` frames a batch as `write` does, leaving each value to its caller at the
        /// offset it gives.
        #[test]
        fn a_placed_batch_is_the_written_one_once_its_values_are_in_place(
            changes in proptest::collection::vec((-1i32..6, proptest::collection::vec(any::<u8>(), 0..40)), 0..60),
        ) {
            let key_groups: Vec<i32> = changes.iter().map(|c| c.0).collect();
            let lengths: Vec<u32> = changes.iter().map(|c| c.1.len() as u32).collect();
            let data: Vec<u8> = changes.iter().flat_map(|c| c.1.clone()).collect();
            let mut batch = FramedBatch::default();
            batch.order(&key_groups, &lengths);
            let mut written = vec![0u8; batch.len()];
            batch.write(&mut written, &key_groups, &lengths, &data);
            let mut placed = vec![0u8; batch.len()];
            let mut offsets = Vec::new();
            batch.place(&mut placed, &key_groups, &lengths, &mut offsets);
            for (i, (_, value)) in changes.iter().enumerate() {
                let at = offsets[i] as usize;
                placed[at..at + value.len()].copy_from_slice(value);
            }
            prop_assert_eq!(placed, written);
        }

        /// Changes handed over framed, in batches of groups in any order, beside changes
        /// pushed one by one: the block holds the same changes, each key group's in the
        /// order they were added, lends the framed bytes as they are, and `encode` makes
        /// the same bytes.
        #[test]
        fn framed_groups_keep_each_key_groups_order(
            changes in proptest::collection::vec((-1i32..6, proptest::collection::vec(any::<u8>(), 0..40)), 0..60),
            single in proptest::collection::vec(any::<bool>(), 60),
            batch in 1usize..12,
        ) {
            let mut builder = ChangeSetBuilder::default();
            let mut i = 0;
            while i < changes.len() {
                if single[i] {
                    builder.push(changes[i].0, &changes[i].1);
                    i += 1;
                    continue;
                }
                // A batch framed as a host does: its groups by descending key group.
                let end = (i + batch).min(changes.len());
                let mut part: Vec<&(i32, Vec<u8>)> = changes[i..end].iter().collect();
                part.sort_by_key(|c| std::cmp::Reverse(c.0));
                let mut framed = Vec::new();
                let (mut groups, mut payload) = (0, 0);
                for run in part.chunk_by(|a, b| a.0 == b.0) {
                    framed.extend_from_slice(&(run.len() as i32).to_be_bytes());
                    framed.extend_from_slice(&run[0].0.to_be_bytes());
                    for (_, v) in run {
                        framed.extend_from_slice(&(v.len() as i32).to_be_bytes());
                        framed.extend_from_slice(v);
                        payload += v.len() as u64;
                    }
                    groups += 1;
                }
                let len = framed.len();
                builder.push_framed_groups(&Rc::new(framed), 0..len, groups, end - i, payload);
                i = end;
            }
            prop_assert_eq!(builder.len(), changes.len());
            let total: u64 = changes.iter().map(|c| c.1.len() as u64).sum();
            prop_assert_eq!(builder.payload_size(), total);
            let mut copy = builder.clone();
            let block = builder.block();
            let joined = block.pieces().concat();
            prop_assert_eq!(block.len(), joined.len());
            prop_assert_eq!(copy.encode(), joined.clone());
            prop_assert_eq!(block_payload(&block.pieces()), Ok(total));
            let read = decode_change_set(&joined, 0).unwrap();
            for key_group in -1..6 {
                let want: Vec<&Vec<u8>> = changes.iter().filter(|c| c.0 == key_group).map(|c| &c.1).collect();
                let got: Vec<&Vec<u8>> = read.iter().filter(|c| c.key_group == key_group).map(|c| &c.value).collect();
                prop_assert_eq!(got, want);
            }
        }

        /// A block keeps large shared values in their segments; its pieces, put together,
        /// are the block `encode` makes, and no piece is empty.
        #[test]
        fn block_pieces_make_the_encoded_block(
            changes in proptest::collection::vec((-1i32..8, 0usize..3000), 0..40),
            split in 0usize..40,
            segments in 1usize..4,
        ) {
            let changes: Vec<(i32, Vec<u8>)> = changes
                .into_iter()
                .enumerate()
                .map(|(i, (k, len))| (k, vec![i as u8; len]))
                .collect();
            let copied = encode_change_set(changes.iter().map(|(k, v)| (*k, &v[..])));
            let mut builder = builder_of(&changes, split, segments);
            let shared = &changes[split.min(changes.len())..];
            let block = builder.block();
            prop_assert!(builder.is_empty());
            prop_assert_eq!(block.len(), copied.len());
            let pieces = block.pieces();
            prop_assert!(pieces.iter().all(|p| !p.is_empty()));
            let large = shared.iter().filter(|(_, v)| v.len() >= GATHER_MIN as usize).count();
            prop_assert!(pieces.len() <= 2 * large + 1);
            prop_assert_eq!(pieces.concat(), copied.clone());
            prop_assert_eq!(block.to_vec(), copied);
        }

        #[test]
        fn round_trip_keeps_per_key_group_order(
            changes in proptest::collection::vec((-1i32..20, proptest::collection::vec(any::<u8>(), 0..40)), 0..60),
            compression in any::<bool>(),
        ) {
            let block = encode_change_set(changes.iter().map(|(k, v)| (*k, &v[..])));
            let (file, offsets) = encode_file(&[block.clone(), block], compression).unwrap();
            let logical = logical_bytes(&file).unwrap();
            for offset in offsets {
                let got = decode_change_set(&logical, offset).unwrap();
                let mut expected = changes.clone();
                expected.sort_by_key(|c| c.0);
                let got: Vec<(i32, Vec<u8>)> = got.into_iter().map(|c| (c.key_group, c.value)).collect();
                prop_assert_eq!(got, expected);
            }
        }
    }
}
