//! One conformance suite (`dstl_tests::conformance`, its checks listed there) against
//! every store: a local directory as the storage opens it, a local directory with a tiny
//! write buffer and no fsync, an S3 bucket on a real SeaweedFS, and the fault-injecting
//! store of the other tests with no fault planned (it must behave as the local store it
//! wraps). Each test runs every check and names all that fail.

use std::path::Path;
use std::sync::Arc;

use dstl::{LocalStore, S3Store, Store};
use dstl_tests::conformance::{SameBytesAgain, Subject, check_store};
use dstl_tests::fault_store::FaultStore;
use dstl_tests::seaweed::Seaweed;

/// Runs the suite against a local store `open` builds over a directory of a fresh
/// temporary directory; local stores refuse the same bytes again.
fn check_local_store(name: &str, open: impl Fn(&Path) -> Arc<dyn Store> + Sync) {
    let tmp = tempfile::tempdir().unwrap();
    check_store(&Subject {
        name,
        open: &|location| open(&tmp.path().join(location)),
        same_bytes_again: SameBytesAgain::Refused,
    });
}

#[test]
fn local_store_conforms() {
    check_local_store("LocalStore", |dir| Arc::new(LocalStore::open(dir).unwrap()));
}

/// Parts gathered through a 3-byte buffer (and written directly when larger), without
/// fsync (`dstl.dfs.upload.buffer-size`, `dstl.dfs.local.fsync`).
#[test]
fn local_store_with_a_small_buffer_and_no_fsync_conforms() {
    check_local_store("LocalStore (3-byte buffer, no fsync)", |dir| {
        Arc::new(
            LocalStore::open(dir)
                .unwrap()
                .with_buffer_size(3)
                .with_fsync(false),
        )
    });
}

#[test]
fn s3_store_conforms() {
    let server = Seaweed::start("conformance");
    let settings = server.settings();
    check_store(&Subject {
        name: "S3Store",
        open: &|location| -> Arc<dyn Store> {
            Arc::new(S3Store::open(&settings, &server.bucket, location, "").unwrap())
        },
        same_bytes_again: SameBytesAgain::Accepted,
    });
}

#[test]
fn fault_store_without_faults_conforms() {
    check_local_store("FaultStore", |dir| FaultStore::new(dir));
}
