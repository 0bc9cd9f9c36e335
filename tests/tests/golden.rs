//! The files Apache Flink 2.3.0 wrote (`tests/golden/`) must read back exactly as Flink's
//! own reader returns them: through the host's reader, and through the writer component's
//! decoder running in its wasmtime sandbox. Damaged copies must give typed errors naming
//! the file, never a panic or a trap.

use std::collections::BTreeMap;
use std::path::Path;

use dstl::FileError;
use dstl::codec::{ChangeSetReader, FormatError};
use dstl::reader::{self, ReadError};
use dstl::{Change, ChangelogHandle, ChangelogStorage, ComponentCodec};
use dstl_tests::golden::{
    ExpectedFormat, GoldenSet, GoldenSnapshot, canonical, copy_set, golden_digest,
    parse_handles_file, sha256_hex,
};
use dstl_tests::harness::{in_temp_dir, open_temp};
use tempfile::TempDir;

fn lines(format: ExpectedFormat, changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| format.line(c.key_group, &c.value))
        .collect()
}

/// A storage on a fresh directory, for its component decoder.
fn decoder() -> (tempfile::TempDir, ChangelogStorage, ComponentCodec) {
    let (tmp, storage) = open_temp(&["dstl.writer.max-writers=4"]);
    let decoder = storage
        .component_codec()
        .expect("component decoder instantiates");
    (tmp, storage, decoder)
}

/// The change-set offsets of a logical stream, found by walking it with the host codec.
fn change_set_offsets(logical: &[u8]) -> Vec<u64> {
    let mut offsets = Vec::new();
    let mut offset = 0u64;
    while offset < logical.len() as u64 {
        offsets.push(offset);
        let mut reader = ChangeSetReader::new(logical, offset).unwrap();
        while reader.next_change().unwrap().is_some() {}
        assert!(reader.position() > offset, "a change set has bytes");
        offset = reader.position();
    }
    assert_eq!(offset, logical.len() as u64, "change sets tile the stream");
    offsets
}

#[test]
fn golden_files_match_their_inventory() {
    for set in GoldenSet::all() {
        assert!(!set.files.is_empty(), "{}: no files listed", set.name);
        assert!(
            !set.snapshots.is_empty(),
            "{}: no snapshots listed",
            set.name
        );
        for file in &set.files {
            let bytes = std::fs::read(&file.path)
                .unwrap_or_else(|e| panic!("{}: {e}", file.path.display()));
            assert_eq!(bytes.len() as u64, file.size, "{}", file.path.display());
            assert_eq!(sha256_hex(&bytes), file.sha256, "{}", file.path.display());
            let flag = if set.compression { 1 } else { 0 };
            assert_eq!(bytes[0], flag, "{}: compression flag", file.path.display());
        }
        // Every file the snapshots name is listed, and every file on disk is listed.
        let listed: Vec<_> = set.files.iter().map(|f| canonical(&f.path)).collect();
        for snapshot in &set.snapshots {
            for handle in &snapshot.handles {
                assert!(
                    listed.contains(&canonical(&handle.path)),
                    "{} {}: {} not in `files`",
                    set.name,
                    snapshot.name,
                    handle.relative
                );
            }
        }
        let dstl_dir = set.files[0].path.parent().unwrap();
        let on_disk = std::fs::read_dir(dstl_dir).unwrap().count();
        assert_eq!(on_disk, set.files.len(), "{}: files on disk", set.name);
        assert!(set.dir.join(&set.appends_file).is_file());
    }
}

#[test]
fn handles_files_agree_with_manifest() {
    for set in GoldenSet::all() {
        for snapshot in &set.snapshots {
            let parsed = parse_handles_file(&snapshot.handles_file);
            let what = format!("{} {}", set.name, snapshot.name);
            assert_eq!(parsed.name, snapshot.name, "{what}");
            assert_eq!(parsed.key_group_range, snapshot.key_group_range, "{what}");
            assert_eq!(parsed.handles.len(), snapshot.handles.len(), "{what}");
            for ((path, offset, size), handle) in parsed.handles.iter().zip(&snapshot.handles) {
                assert_eq!(canonical(path), canonical(&handle.path), "{what}");
                assert_eq!(*offset, handle.offset, "{what}");
                assert_eq!(*size, handle.file_size, "{what}");
            }
        }
    }
}

#[test]
fn host_reader_reads_every_golden_snapshot_exactly() {
    let mut snapshots = 0;
    for set in GoldenSet::all() {
        for snapshot in &set.snapshots {
            let what = format!("{} {}", set.name, snapshot.name);
            let changes = reader::read_handle(&snapshot.handle(), &dstl::FileSource::new(None))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                lines(set.format, &changes),
                snapshot.expected_lines(),
                "{what}: changes differ from {}",
                snapshot.expected_file.display()
            );
            assert_eq!(changes.len(), snapshot.expected_count, "{what}: count");
            assert_eq!(
                reader::digest(&changes),
                snapshot.expected_sha256,
                "{what}: dstl::reader::digest"
            );
            assert_eq!(
                golden_digest(changes.iter().map(|c| (c.key_group, c.value.as_slice()))),
                snapshot.expected_sha256,
                "{what}: digest computed by the test"
            );
            snapshots += 1;
        }
    }
    assert_eq!(snapshots, 8 + 8 + 2);
}

#[test]
fn golden_snapshots_hold_what_was_appended() {
    // Independent of Flink's reader order: per key group, the snapshot holds exactly the
    // writer's appends with sequence numbers in [sqnFrom, sqnTo), in append order.
    for set in GoldenSet::all() {
        if set.appends_file.ends_with(".gz") {
            continue; // no gzip decoder among the test dependencies; .expected covers it
        }
        let text = std::fs::read_to_string(set.dir.join(&set.appends_file)).unwrap();
        let appends: Vec<(u64, u64, i32, String)> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 5, "appends line {l:?}");
                (
                    f[0].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                    f[4].to_string(),
                )
            })
            .collect();
        for snapshot in &set.snapshots {
            let mut want: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for (writer, sqn, key_group, value) in &appends {
                if *writer == snapshot.writer && (snapshot.sqn_from..snapshot.sqn_to).contains(sqn)
                {
                    want.entry(*key_group).or_default().push(value.clone());
                }
            }
            let mut got: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for change in
                reader::read_handle(&snapshot.handle(), &dstl::FileSource::new(None)).unwrap()
            {
                got.entry(change.key_group)
                    .or_default()
                    .push(dstl_tests::golden::hex(&change.value));
            }
            assert_eq!(got, want, "{} {}", set.name, snapshot.name);
        }
    }
}

#[test]
fn storage_read_equals_reader() {
    let (_tmp, storage, _decoder) = decoder();
    for set in GoldenSet::all() {
        for snapshot in &set.snapshots {
            assert_eq!(
                storage.read(&snapshot.handle()).unwrap(),
                reader::read_handle(&snapshot.handle(), &dstl::FileSource::new(None)).unwrap()
            );
        }
    }
}

#[test]
fn component_codec_matches_host_reader_on_golden_files() {
    let (_tmp, _storage, mut decoder) = decoder();
    let mut change_sets = 0;
    for set in GoldenSet::all() {
        let mut logical_of = BTreeMap::new();
        for file in &set.files {
            let what = format!("{} {}", set.name, file.relative);
            let bytes = std::fs::read(&file.path).unwrap();
            let in_sandbox = decoder
                .logical_bytes(&bytes)
                .unwrap_or_else(|e| panic!("{what}: component logical_bytes: {e}"));
            let on_host = dstl::codec::logical_bytes(&bytes).unwrap().into_owned();
            assert_eq!(in_sandbox, on_host, "{what}: logical bytes");
            if let Some(size) = set.recorded_file_size(&file.path) {
                assert_eq!(in_sandbox.len() as u64, size, "{what}: fileSize");
            }
            // Every change set in the file, not only those the snapshots name.
            for offset in change_set_offsets(&on_host) {
                let in_sandbox = decoder
                    .decode_change_set(&on_host, offset)
                    .unwrap_or_else(|e| panic!("{what} @{offset}: component: {e}"));
                let on_host = dstl::codec::decode_change_set(&on_host, offset).unwrap();
                assert_eq!(in_sandbox, on_host, "{what} @{offset}");
                change_sets += 1;
            }
            logical_of.insert(file.path.clone(), in_sandbox);
        }
        for snapshot in &set.snapshots {
            let what = format!("{} {}", set.name, snapshot.name);
            let mut changes = Vec::new();
            for handle in &snapshot.handles {
                let logical = &logical_of[&handle.path];
                assert!(
                    change_set_offsets(logical).contains(&handle.offset),
                    "{what}: offset {} is not a change-set boundary",
                    handle.offset
                );
                changes.extend(
                    decoder
                        .decode_change_set(logical, handle.offset)
                        .unwrap_or_else(|e| panic!("{what}: component: {e}")),
                );
            }
            assert_eq!(
                changes,
                reader::read_handle(&snapshot.handle(), &dstl::FileSource::new(None)).unwrap(),
                "{what}: component vs host reader"
            );
            assert_eq!(
                lines(set.format, &changes),
                snapshot.expected_lines(),
                "{what}"
            );
            assert_eq!(reader::digest(&changes), snapshot.expected_sha256, "{what}");
        }
    }
    assert!(change_sets >= 18, "walked {change_sets} change sets");
}

/// The component's file encoder (for hosts that cannot link the codec) writes exactly
/// what the host's codec writes: the plain files Flink wrote, byte for byte, and
/// compressed files whose logical bytes are Flink's.
#[test]
fn component_codec_encodes_files_as_the_host_codec_does() {
    let (_tmp, _storage, mut codec) = decoder();
    for set in GoldenSet::all() {
        for file in &set.files {
            let what = format!("{} {}", set.name, file.relative);
            let bytes = std::fs::read(&file.path).unwrap();
            let logical = dstl::codec::logical_bytes(&bytes).unwrap().into_owned();
            let offsets = change_set_offsets(&logical);
            let blocks: Vec<Vec<u8>> = offsets
                .iter()
                .zip(offsets.iter().skip(1).chain([&(logical.len() as u64)]))
                .map(|(&a, &b)| logical[a as usize..b as usize].to_vec())
                .collect();
            for compression in [false, true] {
                let (file_bytes, file_offsets, size) = codec
                    .encode_file(&blocks, compression)
                    .unwrap_or_else(|e| panic!("{what}: component encode_file: {e}"));
                let (host_bytes, host_offsets) =
                    dstl::codec::encode_file(&blocks, compression).unwrap();
                assert_eq!(file_bytes, host_bytes, "{what} compression={compression}");
                assert_eq!(file_offsets, host_offsets, "{what}");
                assert_eq!(file_offsets, offsets, "{what}: block offsets");
                assert_eq!(size, logical.len() as u64, "{what}: logical size");
                if !set.compression && !compression {
                    assert_eq!(file_bytes, bytes, "{what}: Flink's own bytes");
                }
                let back = dstl::codec::logical_bytes(&file_bytes).unwrap();
                assert_eq!(&back[..], &logical[..], "{what}: round trip");
            }
            // The layout a host writes the blocks by: header then blocks is the plain
            // file, byte for byte.
            let sizes: Vec<u64> = blocks.iter().map(|b| b.len() as u64).collect();
            let (header, layout_offsets, size) = codec
                .layout_plain_file(&sizes)
                .unwrap_or_else(|e| panic!("{what}: component layout_plain_file: {e}"));
            let mut written = header;
            blocks.iter().for_each(|b| written.extend_from_slice(b));
            let (plain, _) = dstl::codec::encode_file(&blocks, false).unwrap();
            assert_eq!(written, plain, "{what}: header and blocks");
            assert_eq!(layout_offsets, offsets, "{what}: layout offsets");
            assert_eq!(size, logical.len() as u64, "{what}: layout logical size");
        }
    }
}

#[test]
fn component_codec_rejects_bad_input_without_trapping() {
    let (_tmp, _storage, mut decoder) = decoder();
    let set = GoldenSet::load("snappy");
    let bytes = std::fs::read(&set.files[0].path).unwrap();
    let logical = decoder.logical_bytes(&bytes).unwrap();

    let mut bad_inputs: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), vec![]),
        ("unknown flag".into(), vec![7, 1, 2, 3]),
        ("truncated snappy".into(), bytes[..bytes.len() / 2].to_vec()),
    ];
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x5a;
    bad_inputs.push(("flipped snappy".into(), flipped));
    for (what, input) in &bad_inputs {
        let err = decoder
            .logical_bytes(input)
            .expect_err(&format!("{what}: must be rejected"));
        assert!(
            !err.contains("trapped"),
            "{what}: the sandbox trapped: {err}"
        );
        assert!(
            dstl::codec::logical_bytes(input).is_err(),
            "{what}: host agrees"
        );
    }
    for (what, offset) in [
        ("past the end", logical.len() as u64 + 1),
        ("huge offset", u64::MAX),
        ("inside a change set", 3),
    ] {
        let in_sandbox = decoder.decode_change_set(&logical, offset);
        let on_host = dstl::codec::decode_change_set(&logical, offset);
        match in_sandbox {
            Err(e) => {
                assert!(!e.contains("trapped"), "{what}: the sandbox trapped: {e}");
                assert!(
                    on_host.is_err(),
                    "{what}: host accepts what the sandbox rejects"
                );
            }
            Ok(changes) => assert_eq!(Ok(changes), on_host, "{what}"),
        }
    }
    // Still usable after the errors.
    assert_eq!(decoder.logical_bytes(&bytes).unwrap(), logical);
}

fn path_of(err: &ReadError) -> &str {
    match err {
        ReadError::Io { path, .. }
        | ReadError::File(FileError::Unreadable { path, .. })
        | ReadError::File(FileError::Corrupt { path, .. })
        | ReadError::File(FileError::SizeMismatch { path, .. }) => path,
        other => panic!("an error without a path: {other}"),
    }
}

/// Reads `handle`, which must fail with an error naming `file`.
fn read_err(handle: &ChangelogHandle, file: &Path) -> ReadError {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reader::read_handle(handle, &dstl::FileSource::new(None))
    }));
    let err = match result {
        Ok(Ok(changes)) => panic!(
            "reading a damaged {} succeeded with {} changes",
            file.display(),
            changes.len()
        ),
        Ok(Err(e)) => e,
        Err(_) => panic!("reading a damaged {} panicked", file.display()),
    };
    let file = file.to_str().unwrap();
    assert_eq!(path_of(&err), file, "{err}");
    assert!(
        err.to_string().contains(file),
        "message names the file: {err}"
    );
    err
}

fn snapshot<'a>(set: &'a GoldenSet, name: &str) -> &'a GoldenSnapshot {
    set.snapshots.iter().find(|s| s.name == name).unwrap()
}

/// The golden set `name` copied into a fresh temporary directory (for a test to damage),
/// and that directory.
fn copied_set(name: &str) -> (TempDir, GoldenSet) {
    in_temp_dir(|dir| copy_set(&GoldenSet::load(name), dir))
}

/// `snap` reads back from its files with every change its manifest counts.
fn assert_reads_whole(snap: &GoldenSnapshot) {
    assert_eq!(
        reader::read_handle(&snap.handle(), &dstl::FileSource::new(None))
            .unwrap()
            .len(),
        snap.expected_count
    );
}

#[test]
fn damaged_plain_files_give_typed_errors() {
    let (_tmp, set) = copied_set("plain");
    let snap = snapshot(&set, "w0-cp2");
    // The copy reads like the original.
    assert_reads_whole(snap);
    let target = &snap.handles[1];
    let original = std::fs::read(&target.path).unwrap();

    // Truncated to half.
    std::fs::write(&target.path, &original[..original.len() / 2]).unwrap();
    match read_err(&snap.handle(), &target.path) {
        ReadError::File(FileError::SizeMismatch {
            expected, actual, ..
        }) => {
            assert_eq!(expected, target.file_size);
            assert_eq!(actual, original.len() as u64 / 2 - 1);
        }
        ReadError::File(FileError::Corrupt { .. }) => {}
        other => panic!("truncated: unexpected {other:?}"),
    }

    // Empty file.
    std::fs::write(&target.path, b"").unwrap();
    match read_err(&snap.handle(), &target.path) {
        ReadError::File(FileError::Corrupt {
            source: FormatError::Empty,
            ..
        }) => {}
        other => panic!("empty: unexpected {other:?}"),
    }

    // Unknown compression flag.
    let mut bytes = original.clone();
    bytes[0] = 7;
    std::fs::write(&target.path, &bytes).unwrap();
    match read_err(&snap.handle(), &target.path) {
        ReadError::File(FileError::Corrupt {
            source: FormatError::UnknownFlag(7),
            ..
        }) => {}
        other => panic!("flag: unexpected {other:?}"),
    }

    // A negative group count at the change set's offset.
    let mut bytes = original.clone();
    let at = 1 + target.offset as usize;
    bytes[at..at + 4].copy_from_slice(&(-1i32).to_be_bytes());
    std::fs::write(&target.path, &bytes).unwrap();
    match read_err(&snap.handle(), &target.path) {
        ReadError::File(FileError::Corrupt { offset, source, .. }) => {
            assert_eq!(offset, target.offset);
            assert!(
                matches!(source, FormatError::InvalidField { .. }),
                "{source:?}"
            );
        }
        other => panic!("group count: unexpected {other:?}"),
    }
    std::fs::write(&target.path, &original).unwrap();

    // A handle recording another logical size (the file was replaced).
    let mut handle = snap.handle();
    handle.entries[1].handle.file_size += 1;
    match read_err(&handle, &target.path) {
        ReadError::File(FileError::SizeMismatch { .. }) => {}
        other => panic!("size: unexpected {other:?}"),
    }

    // An offset past the end.
    let mut handle = snap.handle();
    handle.entries[1].offset = target.file_size + 10;
    match read_err(&handle, &target.path) {
        ReadError::File(FileError::Corrupt {
            source: FormatError::OffsetOutOfRange { .. },
            ..
        }) => {}
        other => panic!("offset: unexpected {other:?}"),
    }

    // Missing file: the component's reader, given the same I/O error, words it alike.
    std::fs::remove_file(&target.path).unwrap();
    let error = read_err(&snap.handle(), &target.path);
    match &error {
        ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            let (_tmp, _storage, mut decoder) = decoder();
            let path = target.path.to_str().unwrap();
            let in_sandbox =
                decoder.read_file(path, Err(&source.to_string()), target.file_size, &[0]);
            assert_eq!(in_sandbox, Err(error.to_string()));
        }
        other => panic!("missing: unexpected {other:?}"),
    }
}

#[test]
fn damaged_snappy_files_give_typed_errors() {
    for name in ["snappy", "snappy-large"] {
        let (_tmp, set) = copied_set(name);
        let snap = set.snapshots.last().unwrap();
        assert_reads_whole(snap);
        let target = &snap.handles[0];
        let original = std::fs::read(&target.path).unwrap();

        // A corrupted byte inside the compressed stream (the frame checksum catches it),
        // and a damaged stream identifier.
        for (what, at, flip) in [
            ("corrupt", original.len() / 2, 0xff),
            ("identifier", 5, 0x20),
        ] {
            let mut bytes = original.clone();
            bytes[at] ^= flip;
            std::fs::write(&target.path, &bytes).unwrap();
            match read_err(&snap.handle(), &target.path) {
                ReadError::File(FileError::Corrupt {
                    source: FormatError::Snappy(_),
                    ..
                }) => {}
                other => panic!("{name} {what}: unexpected {other:?}"),
            }
        }

        // Truncated to half.
        std::fs::write(&target.path, &original[..original.len() / 2]).unwrap();
        match read_err(&snap.handle(), &target.path) {
            ReadError::File(FileError::Corrupt { .. } | FileError::SizeMismatch { .. }) => {}
            other => panic!("{name} truncated: unexpected {other:?}"),
        }

        // Missing.
        std::fs::remove_file(&target.path).unwrap();
        assert!(matches!(
            read_err(&snap.handle(), &target.path),
            ReadError::Io { .. }
        ));
    }
}

/// Every single-byte corruption and every truncation of a file is contained: the host
/// reader returns changes or a typed error naming the file, and the component decoder
/// agrees with the host codec without trapping.
#[test]
fn every_byte_flip_and_truncation_is_contained() {
    let (_tmp, _storage, mut decoder) = decoder();
    for name in dstl_tests::golden::GOLDEN_SETS {
        let (_tmp, set) = copied_set(name);
        let snap = set.snapshots.last().unwrap();
        let target = snap.handles.last().unwrap();
        let offsets: Vec<u64> = snap
            .handles
            .iter()
            .filter(|h| h.path == target.path)
            .map(|h| h.offset)
            .collect();
        let original = std::fs::read(&target.path).unwrap();
        let stride = if original.len() > 4096 { 7 } else { 1 };
        let mut mutations: Vec<(String, Vec<u8>)> = Vec::new();
        for i in (0..original.len()).step_by(stride) {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut bytes = original.clone();
                bytes[i] ^= mask;
                mutations.push((format!("byte {i} ^ {mask:#04x}"), bytes));
            }
        }
        for len in (0..original.len()).step_by(stride) {
            mutations.push((format!("truncated to {len}"), original[..len].to_vec()));
        }
        let mut errors = 0;
        for (what, bytes) in &mutations {
            let what = format!("{name} {}: {what}", target.relative);
            std::fs::write(&target.path, bytes).unwrap();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                reader::read_handle(&snap.handle(), &dstl::FileSource::new(None))
            }))
            .unwrap_or_else(|_| panic!("{what}: the host reader panicked"));
            let file = target.path.to_str().unwrap();
            // The component's reader (the Node host's) reads and words the file alike.
            let in_sandbox = decoder.read_file(file, Ok(bytes), target.file_size, &offsets);
            match &result {
                Err(err) => {
                    errors += 1;
                    assert_eq!(path_of(err), file, "{what}: {err}");
                    assert!(err.to_string().contains(file), "{what}: {err}");
                    assert_eq!(in_sandbox, Err(err.to_string()), "{what}: component reader");
                }
                Ok(_) => {
                    let sets = in_sandbox.unwrap_or_else(|e| {
                        panic!("{what}: only the component reader failed: {e}")
                    });
                    let logical = dstl::codec::logical_bytes(bytes).unwrap();
                    for (set, &offset) in sets.iter().zip(&offsets) {
                        let on_host = dstl::codec::decode_change_set(&logical, offset).unwrap();
                        assert_eq!(set, &on_host, "{what} @{offset}: component reader");
                    }
                }
            }

            let on_host = dstl::codec::logical_bytes(bytes).map(|l| l.into_owned());
            let in_sandbox = decoder.logical_bytes(bytes);
            match (&in_sandbox, &on_host) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}: logical bytes differ"),
                (Err(e), Err(_)) => assert!(!e.contains("trapped"), "{what}: trapped: {e}"),
                _ => panic!("{what}: sandbox {in_sandbox:?} vs host {on_host:?}"),
            }
            if let Ok(logical) = on_host {
                for &offset in &offsets {
                    let on_host = dstl::codec::decode_change_set(&logical, offset);
                    let in_sandbox = decoder.decode_change_set(&logical, offset);
                    match (&in_sandbox, &on_host) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what} @{offset}"),
                        (Err(e), Err(_)) => {
                            assert!(!e.contains("trapped"), "{what} @{offset}: trapped: {e}")
                        }
                        _ => panic!("{what} @{offset}: sandbox {in_sandbox:?} vs host {on_host:?}"),
                    }
                }
            }
        }
        assert!(errors > 0, "{name}: no mutation was detected");
    }
}
