//! The lease's terms, through the wasmtime host: a storage whose lease lapsed (the
//! process was stopped longer than the lease protects) does not acknowledge a checkpoint
//! naming a file that `dstl gc` may have collected meanwhile, and writes its lease again;
//! gc on the same machine sees at once that a lease's holder died, and judges a lease of
//! another machine by its age only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use dstl::gc::{Live, classify, delete, stored_files};
use dstl::{ChangelogStorage, Config, Error, SnapshotResult, Writer};
use dstl_proto::lease::{LEASE_DIR, LEASE_SUFFIX, LeaseOwner, LeaseRecord};
use dstl_tests::harness::{
    RANGE, config as test_config, in_temp_dir, open_temp, payloads, persist, remote_paths,
};
use tempfile::TempDir;

/// Ages `path` by `by` (its modification time), as the clock of a gc running that much
/// later sees it.
fn age(path: &Path, by: Duration) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now() - by))
        .unwrap_or_else(|e| panic!("cannot age {}: {e}", path.display()));
}

/// The configuration of a storage over a fresh temporary directory (the harness's), and
/// that directory.
fn temp_config() -> (TempDir, Config) {
    in_temp_dir(|dir| test_config(dir, &[]))
}

/// The directory of `config`'s job that holds its leases.
fn lease_dir(config: &Config) -> PathBuf {
    Path::new(&config.base_path)
        .join(config.job_id())
        .join(LEASE_DIR)
}

/// The lease files of `config`'s job.
fn leases(config: &Config) -> Vec<PathBuf> {
    match std::fs::read_dir(lease_dir(config)) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// `dstl gc --delete` with no manifest naming anything of the job and a grace of an hour:
/// returns the paths it deleted.
fn collect(config: &Config) -> Vec<String> {
    let jobs = BTreeSet::from([config.job_id().to_string()]);
    let listing = stored_files(config, &jobs).unwrap();
    let report = classify(
        &listing,
        &Live::default(),
        Duration::from_secs(3600),
        SystemTime::now(),
    )
    .unwrap();
    delete(config, &report).unwrap();
    report.orphans.iter().map(|o| o.file.path.clone()).collect()
}

/// A writer `op` of `storage` that has appended `one` to key group 1 and persisted it as
/// checkpoint 1, and the snapshot.
fn op_persisted(storage: &ChangelogStorage) -> (Writer, SnapshotResult) {
    let writer = storage.create_writer("op", RANGE).unwrap();
    writer.append(1, b"one").unwrap();
    let (snapshot, _) = persist(&writer, 0, 1);
    (writer, snapshot)
}

#[track_caller]
fn lapsed<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match result {
        Err(e @ Error::LeaseLapsed { .. }) => e.to_string(),
        other => panic!("expected a lapsed lease, got {other:?}"),
    }
}

#[test]
fn a_storage_whose_lease_lapsed_acknowledges_no_checkpoint_naming_an_older_file() {
    let (_tmp, storage) = open_temp(&[]);
    let config = storage.config().clone();
    let (writer, first) = op_persisted(&storage);
    let held = remote_paths(&first);
    assert_eq!(held.len(), 1);
    assert_eq!(leases(&config).len(), 1);

    // The process is stopped for 11 minutes, past the lease's 10: meanwhile gc, on its
    // own clock, finds the lease expired and collects it with every file of the job no
    // manifest names and older than its grace, the file checkpoint 1 named included.
    storage.backdate_lease(Duration::from_secs(660));
    for lease in leases(&config) {
        age(&lease, Duration::from_secs(660));
    }
    age(Path::new(&held[0]), Duration::from_secs(2 * 3600));
    let deleted = collect(&config);
    assert!(
        deleted.contains(&held[0]),
        "gc collected the held file: {deleted:?}"
    );
    assert!(leases(&config).is_empty(), "and the expired lease");

    // The process runs again. Its next checkpoint would name the deleted file: it fails
    // instead of being acknowledged, while the lease is still lapsed ...
    writer.append(2, b"two").unwrap();
    let now = lapsed(writer.persist(0, 2).unwrap().wait());
    assert!(now.contains("has not been refreshed for 660 s"), "{now}");
    // ... and after the refresh, which writes the lease again, still: the file was
    // written before the lapse.
    storage.refresh_lease_now();
    assert_eq!(leases(&config).len(), 1, "the lease was written again");
    let before = lapsed(writer.persist(0, 3).unwrap().wait());
    assert!(
        before.contains("written before the storage's lease on its job lapsed"),
        "{before}"
    );
    // A checkpoint that names only files written since is acknowledged, and reads back.
    let fresh = storage.create_writer("fresh", RANGE).unwrap();
    fresh.append(3, b"three").unwrap();
    let (snapshot, _) = persist(&fresh, 0, 1);
    assert_eq!(
        payloads(&storage, &snapshot.remote),
        vec![b"three".to_vec()]
    );
    storage.close();
    assert!(leases(&config).is_empty(), "close removes the lease");
}

#[test]
fn a_persist_completing_while_the_lease_is_lapsed_fails_and_one_after_a_refresh_succeeds() {
    let (_tmp, storage) = open_temp(&[]);
    let writer = storage.create_writer("op", RANGE).unwrap();
    // The persist's own upload starts and lands while the lease is lapsed: the file is
    // new, but nothing protected the job while it was written.
    storage.backdate_lease(Duration::from_secs(301));
    writer.append(1, b"one").unwrap();
    lapsed(writer.persist(0, 1).unwrap().wait());
    storage.refresh_lease_now();
    // Change set 0 was written while lapsed: every checkpoint naming it fails; the next
    // change sets alone are fine.
    lapsed(writer.persist(0, 2).unwrap().wait());
    let from = writer.next_sequence_number().unwrap();
    writer.append(2, b"two").unwrap();
    let (snapshot, _) = persist(&writer, from, 3);
    assert_eq!(payloads(&storage, &snapshot.remote), vec![b"two".to_vec()]);
}

/// The pid of a process of this machine and namespace that has exited: it runs nothing now.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// This machine's boot and pid namespace, as a lease's owner names them.
fn this_machine() -> (String, String) {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    (boot.trim().to_string(), ns.to_string_lossy().into_owned())
}

/// Writes a lease of `config`'s job held by `pid` on the machine `boot` in namespace
/// `namespace`, opened three hours ago and refreshed just now; and one changelog file of
/// the job, two hours old (older than gc's grace, younger than the lease). Returns the
/// file.
fn leased_job(config: &Config, pid: u32, boot: &str, namespace: &str) -> String {
    let job = Path::new(&config.base_path).join(config.job_id());
    let opened = SystemTime::now() - Duration::from_secs(3 * 3600);
    let opened_ms = opened
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let record = LeaseRecord::new(opened_ms, pid).with_owner(LeaseOwner {
        boot_id: boot.to_string(),
        pid_namespace: namespace.to_string(),
        start_ticks: 1,
    });
    std::fs::create_dir_all(job.join(LEASE_DIR)).unwrap();
    std::fs::create_dir_all(job.join("dstl")).unwrap();
    let lease = job.join(LEASE_DIR).join(format!(
        "0f2cbd1f-5a52-4b5b-9b1e-8d9a1f2e3c4d{LEASE_SUFFIX}"
    ));
    std::fs::write(&lease, record.to_json()).unwrap();
    let file = job
        .join("dstl")
        .join("3a4ecd65-9bd1-4b5c-8a7e-2f6d3c1b0a99");
    std::fs::write(&file, b"\0").unwrap();
    age(&file, Duration::from_secs(2 * 3600));
    file.to_string_lossy().into_owned()
}

#[test]
fn gc_collects_at_once_what_a_dead_holder_leased_and_judges_other_machines_by_age() {
    let dead = dead_pid();
    let (boot, namespace) = this_machine();

    let (_tmp, config) = temp_config();
    let file = leased_job(&config, dead, &boot, &namespace);
    let deleted = collect(&config);
    assert!(
        deleted.contains(&file),
        "the holder died: its fresh lease protects nothing and the file goes: {deleted:?}"
    );
    assert!(
        leases(&config).is_empty(),
        "the dead holder's lease goes too"
    );

    // The same lease written on another machine (or container) protects the job until it
    // expires: a pid means nothing there.
    for (other_boot, other_ns) in [
        ("another-boot", namespace.as_str()),
        (boot.as_str(), "pid:[1]"),
    ] {
        let (_tmp, config) = temp_config();
        let file = leased_job(&config, dead, other_boot, other_ns);
        let deleted = collect(&config);
        assert!(deleted.is_empty(), "{other_boot} {other_ns}: {deleted:?}");
        assert!(Path::new(&file).exists());
    }

    // The lease of a storage this process holds is never judged dead: gc leaves it.
    let (_tmp, storage) = open_temp(&[]);
    let (_writer, _) = op_persisted(&storage);
    let deleted = collect(storage.config());
    assert!(deleted.is_empty(), "{deleted:?}");
    assert_eq!(leases(storage.config()).len(), 1);
}

#[test]
fn opening_a_storage_removes_the_leases_of_earlier_holders_that_protect_nothing() {
    // A TaskManager killed mid-job leaves its lease; nothing else removes it while the job
    // runs on. The next storage of the job does, unless the lease may still be live.
    let dead = dead_pid();
    let (boot, namespace) = this_machine();
    let (_tmp, config) = temp_config();
    let dir = lease_dir(&config);
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, record: LeaseRecord| {
        let path = dir.join(format!("{name}{LEASE_SUFFIX}"));
        std::fs::write(&path, record.to_json()).unwrap();
        path
    };
    let owner = |boot: &str| LeaseOwner {
        boot_id: boot.to_string(),
        pid_namespace: namespace.clone(),
        start_ticks: 1,
    };
    let expired = write(
        "11111111-1111-4111-8111-111111111111",
        LeaseRecord::new(0, dead).with_owner(owner("another-boot")),
    );
    age(&expired, Duration::from_secs(11 * 60));
    let dead_holder = write(
        "22222222-2222-4222-8222-222222222222",
        LeaseRecord::new(0, dead).with_owner(owner(&boot)),
    );
    let live_elsewhere = write(
        "33333333-3333-4333-8333-333333333333",
        LeaseRecord::new(0, dead).with_owner(owner("another-boot")),
    );
    let storage = ChangelogStorage::open(config.clone()).unwrap();
    assert!(!expired.exists(), "the expired lease was removed");
    assert!(
        !dead_holder.exists(),
        "the lease of a holder that died here was removed"
    );
    assert!(
        live_elsewhere.exists(),
        "a fresh lease of another machine stays"
    );
    assert_eq!(leases(&config).len(), 2, "that one and the storage's own");
    storage.close();
    assert_eq!(leases(&config), vec![live_elsewhere]);
}
