//! Feeds arbitrary bytes to the changelog codec as a whole file: `logical_bytes` (flag
//! byte, Snappy framing), then `decode_change_set` at offsets derived from the input, and
//! a walk over every block. Decoding must never panic, loop or allocate by an untrusted
//! length; whatever decodes must survive a re-encode unchanged (per key group, in order).

#![no_main]

use std::collections::BTreeMap;

use dstl_proto::codec::{self, Change, ChangeSetReader};
use libfuzzer_sys::fuzz_target;

/// Changes grouped by key group, each group in order: what the format preserves.
fn by_key_group(changes: &[Change]) -> BTreeMap<i32, Vec<&[u8]>> {
    let mut groups: BTreeMap<i32, Vec<&[u8]>> = BTreeMap::new();
    for change in changes {
        groups
            .entry(change.key_group)
            .or_default()
            .push(&change.value);
    }
    groups
}

fn check_decoded(logical: &[u8], offset: u64, changes: &[Change]) {
    let payload: usize = changes.iter().map(|c| c.value.len()).sum();
    assert!(
        payload <= logical.len(),
        "{payload} payload bytes decoded from {} logical bytes at {offset}",
        logical.len()
    );
    assert!(changes.iter().all(|c| c.key_group >= codec::META_KEY_GROUP));
    let block = codec::encode_change_set(changes.iter().map(|c| (c.key_group, &c.value[..])));
    let again = codec::decode_change_set(&block, 0).expect("a re-encoded block decodes");
    assert_eq!(by_key_group(changes), by_key_group(&again));
    let mut reader = ChangeSetReader::new(&block, 0).unwrap();
    while reader.next_change().unwrap().is_some() {}
    assert_eq!(
        reader.position(),
        block.len() as u64,
        "the block is read to its end"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(logical) = codec::logical_bytes(data) else {
        return;
    };
    let len = logical.len() as u64;
    // Offsets: the ends, and a few chosen by the input's last bytes.
    let mut offsets = vec![0, len, len.saturating_sub(1), len + 1, u64::MAX];
    for chunk in data.rchunks(8).take(3) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let n = u64::from_le_bytes(word);
        offsets.push(n);
        offsets.push(n % (len + 1));
    }
    for offset in offsets {
        match codec::decode_change_set(&logical, offset) {
            Ok(changes) => check_decoded(&logical, offset, &changes),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    // Walk the stream block by block, as a reader of a whole file would.
    let mut offset = 0u64;
    while offset < len {
        let Ok(mut reader) = ChangeSetReader::new(&logical, offset) else {
            break;
        };
        let mut changes = Vec::new();
        let ok = loop {
            match reader.next_change() {
                Ok(Some(change)) => changes.push(change),
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        if !ok {
            break;
        }
        let next = reader.position();
        assert!(
            next > offset,
            "a block at {offset} does not advance the reader"
        );
        assert!(next <= len);
        check_decoded(&logical, offset, &changes);
        offset = next;
    }
});
