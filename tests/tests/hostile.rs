//! Hostile input through the public library API: malformed packed batches, key groups
//! and sequence numbers out of range, extreme values, bad writer names, base paths that
//! try to escape, registry releases of paths outside the store, and handles with absurd
//! offsets and sizes. Every case must end in a typed error — never a panic or a trap —
//! must write nothing, and must leave the writer working.

use std::path::{Path, PathBuf};

use dstl::manifest::ManifestFile;
use dstl::{
    ChangelogHandle, ChangelogStorage, Config, ConfigError, Error, HandleEntry, KeyGroupRange,
    LocationError, ReadError, StreamHandle, Writer, WriterError, WriterOptions,
};
use dstl_tests::harness::{changes, files, gc_orphans, in_temp_dir, writer_error_for};
use tempfile::TempDir;

/// A narrow range, so that key groups just outside it are easy to name.
const RANGE: KeyGroupRange = KeyGroupRange { start: 10, end: 20 };

/// A packed batch: what it is, key groups, lengths, data.
type BatchCase = (&'static str, Vec<i32>, Vec<u32>, Vec<u8>);
/// Handle entries: path, logical file size, offset.
type Entries = Vec<(String, u64, u64)>;

/// A storage over `dir` (the harness's) with a 64 MiB sandbox per writer and no batching
/// delay, then `conf`.
fn open(dir: &Path, conf: &[&str]) -> ChangelogStorage {
    let defaults = [
        "dstl.writer.memory-limit=64mb",
        "dstl.dfs.batch.persist-delay=0",
    ];
    dstl_tests::harness::open(dir, &[&defaults[..], conf].concat())
}

/// [`open`] over a fresh temporary directory, which must outlive the storage.
fn open_temp(conf: &[&str]) -> (TempDir, ChangelogStorage) {
    in_temp_dir(|dir| open(dir, conf))
}

/// Every entry of the store's directory (staging files included), once idle; the
/// directory must exist.
fn store_entries(storage: &ChangelogStorage) -> Vec<PathBuf> {
    storage.wait_idle();
    let dir = storage.config().job_dir();
    assert!(
        dir.is_dir(),
        "the store's directory {} is gone",
        dir.display()
    );
    files(&dir)
}

fn assert_invalid_argument<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) {
    let e = writer_error_for(what, result);
    assert!(
        matches!(e, WriterError::InvalidArgument(_)),
        "{what}: expected InvalidArgument, got {e:?}"
    );
}

/// The writer has not trapped, accepts a change, persists it and reads it back; the
/// persist holds exactly that change (so nothing of a rejected call was appended).
fn still_works(storage: &ChangelogStorage, writer: &Writer, checkpoint: i64) {
    assert_eq!(writer.failure(), None, "{} trapped", writer.name());
    let from = writer.next_sequence_number().unwrap();
    writer.append(RANGE.start, b"still works").unwrap();
    let snapshot = writer.persist(from, checkpoint).unwrap().wait().unwrap();
    assert_eq!(
        changes(storage, &snapshot.remote),
        vec![(RANGE.start, b"still works".to_vec())]
    );
    assert_eq!(writer.failure(), None, "{} trapped", writer.name());
}

/// Persists everything `writer` appended as checkpoint 1; the changes it holds, sorted
/// (the order of key groups within a change set is not part of the format).
fn persisted_sorted(storage: &ChangelogStorage, writer: &Writer) -> Vec<(i32, Vec<u8>)> {
    let snapshot = writer.persist(0, 1).unwrap().wait().unwrap();
    let mut read = changes(storage, &snapshot.remote);
    read.sort();
    read
}

/// Nothing is open: the next sequence number is `expected` and a persist from it is
/// empty and immediate.
fn nothing_appended(writer: &Writer, expected: u64) {
    assert_eq!(writer.next_sequence_number().unwrap(), expected);
    let future = writer.persist(expected, 999).unwrap();
    assert!(
        future.is_immediate(),
        "a persist of nothing uploads nothing"
    );
    assert!(future.wait().unwrap().remote.entries.is_empty());
}

// ---- packed batches ----

#[test]
fn malformed_packed_batches_are_rejected_whole() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let before = store_entries(&storage);
    let ok = RANGE.start;
    let cases: Vec<BatchCase> = vec![
        (
            "more key groups than lengths",
            vec![ok, ok],
            vec![1],
            vec![0],
        ),
        (
            "more lengths than key groups",
            vec![ok],
            vec![1, 1],
            vec![0, 0],
        ),
        ("lengths exceed data", vec![ok, ok], vec![2, 3], vec![0; 4]),
        ("data exceeds lengths", vec![ok], vec![2], vec![0; 3]),
        (
            "lengths overflow u32 when added",
            vec![ok, ok, ok],
            vec![u32::MAX, u32::MAX, 2],
            vec![0; 4],
        ),
        ("length u32::MAX", vec![ok], vec![u32::MAX], vec![0; 16]),
        (
            "length above i32::MAX",
            vec![ok],
            vec![i32::MAX as u32 + 1],
            vec![],
        ),
        ("key group -2", vec![ok, -2], vec![1, 1], vec![0, 0]),
        ("key group i32::MIN", vec![i32::MIN], vec![0], vec![]),
        (
            "key group below range",
            vec![RANGE.start - 1],
            vec![1],
            vec![0],
        ),
        (
            "key group above range",
            vec![ok, RANGE.end + 1],
            vec![1, 1],
            vec![0, 0],
        ),
        ("key group i32::MAX", vec![i32::MAX], vec![0], vec![]),
        (
            "bad key group after many good ones",
            [vec![ok; 1000], vec![RANGE.end + 1]].concat(),
            vec![1; 1001],
            vec![7; 1001],
        ),
    ];
    for (what, key_groups, lengths, data) in cases {
        assert_invalid_argument(w.append_batch(&key_groups, &lengths, &data), what);
        assert_eq!(w.failure(), None, "{what}: trapped");
    }
    // A good batch with metadata and empty values is fine; an empty batch is a no-op.
    w.append_batch(&[], &[], &[]).unwrap();
    nothing_appended(&w, 0);
    assert_eq!(
        store_entries(&storage),
        before,
        "a rejected batch writes nothing"
    );
    w.append_batch(&[-1, RANGE.end, RANGE.start], &[0, 3, 0], b"abc")
        .unwrap();
    assert_eq!(
        persisted_sorted(&storage, &w),
        vec![
            (-1, vec![]),
            (RANGE.start, vec![]),
            (RANGE.end, b"abc".to_vec())
        ]
    );
    still_works(&storage, &w, 2);
}

/// `values` appended through `append_placed`, its `place` copying each into its slot.
fn append_placed(writer: &Writer, key_groups: &[i32], values: &[&[u8]]) -> Result<(), Error> {
    let lengths: Vec<u32> = values.iter().map(|v| v.len() as u32).collect();
    writer.append_placed(key_groups, &lengths, |out, offsets| {
        place(out, offsets, values);
        true
    })
}

/// Writes `values[i]` at `offsets[i]` of `out`, as a caller of `append_placed` does.
fn place(out: &mut [u8], offsets: &[u32], values: &[&[u8]]) {
    for (&at, value) in offsets.iter().zip(values) {
        out[at as usize..at as usize + value.len()].copy_from_slice(value);
    }
}

#[test]
fn batches_placed_by_the_caller_are_checked_whole_and_read_back_in_order() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let before = store_entries(&storage);
    let ok = RANGE.start;
    // Refused before the caller is asked for anything.
    let cases: Vec<(&str, Vec<i32>, Vec<u32>)> = vec![
        ("more key groups than lengths", vec![ok, ok], vec![1]),
        ("more lengths than key groups", vec![ok], vec![1, 1]),
        ("key group -2", vec![ok, -2], vec![1, 1]),
        ("key group below range", vec![RANGE.start - 1], vec![1]),
        ("key group above range", vec![ok, RANGE.end + 1], vec![1, 1]),
    ];
    for (what, key_groups, lengths) in cases {
        let result = w.append_placed(&key_groups, &lengths, |_, _| {
            unreachable!("{what}: a refused batch asks for no values")
        });
        assert_invalid_argument(result, what);
        assert_eq!(w.failure(), None, "{what}: trapped");
    }
    // A caller that writes beyond its values, or gives up, appends nothing; nor does a
    // persist that takes its batch along persist anything.
    let beyond = w.append_placed(&[ok, ok], &[1, 1], |out, _| {
        out[..4].copy_from_slice(&[0xff; 4]);
        true
    });
    assert_invalid_argument(beyond, "bytes written beyond the values");
    let gave_up = w.append_placed(&[ok], &[1], |_, _| false);
    assert!(
        matches!(&gave_up, Err(Error::InvalidArgument(m)) if m.contains("did not write")),
        "{gave_up:?}"
    );
    let gave_up = w.append_placed_and_persist(&[ok], &[1], |_, _| false, 0, 7);
    assert!(
        matches!(gave_up, Err(Error::InvalidArgument(_))),
        "{gave_up:?}"
    );
    w.append_placed(&[], &[], |_, _| unreachable!("no values to write"))
        .unwrap();
    nothing_appended(&w, 0);
    assert_eq!(
        store_entries(&storage),
        before,
        "a rejected batch writes nothing"
    );

    // Each key group's changes in append order, metadata and empty values included; a
    // single append between batches keeps its place.
    let from = w.next_sequence_number().unwrap();
    append_placed(
        &w,
        &[RANGE.end, -1, ok, RANGE.end],
        &[b"x1", b"meta", b"y1", b""],
    )
    .unwrap();
    w.append(RANGE.end, b"x2").unwrap();
    let last: [&[u8]; 2] = [b"y2", b"x3"];
    let snapshot = w
        .append_placed_and_persist(
            &[ok, RANGE.end],
            &[2, 2],
            |out, offsets| {
                place(out, offsets, &last);
                true
            },
            from,
            1,
        )
        .unwrap()
        .wait()
        .unwrap();
    let read = changes(&storage, &snapshot.remote);
    let of = |key_group: i32| values_of(&read, key_group);
    assert_eq!(of(-1), [b"meta".to_vec()]);
    assert_eq!(
        of(RANGE.end),
        [b"x1".to_vec(), vec![], b"x2".to_vec(), b"x3".to_vec()]
    );
    assert_eq!(of(ok), [b"y1".to_vec(), b"y2".to_vec()]);
    assert_eq!(read.len(), 7);

    w.close().unwrap();
    let closed = w.append_placed(&[ok], &[1], |_, _| {
        unreachable!("a closed writer takes nothing")
    });
    assert!(
        matches!(
            writer_error_for("after close", closed),
            WriterError::Closed(_)
        ),
        "after close"
    );
}

/// The values of `key_group` among `changes`, in their order.
fn values_of(changes: &[(i32, Vec<u8>)], key_group: i32) -> Vec<Vec<u8>> {
    changes
        .iter()
        .filter(|(k, _)| *k == key_group)
        .map(|(_, v)| v.clone())
        .collect()
}

/// Asserts that `result` is the writer's `InvalidArgument` naming `key_group`.
fn refused_naming_key_group(call: &str, key_group: i32, result: Result<(), Error>) {
    let e = writer_error_for(call, result);
    let WriterError::InvalidArgument(message) = &e else {
        panic!("{call} to key group {key_group}: {e:?}")
    };
    assert!(
        message.to_string().contains(&key_group.to_string()),
        "the message names the key group: {message}"
    );
}

#[test]
fn owned_values_keep_their_order_among_copied_ones_and_are_checked_alike() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let (ok, other) = (RANGE.start, RANGE.end);
    for key_group in [-1, RANGE.start - 1, RANGE.end + 1] {
        refused_naming_key_group(
            "append_owned",
            key_group,
            w.append_owned(key_group, vec![1u8]),
        );
    }
    nothing_appended(&w, 0);

    // Owned and copied values interleaved (each switch hands the other kind over first),
    // a value large enough to go alone, metadata, and enough owned values that the
    // budget hands them over on its own; the persist takes the rest along.
    let from = w.next_sequence_number().unwrap();
    let mut expected: Vec<(i32, Vec<u8>)> = Vec::new();
    let mut owned = |key_group: i32, value: Vec<u8>| {
        w.append_owned(key_group, value.clone()).unwrap();
        expected.push((key_group, value));
    };
    owned(ok, b"o1".to_vec());
    owned(other, Vec::new());
    w.append(ok, b"c1").unwrap();
    owned(other, vec![7u8; 300 << 10]);
    owned(ok, b"o2".to_vec());
    w.append_meta(b"meta").unwrap();
    for i in 0..5000u32 {
        owned(ok + (i % 3) as i32, i.to_be_bytes().to_vec());
    }
    let expected_ok: Vec<Vec<u8>> = {
        let mut values: Vec<Vec<u8>> = vec![b"o1".to_vec(), b"c1".to_vec(), b"o2".to_vec()];
        values.extend(values_of(&expected[4..], ok));
        values
    };
    let snapshot = w.persist(from, 1).unwrap().wait().unwrap();
    let read = changes(&storage, &snapshot.remote);
    let of = |key_group: i32| values_of(&read, key_group);
    assert_eq!(of(-1), [b"meta".to_vec()]);
    assert_eq!(of(ok), expected_ok);
    let owned_of = |key_group: i32| values_of(&expected, key_group);
    assert_eq!(of(other), owned_of(other));
    assert_eq!(of(ok + 1), owned_of(ok + 1));
    assert_eq!(of(ok + 1).len(), 1667);
    assert_eq!(read.len(), 2 + 1 + 1 + 5000 + 1 + 1);

    w.close().unwrap();
    assert!(
        matches!(
            writer_error_for("after close", w.append_owned(ok, vec![1u8])),
            WriterError::Closed(_)
        ),
        "after close"
    );
}

#[test]
fn single_appends_with_bad_key_groups_are_rejected() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let before = store_entries(&storage);
    for key_group in [
        -1,
        -2,
        i32::MIN,
        RANGE.start - 1,
        RANGE.end + 1,
        i32::MAX,
        0,
    ] {
        refused_naming_key_group("append", key_group, w.append(key_group, b"x"));
    }
    nothing_appended(&w, 0);
    assert_eq!(store_entries(&storage), before);
    still_works(&storage, &w, 1);
}

#[test]
fn a_writer_over_the_whole_key_group_domain_accepts_its_ends() {
    let (_tmp, storage) = open_temp(&[]);
    let range = KeyGroupRange {
        start: 0,
        end: i32::MAX,
    };
    let w = storage.create_writer("wide", range).unwrap();
    w.append(0, b"first").unwrap();
    w.append(i32::MAX, b"last").unwrap();
    w.append_meta(b"meta").unwrap();
    assert_invalid_argument(w.append(-1, b"x"), "append -1");
    assert_eq!(
        persisted_sorted(&storage, &w),
        vec![
            (-1, b"meta".to_vec()),
            (0, b"first".to_vec()),
            (i32::MAX, b"last".to_vec())
        ]
    );
}

// ---- sequence numbers and checkpoints ----

#[test]
fn sequence_numbers_out_of_range_are_typed_errors() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(RANGE.start, b"a").unwrap();
    let active = w.next_sequence_number().unwrap();
    assert_eq!(active, 1);
    let before = store_entries(&storage);

    for from in [active + 1, 1 << 40, u64::MAX - 1, u64::MAX] {
        let e = writer_error_for("persist beyond active", w.persist(from, 1));
        assert!(
            matches!(&e, WriterError::NotYetAppended(m) if m.to_string().contains(&from.to_string())),
            "persist({from}): {e:?}"
        );
    }
    for (from, to) in [
        (1, 0),
        (u64::MAX, 0),
        (u64::MAX, u64::MAX - 1),
        (0, active + 1),
        (0, u64::MAX),
        (active + 1, active + 1),
        (u64::MAX, u64::MAX),
    ] {
        let e = writer_error_for("confirm", w.confirm(from, to, 1));
        assert!(
            matches!(&e, WriterError::InvalidRange(m) if m.to_string().contains(&format!("[{from},{to})"))),
            "confirm({from}, {to}): {e:?}"
        );
    }
    for to in [active + 1, u64::MAX] {
        let e = writer_error_for("truncate beyond active", w.truncate(to));
        assert!(
            matches!(&e, WriterError::InvalidArgument(m) if m.to_string().contains(&to.to_string())),
            "truncate({to}): {e:?}"
        );
    }
    // Extreme checkpoint ids are just numbers.
    for checkpoint in [i64::MIN, -1, 0, i64::MAX] {
        w.reset(0, active, checkpoint).unwrap();
        w.reset(u64::MAX, 0, checkpoint).unwrap();
    }
    assert_eq!(store_entries(&storage), before, "nothing was uploaded");
    // The change set is still there and persists under any checkpoint id.
    let snapshot = w.persist(0, i64::MIN).unwrap().wait().unwrap();
    assert_eq!(snapshot.remote.entries.len(), 1);
    w.confirm(0, active, i64::MAX).unwrap();
    w.truncate(active).unwrap();
    let e = writer_error_for("persist of truncated", w.persist(0, 3));
    assert!(matches!(e, WriterError::Truncated(_)), "{e:?}");
    // Truncating backwards, or to where it already is, is a no-op.
    w.truncate(0).unwrap();
    w.truncate(active).unwrap();
    assert!(matches!(
        writer_error_for("persist of truncated", w.persist(0, 3)),
        WriterError::Truncated(_)
    ));
    still_works(&storage, &w, 4);
}

#[test]
fn closing_at_extreme_sequence_numbers_is_safe() {
    let (_tmp, storage) = open_temp(&[]);
    for from in [0, u64::MAX] {
        let w = storage.create_writer(&format!("op-{from}"), RANGE).unwrap();
        w.append(RANGE.start, b"a").unwrap();
        let to = w.next_sequence_number().unwrap();
        w.persist(0, 1).unwrap().wait().unwrap();
        w.truncate_and_close(from).unwrap();
        // Everything else after close is a typed Closed error; the number stays frozen.
        for result in [
            w.append(RANGE.start, b"x"),
            w.append_meta(b"x"),
            w.append_batch(&[RANGE.start], &[1], b"x"),
            w.persist(0, 2).map(drop),
            w.truncate(0),
            w.truncate_and_close(0),
            w.close(),
        ] {
            let e = writer_error_for("call after close", result);
            assert!(matches!(e, WriterError::Closed(_)), "{e:?}");
        }
        // The coordinator's confirm and abort still work (they discard local copies).
        w.confirm(0, to, 2).unwrap();
        w.reset(0, to, 2).unwrap();
        assert_eq!(w.next_sequence_number().unwrap(), to);
        assert_eq!(w.failure(), None);
    }
    storage.wait_idle();
    assert_eq!(
        storage.task_registry().tracked(),
        1,
        "truncate_and_close(u64::MAX) releases nothing; truncate_and_close(0) releases all"
    );
}

// ---- writer names and key-group ranges ----

#[test]
fn writer_names_with_control_characters_are_rejected() {
    let (tmp, storage) = open_temp(&[]);
    let long = "x".repeat(257);
    for bad in [
        "",
        "a\0b",
        "\0",
        "line\nbreak",
        "carriage\rreturn",
        "tab\there",
        "escape\u{1b}[2J",
        "delete\u{7f}",
        "next-line\u{85}",
        long.as_str(),
    ] {
        match storage.create_writer(bad, RANGE) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains("invalid writer name"), "{message}")
            }
            Err(other) => panic!("name {bad:?}: expected InvalidArgument, got {other:?}"),
            Ok(_) => panic!("name {bad:?} was accepted"),
        }
    }
    // Names are never used in paths: slashes and dots are just characters.
    let before = files(tmp.path());
    let max = "y".repeat(256);
    for odd in [
        "..",
        "../../etc/passwd",
        "/",
        "a/b",
        "C:\\Windows",
        "名前",
        max.as_str(),
    ] {
        let w = storage
            .create_writer(odd, RANGE)
            .unwrap_or_else(|e| panic!("name {odd:?}: {e}"));
        assert_eq!(w.name(), odd);
        still_works(&storage, &w, 1);
        w.close().unwrap();
    }
    let after = files(tmp.path());
    assert_eq!(before, after, "writer names create nothing on disk");
    for dir in store_entries(&storage) {
        assert!(dir.is_file(), "only changelog files in the store: {dir:?}");
    }
}

#[test]
fn bad_key_group_ranges_and_memory_limits_are_rejected() {
    let (_tmp, storage) = open_temp(&[]);
    for (start, end) in [(-1, 5), (i32::MIN, 0), (5, 4), (i32::MAX, 0), (0, -1)] {
        match storage.create_writer("op", KeyGroupRange { start, end }) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains(&format!("[{start}, {end}]")), "{message}")
            }
            other => panic!("range [{start}, {end}]: {:?}", other.map(|_| ())),
        }
    }
    let over = storage.create_writer_with("op", RANGE, WriterOptions::new().memory_limit(u64::MAX));
    assert!(matches!(over, Err(Error::InvalidArgument(_))));
    let w = storage
        .create_writer(
            "single",
            KeyGroupRange {
                start: i32::MAX,
                end: i32::MAX,
            },
        )
        .unwrap();
    w.append(i32::MAX, b"edge").unwrap();
    assert_invalid_argument(w.append(i32::MAX - 1, b"x"), "below a one-group range");
}

// ---- configuration ----

#[test]
fn base_paths_that_escape_are_rejected() {
    let key = "dstl.dfs.base-path";
    for bad in [
        "s3://bucket/..",
        "s3://bucket/../other",
        "s3://bucket/a/../../b",
        "s3://bucket/a/./b",
        "s3://bucket/.",
        "s3://bucket//a",
        "s3://bucket/a//b",
        "s3://bucket/a\\..\\b",
        "s3://bucket/a\nb",
        "s3://bucket/a\0b",
        "s3://bucket/\u{1b}",
        "s3://..",
        "s3://../etc",
        "s3://b",
        "s3://Bucket",
        "s3://-bucket",
        "s3://bucket-",
        "s3://buc_ket/x",
        "s3://",
        "s3:///prefix",
        "file:///etc",
        "http://bucket/x",
        "/tmp/a\0b",
        "",
        "   ",
    ] {
        let mut config = Config::default();
        let before = config.clone();
        match config.set(key, bad) {
            Err(ConfigError::InvalidLocation { key: k, reason }) => {
                assert_eq!(k, key);
                let expected = if bad.contains('\0') {
                    matches!(reason, LocationError::Nul { .. })
                } else if !bad.starts_with("s3://") {
                    matches!(reason, LocationError::UnsupportedScheme { .. })
                } else {
                    matches!(
                        reason,
                        LocationError::Bucket { .. } | LocationError::PrefixSegment { .. }
                    )
                };
                assert!(expected, "{bad:?}: {reason:?}");
            }
            Err(ConfigError::InvalidValue { key: k, .. }) => assert_eq!(k, key),
            other => panic!("base path {bad:?}: expected a configuration error, got {other:?}"),
        }
        assert_eq!(config, before, "a rejected value changes nothing");
        // The Flink key with its prefix is checked the same way.
        assert!(config.set(&format!("state.changelog.{key}"), bad).is_err());
    }
    // A well-formed prefix is fine, including dots inside segment names.
    let mut config = Config::default();
    config
        .set(key, "s3://my-bucket.example/a/b..c/d.e/")
        .unwrap();
}

#[test]
fn other_values_that_reach_paths_are_validated() {
    let mut config = Config::default();
    for bad in [
        "../../../../tmp/x",
        "0123456789abcdef0123456789abcdeF",
        "0123456789abcdef0123456789abcde",
        "0123456789abcdef0123456789abcdef0",
        "0123456789abcdef/123456789abcdef",
        "",
    ] {
        assert!(
            matches!(
                config.set("dstl.job-id", bad),
                Err(ConfigError::InvalidValue { .. })
            ),
            "job id {bad:?}"
        );
    }
    for (key, bad) in [
        ("dstl.local-recovery.dir", ""),
        ("dstl.dfs.upload.buffer-size", "0"),
        ("dstl.dfs.upload.buffer-size", "18446744073709551615"),
        ("dstl.dfs.upload.num-threads", "0"),
        ("dstl.dfs.upload.num-threads", "-1"),
        ("dstl.dfs.upload.max-attempts", "4294967296"),
        ("dstl.dfs.upload.timeout", "-5 ms"),
        ("dstl.dfs.upload.timeout", "99999999999999999999 d"),
        (
            "dstl.dfs.preemptive-persist-threshold",
            "18446744073709551615 tb",
        ),
        ("dstl.writer.memory-limit", "1b"),
        ("dstl.writer.memory-limit", "1tb"),
        ("dstl.writer.max-writers", "0"),
        ("dstl.s3.endpoint", "file:///etc/passwd"),
    ] {
        assert!(
            matches!(config.set(key, bad), Err(ConfigError::InvalidValue { .. })),
            "{key}={bad}"
        );
    }
    assert!(matches!(
        config.set("dstl.dfs.base-path/../x", "y"),
        Err(ConfigError::UnknownKey(_))
    ));
    assert!(matches!(
        config.apply_pairs(["no-equals-sign"]),
        Err(ConfigError::NotAPair(_))
    ));
    // A relation between keys is checked when the storage opens.
    let tmp = tempfile::tempdir().unwrap();
    let mut config = Config::new();
    config.set_base_path(tmp.path()).unwrap();
    config
        .apply_pairs([
            "dstl.dfs.upload.max-in-flight=1kb",
            "dstl.dfs.batch.persist-size-threshold=2kb",
        ])
        .unwrap();
    assert!(matches!(
        ChangelogStorage::open(config),
        Err(Error::Config(ConfigError::InvalidValue { .. }))
    ));
}

// ---- deletion outside the store ----

#[test]
fn registry_releases_never_delete_outside_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let outside_dir = tempfile::tempdir().unwrap();
    for local_recovery in [false, true] {
        let base = tmp.path().join(format!("base-{local_recovery}"));
        let storage = open(
            &base,
            &[&format!("dstl.local-recovery.enabled={local_recovery}")],
        );
        let job_dir = storage.config().job_dir().canonicalize().unwrap();
        let victim = outside_dir.path().join(format!("passwd-{local_recovery}"));
        std::fs::write(&victim, b"root:x:0:0").unwrap();
        let sibling = job_dir.parent().unwrap().join("sibling");
        std::fs::write(&sibling, b"next to the store").unwrap();
        // A link inside the store that points outside: deleting it must not follow it.
        let link = job_dir.join("link-to-victim");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let hostile = [
            s(&victim),
            s(&sibling),
            format!("{}/../sibling", job_dir.display()),
            format!("{}/./../sibling", job_dir.display()),
            format!("{}/", job_dir.display()),
            s(&job_dir),
            format!("{}/..", job_dir.display()),
            format!("{}/.", job_dir.display()),
            format!("{}//../sibling", job_dir.display()),
            "/etc/passwd".into(),
            "/".into(),
            "".into(),
            "relative/path".into(),
            "../../../../etc/passwd".into(),
            format!("{}\0/etc/passwd", job_dir.display()),
            format!("s3://bucket/{}", victim.display()),
            format!("file://{}", victim.display()),
        ];
        let registry = storage.task_registry();
        for path in &hostile {
            registry.start_tracking(path, 1);
            registry.release(path);
            storage.local_registry().register(1, path, 1);
        }
        storage.local_registry().discard_up_to(1, i64::MAX);
        registry.start_tracking(&s(&link), 1);
        registry.release(&s(&link));
        storage.wait_idle();
        assert!(victim.exists(), "the file outside the store survives");
        assert_eq!(std::fs::read(&victim).unwrap(), b"root:x:0:0");
        assert!(sibling.exists(), "the file next to the store survives");
        assert!(job_dir.is_dir(), "the store's directory survives");
        assert!(
            Path::new("/etc/passwd").exists() || !cfg!(target_os = "linux"),
            "/etc/passwd survives"
        );
        // The link itself is a file of the store and may go; its target may not.
        assert!(
            std::fs::symlink_metadata(&link).is_err(),
            "a released link in the store is deleted like any file there"
        );
    }
}

#[test]
fn gc_never_deletes_what_manifests_name_outside_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("precious");
    std::fs::write(&victim, b"keep").unwrap();
    let storage = open(tmp.path(), &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(RANGE.start, b"x").unwrap();
    let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
    // A file no manifest names: the collection deletes it.
    let unnamed = storage.create_writer("unnamed", RANGE).unwrap();
    unnamed.append(RANGE.start, b"y").unwrap();
    let orphan = unnamed.persist(0, 1).unwrap().wait().unwrap();
    let orphan = orphan.remote.entries[0].handle.path.clone();
    unnamed.confirm(0, 1, 1).unwrap();
    let mut manifest = dstl::manifest::Manifest::from_snapshot(&snapshot);
    let entry = manifest.entries[0].clone();
    manifest.entries.push(dstl::manifest::Entry {
        path: victim.to_string_lossy().into_owned(),
        ..entry.clone()
    });
    manifest.entries.push(dstl::manifest::Entry {
        path: "/etc/passwd".into(),
        file_size: u64::MAX,
        offset: u64::MAX,
        size: u64::MAX,
    });
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    manifest.store(&manifests.join("op.json")).unwrap();
    let live = dstl::gc::live(&manifests).unwrap();
    let referenced = live.paths.clone();
    assert!(referenced.contains(&entry.path));
    let files = dstl::gc::stored_files(storage.config(), &live.jobs)
        .unwrap()
        .files;
    assert!(
        files
            .iter()
            .all(|f| f.path.starts_with(&*tmp.path().to_string_lossy())),
        "gc only lists files under the base: {files:?}"
    );
    let (orphans, report) = gc_orphans(
        files,
        &live,
        std::time::Duration::ZERO,
        std::time::SystemTime::now() + std::time::Duration::from_secs(3600),
    );
    assert_eq!(orphans, vec![orphan.clone()]);
    assert_eq!(dstl::gc::delete(storage.config(), &report).unwrap(), 1);
    assert!(!Path::new(&orphan).exists());
    assert!(victim.exists());
    assert!(Path::new(&entry.path).exists(), "the referenced file stays");
    // A manifest that does not parse stops the collection.
    std::fs::write(manifests.join("broken.json"), b"{\"entries\": [").unwrap();
    assert!(dstl::gc::live(&manifests).is_err());
    // The hostile manifest reads back as a typed error, not a panic.
    let loaded = dstl::manifest::Manifest::load(&manifests.join("op.json")).unwrap();
    assert!(storage.read(&loaded.remote_handle()).is_err());
}

// ---- reading hostile handles ----

fn handle(entries: Entries) -> ChangelogHandle {
    ChangelogHandle {
        entries: entries
            .into_iter()
            .map(|(path, file_size, offset)| HandleEntry {
                handle: StreamHandle { path, file_size },
                offset,
                size: u64::MAX,
            })
            .collect(),
        key_group_range: RANGE,
        state_size: u64::MAX,
        incremental_size: u64::MAX,
        storage_id: "filesystem".into(),
    }
}

/// A storage over `dir/c-<compression>` with compression on or off, and a writer of it
/// that has appended `first` to [`RANGE`]'s first key group.
fn open_compressed(dir: &Path, compression: bool) -> (ChangelogStorage, Writer) {
    let storage = open(
        &dir.join(format!("c-{compression}")),
        &[&format!("dstl.dfs.compression.enabled={compression}")],
    );
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(RANGE.start, b"first").unwrap();
    (storage, w)
}

/// A file in `dir` named after `compression` whose bytes are no changelog file.
fn garbage_file(dir: &Path, compression: bool) -> String {
    let garbage = dir.join(format!("garbage-{compression}"));
    std::fs::write(&garbage, [0u8, 0x7f, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
    garbage.to_string_lossy().into_owned()
}

/// Reading a handle of `entries` fails with a typed error, without panicking.
fn assert_unreadable(storage: &ChangelogStorage, what: &str, entries: Entries) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        storage.read(&handle(entries.clone()))
    }));
    let result = result.unwrap_or_else(|_| panic!("{what}: reading panicked"));
    let _: ReadError = match result {
        Err(e) => e,
        Ok(changes) => panic!("{what}: read {} changes from {entries:?}", changes.len()),
    };
}

#[test]
fn absurd_handles_fail_to_read_with_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for compression in [false, true] {
        let (storage, w) = open_compressed(tmp.path(), compression);
        w.next_sequence_number().unwrap();
        w.append(RANGE.end, b"second").unwrap();
        let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
        let entry = &snapshot.remote.entries[1];
        let (path, size, offset) = (
            entry.handle.path.clone(),
            entry.handle.file_size,
            entry.offset,
        );
        // The real handle reads.
        assert_eq!(storage.read(&snapshot.remote).unwrap().len(), 2);
        let g = garbage_file(tmp.path(), compression);
        let snappy_garbage = tmp.path().join(format!("snappy-garbage-{compression}"));
        std::fs::write(
            &snappy_garbage,
            [1u8, 0xff, 6, 0, 0, b's', b'N', b'a', 0, 0],
        )
        .unwrap();
        let empty = tmp.path().join(format!("empty-{compression}"));
        std::fs::write(&empty, b"").unwrap();
        let sg = snappy_garbage.to_string_lossy().into_owned();
        let e = empty.to_string_lossy().into_owned();
        let dir = tmp.path().to_string_lossy().into_owned();
        let cases: Vec<(&str, Entries)> = vec![
            ("offset u64::MAX", vec![(path.clone(), size, u64::MAX)]),
            ("offset past the end", vec![(path.clone(), size, size + 1)]),
            ("offset at the end", vec![(path.clone(), size, size)]),
            (
                "offset inside a block",
                vec![(path.clone(), size, offset + 3)],
            ),
            ("file size 0", vec![(path.clone(), 0, 0)]),
            (
                "file size short by one",
                vec![(path.clone(), size - 1, offset)],
            ),
            (
                "file size long by one",
                vec![(path.clone(), size + 1, offset)],
            ),
            (
                "a good entry, then a bad one",
                vec![(path.clone(), size, 0), (path.clone(), size, u64::MAX - 7)],
            ),
            ("missing file", vec![(format!("{path}-missing"), size, 0)]),
            ("a directory", vec![(dir.clone(), 10, 0)]),
            ("empty path", vec![(String::new(), 10, 0)]),
            ("NUL in path", vec![(format!("{path}\0x"), size, 0)]),
            ("garbage counts", vec![(g.clone(), 7, 0)]),
            ("corrupt snappy", vec![(sg.clone(), 100, 0)]),
            ("empty file", vec![(e.clone(), 0, 0)]),
            (
                "empty file, absurd size",
                vec![(e.clone(), u64::MAX, u64::MAX)],
            ),
        ];
        for (what, entries) in cases {
            assert_unreadable(&storage, what, entries);
        }
        // The sandboxed decoder answers with an error, never a trap.
        let mut decoder = storage.component_codec().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let logical = decoder.logical_bytes(&bytes).unwrap();
        for offset in [u64::MAX, logical.len() as u64 + 1, offset + 3] {
            let message = decoder.decode_change_set(&logical, offset).unwrap_err();
            assert!(!message.contains("trapped"), "{message}");
        }
        for file in [
            &b""[..],
            &[2u8][..],
            &[1u8, 0, 0][..],
            &[0u8, 0, 0, 0, 1][..],
        ] {
            match decoder.logical_bytes(file) {
                Err(message) => assert!(!message.contains("trapped"), "{message}"),
                Ok(logical) => {
                    if let Err(message) = decoder.decode_change_set(&logical, 0) {
                        assert!(!message.contains("trapped"), "{message}");
                    }
                }
            }
        }
        assert!(decoder.decode_change_set(&logical, offset).is_ok());
        still_works(&storage, &w, 2);
    }
}

/// Handles whose logical file size (or offset) is at the very top of `u64` on a plain
/// file: the reader's range arithmetic saturates, so they are typed errors in every build.
#[test]
fn absurd_file_sizes_fail_to_read_with_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for compression in [false, true] {
        let (storage, w) = open_compressed(tmp.path(), compression);
        let snapshot = w.persist(0, 1).unwrap().wait().unwrap();
        let entry = &snapshot.remote.entries[0];
        let (path, offset) = (entry.handle.path.clone(), entry.offset);
        let g = garbage_file(tmp.path(), compression);
        for (what, entries) in [
            ("file size u64::MAX", vec![(path.clone(), u64::MAX, offset)]),
            (
                "file size u64::MAX - 1",
                vec![(path.clone(), u64::MAX - 1, offset)],
            ),
            ("both u64::MAX", vec![(path.clone(), u64::MAX, u64::MAX)]),
            (
                "garbage, absurd size",
                vec![(g.clone(), u64::MAX, u64::MAX)],
            ),
            (
                "garbage, absurd size, offset 0",
                vec![(g.clone(), u64::MAX, 0)],
            ),
        ] {
            assert_unreadable(&storage, what, entries);
        }
        still_works(&storage, &w, 2);
    }
}

// ---- big values ----

#[test]
fn values_bigger_than_the_sandbox_trap_only_their_writer() {
    let (_tmp, storage) = open_temp(&[]);
    let small = storage
        .create_writer_with("small", RANGE, WriterOptions::new().memory_limit(4 << 20))
        .unwrap();
    let other = storage.create_writer("other", RANGE).unwrap();
    let before = store_entries(&storage);
    let huge = vec![0xabu8; 8 << 20];
    let result = small.append(RANGE.start, &huge);
    assert!(
        matches!(&result, Err(Error::Trapped { writer, .. }) if writer == "small"),
        "{result:?}"
    );
    assert!(small.failure().is_some());
    assert!(matches!(small.persist(0, 1), Err(Error::Trapped { .. })));
    // A batch whose data is huge but whose columns do not add up is rejected whole.
    assert_invalid_argument(
        other.append_batch(&[RANGE.start], &[1], &huge),
        "huge data, wrong length",
    );
    assert_eq!(store_entries(&storage), before);
    still_works(&storage, &other, 1);
    // A large value within the limit goes through and reads back.
    let big = vec![7u8; 1 << 20];
    let from = other.next_sequence_number().unwrap();
    other.append(RANGE.end, &big).unwrap();
    let snapshot = other.persist(from, 2).unwrap().wait().unwrap();
    let changes = storage.read(&snapshot.remote).unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].value, big);
}
