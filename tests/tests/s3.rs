//! dstl against a real S3-compatible server (SeaweedFS on loopback): end to end, faults
//! (server paused or killed), the conditional-create check and orphan collection.

use std::time::{Duration, Instant};

use dstl::manifest::ManifestFile;
use dstl::{ChangelogStorage, Error, S3Store, Store, Writer};
use dstl_tests::harness::{RANGE, checkpoint, gc_orphans, open_s3, payloads, remote_paths};
use dstl_tests::seaweed::Seaweed;

#[test]
fn end_to_end_against_seaweedfs() {
    let server = Seaweed::start("dstl");
    for compression in [false, true] {
        let storage = open_s3(
            &server,
            "e2e/run",
            &[&format!("dstl.dfs.compression.enabled={compression}")],
        );
        let writers: Vec<Writer> = (0..3)
            .map(|i| storage.create_writer(&format!("op-{i}"), RANGE).unwrap())
            .collect();
        let mut last = Vec::new();
        for w in &writers {
            let (first, to) = checkpoint(w, 0, 1, b"one").unwrap();
            assert!(
                first.remote.entries[0]
                    .handle
                    .path
                    .starts_with("s3://dstl/e2e/run/")
            );
            let (second, _) = checkpoint(w, 0, 2, b"two").unwrap();
            assert_eq!(
                payloads(&storage, &second.remote),
                vec![b"one".to_vec(), b"two".to_vec()]
            );
            w.truncate(to).unwrap();
            last.push(second);
        }
        storage.wait_idle();
        let listed = storage.store().list().unwrap();
        for snapshot in &last {
            for entry in &snapshot.remote.entries {
                assert!(
                    listed.iter().any(|f| f.path == entry.handle.path),
                    "{} listed",
                    entry.handle.path
                );
            }
        }
        // A separate reader (as at recovery) reads the same through ranged reads.
        let files = dstl::FileSource::new(Some(server.settings()));
        for snapshot in &last {
            let changes = dstl::reader::read_handle(&snapshot.remote, &files).unwrap();
            assert_eq!(changes.len(), 2);
        }
    }
}

#[test]
fn conditional_create_accepts_our_own_write_only() {
    let server = Seaweed::start("cond");
    let store = S3Store::open(
        &server.settings(),
        "cond",
        "p",
        "0123456789abcdef0123456789abcdef",
    )
    .unwrap();
    let url = store.create("f", b"payload").unwrap();
    assert_eq!(url, "s3://cond/p/0123456789abcdef0123456789abcdef/dstl/f");
    // The same bytes again: what a client retry after a lost response sees.
    assert_eq!(store.create("f", b"payload").unwrap(), url);
    let e = store.create("f", b"other").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(store.read(&url).unwrap(), b"payload");
    assert_eq!(store.read_range(&url, 3..5).unwrap(), b"lo");
    // Paths outside the store are refused, not deleted.
    for bad in [
        "s3://cond/elsewhere/f",
        "s3://other/p/f",
        "/etc/passwd",
        "s3://cond/p/0123456789abcdef0123456789abcdef/dstl/../x",
    ] {
        assert_eq!(
            store.delete(bad).unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput,
            "{bad}"
        );
    }
    store.delete(&url).unwrap();
    store.delete(&url).unwrap();
    assert!(store.list().unwrap().is_empty());
}

/// A writer of a storage on `server`'s bucket under `prefix` (without batching delay,
/// then `conf`) whose checkpoint 1 of `value` is acknowledged; then `fault` is done to
/// the server and its checkpoint 2 fails, and `recover` undoes the fault, after which
/// checkpoint 1 still reads back. Returns the storage, the writer, checkpoint 2's error
/// and how long it took to fail.
fn fails_after_fault(
    server: &mut Seaweed,
    prefix: &str,
    conf: &[&str],
    value: &[u8],
    fault: fn(&mut Seaweed),
    recover: fn(&mut Seaweed),
) -> (ChangelogStorage, Writer, Error, Duration) {
    let storage = open_s3(
        server,
        prefix,
        &[&["dstl.dfs.batch.persist-delay=0"][..], conf].concat(),
    );
    let w = storage.create_writer("op", RANGE).unwrap();
    let (acknowledged, to) = checkpoint(&w, 0, 1, value).unwrap();
    fault(server);
    let started = Instant::now();
    let error = checkpoint(&w, to, 2, b"lost").unwrap_err();
    let elapsed = started.elapsed();
    recover(server);
    // The checkpoint acknowledged before the fault reads back.
    assert_eq!(
        payloads(&storage, &acknowledged.remote),
        vec![value.to_vec()]
    );
    (storage, w, error, elapsed)
}

#[test]
fn paused_server_makes_persists_fail_not_hang() {
    let mut server = Seaweed::start("paused");
    let (storage, w, error, elapsed) = fails_after_fault(
        &mut server,
        "p",
        &[
            "dstl.dfs.upload.timeout=300ms",
            "dstl.dfs.upload.max-attempts=2",
        ],
        b"acknowledged",
        |server| server.pause(),
        |server| server.resume(),
    );
    assert!(error.to_string().contains("timed out"), "{error}");
    assert!(
        elapsed < Duration::from_secs(30),
        "failed after {elapsed:?}"
    );
    // And the writer goes on once the server is back.
    let sqn = w.next_sequence_number().unwrap();
    let (after, _) = checkpoint(&w, sqn, 3, b"after").unwrap();
    assert_eq!(payloads(&storage, &after.remote), vec![b"after".to_vec()]);
}

#[test]
fn killed_server_makes_persists_fail_and_acknowledged_data_survives() {
    let mut server = Seaweed::start("killed");
    let (_storage, _w, error, elapsed) = fails_after_fault(
        &mut server,
        "k",
        &[
            "dstl.dfs.upload.timeout=2s",
            "dstl.dfs.upload.next-attempt-delay=50ms",
        ],
        b"before the crash",
        Seaweed::kill,
        Seaweed::restart,
    );
    assert!(error.to_string().contains("after 3 attempts"), "{error}");
    assert!(elapsed < Duration::from_secs(60));
}

#[test]
fn gc_finds_and_deletes_orphans_in_the_bucket() {
    let server = Seaweed::start("orphans");
    let storage = open_s3(&server, "g", &[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    let (snapshot, _) = checkpoint(&w, 0, 1, b"live").unwrap();
    let manifests = tempfile::tempdir().unwrap();
    dstl::manifest::Manifest::from_snapshot(&snapshot)
        .store(&manifests.path().join("op.json"))
        .unwrap();
    let orphan = storage
        .store()
        .create("orphan-after-crash", b"\x00")
        .unwrap();
    storage.wait_idle();
    let config = storage.config().clone();
    let live = dstl::gc::live(manifests.path()).unwrap();
    let listing = dstl::gc::stored_files(&config, &live.jobs).unwrap();
    // The open storage's lease lives in the bucket beside the job's files.
    assert_eq!(listing.leases.len(), 1, "{:?}", listing.leases);
    assert!(listing.leases[0].is_live(std::time::SystemTime::now()));
    let files = listing.files;
    let (young, _) = gc_orphans(
        files.clone(),
        &live,
        Duration::from_secs(3600),
        std::time::SystemTime::now(),
    );
    assert!(
        young.is_empty(),
        "nothing is an orphan within the grace period"
    );
    let (orphans, report) = gc_orphans(
        files,
        &live,
        Duration::ZERO,
        std::time::SystemTime::now() + Duration::from_secs(1),
    );
    assert_eq!(orphans, vec![orphan.clone()]);
    assert_eq!(dstl::gc::delete(&config, &report).unwrap(), 1);
    let left: Vec<String> = storage
        .store()
        .list()
        .unwrap()
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert_eq!(left, remote_paths(&snapshot));
    assert_eq!(payloads(&storage, &snapshot.remote), vec![b"live".to_vec()]);
}
