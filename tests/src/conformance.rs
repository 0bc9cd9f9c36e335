//! The store conformance suite: what every [`Store`] promises its callers (the uploader,
//! the registries' deletions, `dstl gc`), checked the same way against every
//! implementation. `tests/tests/store_conformance.rs` runs it against [`dstl::LocalStore`],
//! [`dstl::S3Store`] on a real SeaweedFS, and the
//! [`FaultStore`](crate::fault_store::FaultStore) with no fault planned.
//!
//! Each check gets fresh, empty stores: the store under test at `<check>/<job>/dstl` and
//! a *sibling* at `<check>/<job>/dstl-sibling` — a location whose name extends the store's,
//! so a prefix compared as a string instead of by path segments shows up. The checks:
//!
//! | check | what it holds the store to |
//! | --- | --- |
//! | [`create_then_read`] | a created file reads back whole (also an empty one), under the path `create` returned, which ends in `/<name>` |
//! | [`create_parts_joins_the_parts`] | `create_parts` writes the parts one after the other (empty parts, no parts, parts larger than a write buffer) |
//! | [`ranged_reads`] | `read_range` gives exactly the bytes of the range; an empty range gives nothing; a range reaching past the end gives the bytes up to the end; one starting at or past the end gives nothing or an error, never bytes |
//! | [`list_is_sorted_and_holds_only_this_store`] | `list` names every file of the store, sorted, by the path `create` returned, with its size and a plausible modification time — and nothing of the sibling |
//! | [`delete_removes_and_a_missing_file_counts_as_deleted`] | a deleted file is gone (not readable, not listed); deleting it again, or a file never created, succeeds |
//! | [`reading_a_missing_file_is_not_found`] | `read` and `read_range` of a file of the store that does not exist fail with `NotFound` |
//! | [`conditional_create_never_overwrites`] | creating an existing name fails with `AlreadyExists` and leaves the original bytes (same bytes again: see [`SameBytesAgain`]) |
//! | [`concurrent_creates_of_one_name_have_one_winner`] | of creates racing for one name, exactly one succeeds and its bytes stay |
//! | [`deleting_outside_the_store_is_refused`] | `delete` of a path outside the store (the sibling's file, `..`, the store's own directory, other buckets, relative paths, other schemes) fails with `InvalidInput` and deletes nothing |
//! | [`reading_outside_the_store_is_refused`] | the same for `read` and `read_range` |

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use dstl::Store;

/// What creating an existing name again with the very bytes it holds does: the one case
/// where the stores legitimately differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameBytesAgain {
    /// Fails with `AlreadyExists` like any other existing name (a local directory: the
    /// create is atomic, there is no retried request to recognise).
    Refused,
    /// Succeeds with the same path: an object store cannot tell it from a conditional put
    /// whose response was lost and that the client retried, so it reads the object back
    /// and accepts its own bytes (`host/src/store/s3.rs`).
    Accepted,
}

/// A kind of store under test.
pub struct Subject<'a> {
    /// Names the kind in messages.
    pub name: &'a str,
    /// Opens a fresh, empty store at `location`, a relative `/`-separated path (a
    /// directory under the test's temporary directory, or a key prefix in the test's
    /// bucket). Two locations open two stores.
    pub open: &'a (dyn Fn(&str) -> Arc<dyn Store> + Sync),
    /// What creating an existing name with its own bytes does.
    pub same_bytes_again: SameBytesAgain,
}

/// The stores one check runs on.
pub struct Stores {
    /// The store under test, at `<check>/<job>/dstl`.
    pub store: Arc<dyn Store>,
    /// A store at `<check>/<job>/dstl-sibling`.
    pub sibling: Arc<dyn Store>,
    /// See [`Subject::same_bytes_again`].
    pub same_bytes_again: SameBytesAgain,
}

/// One check of the suite.
pub type Check = fn(&Stores);

/// Every check, by name.
pub const CHECKS: &[(&str, Check)] = &[
    ("create_then_read", create_then_read),
    ("create_parts_joins_the_parts", create_parts_joins_the_parts),
    ("ranged_reads", ranged_reads),
    (
        "list_is_sorted_and_holds_only_this_store",
        list_is_sorted_and_holds_only_this_store,
    ),
    (
        "delete_removes_and_a_missing_file_counts_as_deleted",
        delete_removes_and_a_missing_file_counts_as_deleted,
    ),
    (
        "reading_a_missing_file_is_not_found",
        reading_a_missing_file_is_not_found,
    ),
    (
        "conditional_create_never_overwrites",
        conditional_create_never_overwrites,
    ),
    (
        "concurrent_creates_of_one_name_have_one_winner",
        concurrent_creates_of_one_name_have_one_winner,
    ),
    (
        "deleting_outside_the_store_is_refused",
        deleting_outside_the_store_is_refused,
    ),
    (
        "reading_outside_the_store_is_refused",
        reading_outside_the_store_is_refused,
    ),
];

/// A job id as `dstl` generates them.
const JOB: &str = "0123456789abcdef0123456789abcdef";

/// Runs every check of [`CHECKS`] against `subject`, each on fresh stores, and fails
/// naming every check that failed (all of them run, so one failure hides no other).
pub fn check_store(subject: &Subject<'_>) {
    let mut failures = Vec::new();
    for (name, check) in CHECKS {
        let stores = Stores {
            store: (subject.open)(&format!("{name}/{JOB}/dstl")),
            sibling: (subject.open)(&format!("{name}/{JOB}/dstl-sibling")),
            same_bytes_again: subject.same_bytes_again,
        };
        match catch_unwind(AssertUnwindSafe(|| check(&stores))) {
            Ok(()) => println!("{} conformance: {name} ... ok", subject.name),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                println!("{} conformance: {name} ... FAILED", subject.name);
                failures.push(format!("{name}: {message}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} fails {} of {} conformance checks:\n{}",
        subject.name,
        failures.len(),
        CHECKS.len(),
        failures.join("\n")
    );
}

/// `len` deterministic bytes that differ with `seed` (any 256 in a row hold every value).
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The directory (or URL prefix) a created path lies in: everything before its last `/`.
fn location_of(path: &str) -> &str {
    path.rsplit_once('/')
        .unwrap_or_else(|| panic!("a store path without `/`: {path}"))
        .0
}

fn kind_of<T: std::fmt::Debug>(result: std::io::Result<T>, what: &str) -> std::io::ErrorKind {
    match result {
        Err(e) => e.kind(),
        Ok(value) => panic!("{what} succeeded: {value:?}"),
    }
}

/// `path` of `store` reads back as `expected`; `what` says why it should.
#[track_caller]
fn assert_reads(store: &dyn Store, path: &str, expected: &[u8], what: &str) {
    let read = store
        .read(path)
        .unwrap_or_else(|e| panic!("{what}: cannot read {path}: {e}"));
    assert_eq!(read, expected, "{what}");
}

fn created(store: &dyn Store, name: &str, bytes: &[u8]) -> String {
    let path = store
        .create(name, bytes)
        .unwrap_or_else(|e| panic!("cannot create {name} in {}: {e}", store.describe()));
    assert!(
        path.ends_with(&format!("/{name}")),
        "create({name:?}) returned {path}, not a path ending in /{name}"
    );
    path
}

/// A created file reads back whole, also an empty one.
pub fn create_then_read(s: &Stores) {
    let store = &*s.store;
    let content = bytes(1000, 7);
    let path = created(store, "f", &content);
    assert_reads(store, &path, &content, &format!("{path} reads back"));
    let empty = created(store, "empty", b"");
    assert_reads(store, &empty, b"", "an empty file reads back empty");
    assert_eq!(
        location_of(&path),
        location_of(&empty),
        "files of one store lie in one place"
    );
}

/// `create_parts` writes its parts one after the other.
pub fn create_parts_joins_the_parts(s: &Stores) {
    let store = &*s.store;
    // Larger than the local store's default write buffer of 1 MiB.
    let large = bytes(1_500_000, 3);
    let parts: Vec<&[u8]> = vec![b"ab", b"", b"cdefg", &large, b"h", b""];
    let path = store.create_parts("parts", &parts).unwrap();
    assert!(path.ends_with("/parts"), "{path}");
    let read = store.read(&path).unwrap();
    assert!(
        read == parts.concat(),
        "the parts read back joined, in order"
    );
    let none = store.create_parts("no-parts", &[]).unwrap();
    assert_reads(store, &none, b"", "no parts make an empty file");
}

/// `read_range` reads exactly the range, clamped to the end of the file. A range that
/// reaches past the end gives the bytes up to the end (the recovery reader asks for one
/// byte more than a plain file holds, to see its end). For a range that starts at or past
/// the end, or ends beyond `i64::MAX` (more than an HTTP range header carries), the trait
/// does not say whether the answer is nothing or an error — the default (and the local
/// store) gives nothing, S3 servers answer 416 — so either is accepted, other bytes never.
pub fn ranged_reads(s: &Stores) {
    let store = &*s.store;
    let content = bytes(100, 11);
    let path = created(store, "ranged", &content);
    let exact: [(std::ops::Range<u64>, &[u8], &str); 10] = [
        (0..100, &content, "the whole file"),
        (10..20, &content[10..20], "a range inside"),
        (0..1, &content[..1], "the first byte"),
        (99..100, &content[99..], "the last byte"),
        (0..0, b"", "an empty range at the start"),
        (50..50, b"", "an empty range inside"),
        (100..100, b"", "an empty range at the end"),
        (90..200, &content[90..], "a range reaching past the end"),
        (0..1 << 40, &content, "a range reaching 1 TiB past the end"),
        (0..i64::MAX as u64, &content, "a range up to i64::MAX"),
    ];
    let nothing_or_error: [(std::ops::Range<u64>, &[u8], &str); 3] = [
        (0..u64::MAX, &content, "a range up to u64::MAX"),
        (100..150, b"", "a range starting at the end"),
        (150..200, b"", "a range starting past the end"),
    ];
    let mut wrong = Vec::new();
    let cases = exact
        .iter()
        .map(|c| (c, true))
        .chain(nothing_or_error.iter().map(|c| (c, false)));
    for ((range, expected, what), must_succeed) in cases {
        match store.read_range(&path, range.clone()) {
            Ok(read) if read == *expected => {}
            Ok(read) => wrong.push(format!(
                "{what} ({range:?}): read {} bytes, expected {}",
                read.len(),
                expected.len()
            )),
            Err(e) if must_succeed => wrong.push(format!("{what} ({range:?}): {e}")),
            Err(_) => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "ranged reads of {path} (100 bytes):\n  {}",
        wrong.join("\n  ")
    );
}

/// `list` names every file of the store, sorted, by the path `create` returned, and
/// nothing of the sibling.
pub fn list_is_sorted_and_holds_only_this_store(s: &Stores) {
    let store = &*s.store;
    assert_eq!(
        store.list().unwrap(),
        Vec::new(),
        "a fresh store lists nothing"
    );
    let started = SystemTime::now();
    let victim = created(&*s.sibling, "sibling-file", b"not yours");
    let mut expected = Vec::new();
    for (i, name) in ["c", "a", "b10", "b2", "a-", "z"].into_iter().enumerate() {
        let content = bytes(10 + i, i as u8);
        expected.push((created(store, name, &content), content.len() as u64));
    }
    expected.sort();
    let listed = store.list().unwrap();
    let got: Vec<(String, u64)> = listed.iter().map(|f| (f.path.clone(), f.size)).collect();
    assert_eq!(
        got, expected,
        "list: every file, sorted by path, with its size"
    );
    let slack = Duration::from_secs(60);
    let now = SystemTime::now();
    for file in &listed {
        assert!(
            file.modified + slack >= started && file.modified <= now + slack,
            "{} modified at {:?}, created between {started:?} and {now:?}",
            file.path,
            file.modified
        );
    }
    assert!(
        !listed.iter().any(|f| f.path == victim),
        "the sibling's file is listed"
    );
    store.delete(&expected[0].0).unwrap();
    let after: Vec<String> = store.list().unwrap().into_iter().map(|f| f.path).collect();
    let remaining: Vec<String> = expected[1..].iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(after, remaining, "a deleted file is no longer listed");
    assert_eq!(
        s.sibling.list().unwrap().len(),
        1,
        "the sibling lists its own file"
    );
}

/// A deleted file is gone; deleting it again, or a file never created, succeeds.
pub fn delete_removes_and_a_missing_file_counts_as_deleted(s: &Stores) {
    let store = &*s.store;
    let path = created(store, "doomed", b"bytes");
    let kept = created(store, "kept", b"stays");
    store.delete(&path).unwrap();
    assert_eq!(
        kind_of(store.read(&path), "reading a deleted file"),
        std::io::ErrorKind::NotFound
    );
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|f| f.path).collect();
    assert_eq!(listed, vec![kept.clone()]);
    store
        .delete(&path)
        .unwrap_or_else(|e| panic!("deleting {path} again: {e}"));
    let never = format!("{}/never-created", location_of(&path));
    store
        .delete(&never)
        .unwrap_or_else(|e| panic!("deleting {never}, which never existed: {e}"));
    assert_eq!(store.read(&kept).unwrap(), b"stays");
}

/// Reading a file of the store that does not exist fails with `NotFound`.
pub fn reading_a_missing_file_is_not_found(s: &Stores) {
    let store = &*s.store;
    let path = created(store, "present", b"x");
    let missing = format!("{}/missing", location_of(&path));
    assert_eq!(
        kind_of(store.read(&missing), "reading a missing file"),
        std::io::ErrorKind::NotFound
    );
    assert_eq!(
        kind_of(
            store.read_range(&missing, 0..1),
            "reading a range of a missing file"
        ),
        std::io::ErrorKind::NotFound
    );
}

/// Creating an existing name fails and leaves the original bytes; the same bytes again
/// do what [`Stores::same_bytes_again`] says.
pub fn conditional_create_never_overwrites(s: &Stores) {
    let store = &*s.store;
    let path = created(store, "once", b"original");
    for (what, result) in [
        ("create with other bytes", store.create("once", b"changed")),
        (
            "create with the original bytes and more",
            store.create("once", b"original and more"),
        ),
        ("create of an empty file", store.create("once", b"")),
        (
            "create_parts with other bytes",
            store.create_parts("once", &[b"chan", b"ged"]),
        ),
    ] {
        assert_eq!(
            kind_of(result, what),
            std::io::ErrorKind::AlreadyExists,
            "{what}"
        );
        assert_reads(
            store,
            &path,
            b"original",
            &format!("{what} changed the file"),
        );
    }
    let again = store.create("once", b"original");
    match s.same_bytes_again {
        SameBytesAgain::Refused => assert_eq!(
            kind_of(again, "create with the same bytes"),
            std::io::ErrorKind::AlreadyExists
        ),
        SameBytesAgain::Accepted => assert_eq!(
            again.unwrap_or_else(|e| panic!("create with the same bytes: {e}")),
            path,
            "a create with the same bytes answers the same path"
        ),
    }
    assert_eq!(store.read(&path).unwrap(), b"original");
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|f| f.path).collect();
    assert_eq!(listed, vec![path], "failed creates leave nothing behind");
}

/// Of creates racing for one name with different bytes, exactly one wins.
pub fn concurrent_creates_of_one_name_have_one_winner(s: &Stores) {
    const RACERS: usize = 4;
    for round in 0..5 {
        let name = format!("race-{round}");
        let barrier = Barrier::new(RACERS);
        let results: Vec<(Vec<u8>, std::io::Result<String>)> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..RACERS)
                .map(|i| {
                    let (store, name, barrier) = (&s.store, &name, &barrier);
                    scope.spawn(move || {
                        let content = bytes(64 + i, i as u8);
                        barrier.wait();
                        let result = store.create(name, &content);
                        (content, result)
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let winners: Vec<&(Vec<u8>, std::io::Result<String>)> =
            results.iter().filter(|(_, r)| r.is_ok()).collect();
        assert_eq!(
            winners.len(),
            1,
            "{name}: {} of {RACERS} racing creates succeeded",
            winners.len()
        );
        for (_, result) in &results {
            if let Err(e) = result {
                assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{name}: {e}");
            }
        }
        let (content, path) = winners[0];
        let path = path.as_ref().unwrap();
        assert!(
            s.store.read(path).unwrap() == *content,
            "{name}: the file holds the winner's bytes"
        );
    }
}

/// Paths no store may act on, derived from a file of the store (`own`, at
/// `<parent>/dstl/own`) and a file of the sibling (`victim`, at
/// `<parent>/dstl-sibling/sibling-file`).
fn outside_paths(own: &str, victim: &str) -> Vec<String> {
    let dir = location_of(own);
    let parent = location_of(dir);
    let key = |path: &str| match path.strip_prefix("s3://") {
        Some(rest) => rest.split_once('/').map_or("", |(_, key)| key).to_string(),
        None => path.trim_start_matches('/').to_string(),
    };
    vec![
        victim.to_string(),
        format!("{dir}/../dstl-sibling/sibling-file"),
        format!("{dir}/../x"),
        format!("{dir}/.."),
        format!("{dir}/."),
        format!("{dir}/"),
        dir.to_string(),
        parent.to_string(),
        String::new(),
        "own".into(),
        "relative/path".into(),
        "../../../../etc/passwd".into(),
        "/etc/passwd".into(),
        "/".into(),
        format!("s3://another-bucket/{}", key(own)),
        format!("file://{own}"),
        format!("file://{victim}"),
    ]
}

/// Deleting a path outside the store fails with `InvalidInput` and deletes nothing.
pub fn deleting_outside_the_store_is_refused(s: &Stores) {
    let store = &*s.store;
    let own = created(store, "own", b"mine");
    let victim = created(&*s.sibling, "sibling-file", b"precious");
    for path in outside_paths(&own, &victim) {
        match store.delete(&path) {
            Err(e) => assert_eq!(
                e.kind(),
                std::io::ErrorKind::InvalidInput,
                "delete({path:?}): {e}"
            ),
            Ok(()) => panic!("delete({path:?}) of a path outside the store succeeded"),
        }
        assert_reads(
            &*s.sibling,
            &victim,
            b"precious",
            &format!("delete({path:?}) touched the sibling's file"),
        );
        assert_reads(
            store,
            &own,
            b"mine",
            &format!("delete({path:?}) touched the store's file"),
        );
    }
}

/// Reading a path outside the store fails with `InvalidInput`.
pub fn reading_outside_the_store_is_refused(s: &Stores) {
    let store = &*s.store;
    let own = created(store, "own", b"mine");
    let victim = created(&*s.sibling, "sibling-file", b"precious");
    let mut read = Vec::new();
    for path in outside_paths(&own, &victim) {
        for (what, result) in [
            ("read", store.read(&path)),
            ("read_range", store.read_range(&path, 0..4)),
        ] {
            match result {
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
                Err(e) => read.push(format!("{what}({path:?}) failed with {:?}: {e}", e.kind())),
                Ok(bytes) => read.push(format!(
                    "{what}({path:?}) read {} bytes{}",
                    bytes.len(),
                    if path.contains("sibling") {
                        " of another store's file"
                    } else {
                        ""
                    }
                )),
            }
        }
    }
    assert!(
        read.is_empty(),
        "paths outside the store are not refused with InvalidInput:\n  {}",
        read.join("\n  ")
    );
}
