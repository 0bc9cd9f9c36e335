//! Checks of the store and the local-copy directory against the model: at every sync
//! point ([`check_files`]) and once every writer was closed ([`final_check`]); and the
//! read-back of a snapshot ([`check_content`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dstl::{ChangelogHandle, ChangelogStorage, ReadError, WriterId};
use dstl_tests::fault_store::{FaultStore, Written};
use dstl_tests::harness::{by_key_group, files, path_strings, read_changes};

use crate::model::{Fate, Model, Upload, file_name};

/// Reads `handle` (the remote or local handle of writer `i`'s snapshot of `[from, to)`)
/// back. Its files must exist if `must_exist`; otherwise a missing file is allowed,
/// wrong content never. Returns whether it was read.
#[allow(clippy::too_many_arguments)]
pub fn check_content(
    storage: &ChangelogStorage,
    model: &Model,
    i: usize,
    from: u64,
    to: u64,
    handle: &ChangelogHandle,
    what: &str,
    must_exist: bool,
) -> bool {
    let w = &model.writers[i];
    let changes = match read_changes(storage, handle) {
        Ok(changes) => changes,
        Err(ReadError::Io { ref source, .. })
            if !must_exist && source.kind() == std::io::ErrorKind::NotFound =>
        {
            return false;
        }
        Err(e) => panic!(
            "{}: the {what} handle of snapshot [{from}, {to}) does not read back: {e}",
            w.name
        ),
    };
    let expected = by_key_group((from..to).flat_map(|s| w.sets[&s].changes.iter().cloned()));
    let actual = by_key_group(changes);
    assert!(
        actual == expected,
        "{}: the {what} handle of snapshot [{from}, {to}) reads back other changes:\nexpected {expected:?}\nactual   {actual:?}",
        w.name
    );
    true
}

/// The fates of every driver's writers, computed once per check.
struct Fates<'a> {
    models: &'a [&'a Model],
    fates: Vec<Vec<BTreeMap<u64, Fate>>>,
    /// Tag id → (driver, writer).
    by_tag: HashMap<u16, (usize, usize)>,
    /// Host writer id → (driver, writer).
    by_host: HashMap<WriterId, (usize, usize)>,
}

impl<'a> Fates<'a> {
    fn new(models: &'a [&'a Model]) -> Self {
        let mut by_tag = HashMap::new();
        let mut by_host = HashMap::new();
        for (m, model) in models.iter().enumerate() {
            for (i, w) in model.writers.iter().enumerate() {
                by_tag.insert(w.id, (m, i));
                by_host.insert(w.host_id, (m, i));
            }
        }
        Self {
            models,
            fates: models.iter().map(|m| m.fates()).collect(),
            by_tag,
            by_host,
        }
    }

    /// The driver and writer of tag id `id`.
    fn owner(&self, id: u16) -> (usize, usize) {
        *self
            .by_tag
            .get(&id)
            .unwrap_or_else(|| panic!("the store wrote change sets of an unknown writer {id}"))
    }

    fn fate(&self, id: u16, sqn: u64) -> Fate {
        let (m, i) = self.owner(id);
        self.fates[m][i][&sqn]
    }

    fn name(&self, id: u16) -> &str {
        let (m, i) = self.owner(id);
        &self.models[m].writers[i].name
    }

    /// The model knows `file` as the file its change sets were uploaded to (not a losing
    /// or failed attempt).
    fn winner(&self, file: &Written) -> bool {
        file.blocks.iter().all(|b| {
            let (m, i) = self.owner(b.writer);
            matches!(
                &self.models[m].writers[i].sets[&b.sqn].upload,
                Upload::Done { path, .. } if *path == file.path
            )
        })
    }

    /// The change sets of `file` per writer tag id.
    fn per_writer(file: &Written) -> BTreeMap<u16, Vec<u64>> {
        let mut per: BTreeMap<u16, Vec<u64>> = BTreeMap::new();
        for b in &file.blocks {
            per.entry(b.writer).or_default().push(b.sqn);
        }
        per
    }

    /// Writers (tag ids) that may still claim the local copy `local` of `file`.
    fn local_claimants(&self, file: &Written, local: &str) -> Vec<u16> {
        Self::per_writer(file)
            .into_iter()
            .filter(|(id, sqns)| {
                let (m, i) = self.owner(*id);
                self.models[m].may_claim_local(i, &self.fates[m][i], local, sqns)
            })
            .map(|(id, _)| id)
            .collect()
    }
}

/// Every entry of `dir` (none if it does not exist).
fn dir_paths(dir: &Path) -> HashSet<String> {
    path_strings(&files(dir)).into_iter().collect()
}

/// The local-copy directory, as handles name it.
pub fn local_dir(storage: &ChangelogStorage) -> PathBuf {
    let dir = storage.config().local_copies_dir();
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// Local copies already compared with their remote files, per seed.
#[derive(Default)]
pub struct Copies(Mutex<HashSet<String>>);

/// What [`check_files`] found.
#[derive(Debug, Default, Clone, Copy)]
pub struct FileCounts {
    /// Local copies required by a confirmed or held snapshot (summed over sync points).
    pub required_local: u64,
    /// Local copies on disk holding change sets of several writers.
    pub shared_local: u64,
}

/// At a sync point (nothing in flight): every file the store holds is expected, and every
/// expected file is there — files of confirmed snapshots and files with change sets still
/// held (or kept at a close) exist; files whose change sets were all released are gone;
/// nothing else is there. With local recovery, the same for the local copies.
pub fn check_files(
    models: &[&Model],
    store: &FaultStore,
    storage: &ChangelogStorage,
    written: &[Written],
    copies: &Copies,
) -> FileCounts {
    let errors = store.errors();
    assert!(errors.is_empty(), "the store saw bad uploads: {errors:?}");
    let fates = Fates::new(models);
    let on_disk: HashSet<String> = path_strings(&store.files()).into_iter().collect();
    let known: HashSet<&String> = written.iter().map(|f| &f.path).collect();
    for path in &on_disk {
        assert!(
            known.contains(path),
            "unexpected file in the store (a staging file or foreign write): {path}"
        );
    }
    let protected: HashSet<&String> = models.iter().flat_map(|m| &m.protected).collect();
    for (_, snap) in models.iter().flat_map(|m| &m.confirmed) {
        for entry in &snap.snapshot.remote.entries {
            assert!(
                on_disk.contains(&entry.handle.path),
                "file {} of confirmed checkpoint {} was deleted",
                entry.handle.path,
                snap.checkpoint
            );
        }
    }
    for file in written {
        let exists = on_disk.contains(&file.path);
        let described: Vec<(&str, u64, Fate)> = file
            .blocks
            .iter()
            .map(|b| (fates.name(b.writer), b.sqn, fates.fate(b.writer, b.sqn)))
            .collect();
        // A file the model does not know as the winner of its change sets lost (or its
        // upload failed after all): it must be gone.
        if !fates.winner(file) {
            assert!(
                !exists,
                "file {} of a losing or failed attempt is left: {described:?}",
                file.path
            );
            continue;
        }
        let confirmed = protected.contains(&file.path);
        let needed = confirmed
            || described
                .iter()
                .any(|f| matches!(f.2, Fate::Held | Fate::Abandoned));
        let released = described.iter().all(|f| f.2 == Fate::Released);
        if needed {
            assert!(
                exists,
                "file {} was deleted although it is needed (confirmed: {confirmed}; change sets {described:?})",
                file.path
            );
        } else if released {
            assert!(
                !exists,
                "file {} is left although every change set in it was released: {described:?}",
                file.path
            );
        }
    }
    if models[0].local_recovery {
        check_local(&fates, storage, written, &on_disk, copies)
    } else {
        let local = dir_paths(&local_dir(storage));
        assert!(
            local.is_empty(),
            "local copies without local recovery: {local:?}"
        );
        FileCounts::default()
    }
}

/// The local-copy directory against the model:
/// - every local copy is a copy of a file the store wrote and the model knows as the
///   winner of its change sets (same name; same bytes while the remote file exists), and
///   nothing else (no staging file) is there;
/// - a copy exists exactly while the local registry names an owner, every owner is a
///   writer with change sets in it that may still claim it, and some such writer exists;
/// - every copy a writer must still claim ([`Model::required_local`]: named by a
///   confirmed or still-held snapshot, not reached by a discard of that writer) exists,
///   with that writer among its owners.
fn check_local(
    fates: &Fates<'_>,
    storage: &ChangelogStorage,
    written: &[Written],
    remote_on_disk: &HashSet<String>,
    copies: &Copies,
) -> FileCounts {
    let mut counts = FileCounts::default();
    let dir = local_dir(storage);
    let local_path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let on_disk = dir_paths(&dir);
    let by_name: HashMap<&str, &Written> = written.iter().map(|f| (f.name.as_str(), f)).collect();
    let registry = storage.local_registry();
    for path in &on_disk {
        let name = file_name(path);
        let file = by_name.get(name).unwrap_or_else(|| {
            panic!(
                "unexpected file among the local copies (a staging file or foreign write): {path}"
            )
        });
        assert!(
            fates.winner(file),
            "local copy {path} of a losing or failed attempt is left"
        );
        // Files are never rewritten: one comparison per copy is enough.
        if remote_on_disk.contains(&file.path) && copies.0.lock().unwrap().insert(path.clone()) {
            let local = std::fs::read(path).unwrap();
            let remote = std::fs::read(&file.path).unwrap();
            assert!(
                local == remote,
                "local copy {path} differs from {} ({} vs {} bytes)",
                file.path,
                local.len(),
                remote.len()
            );
        }
        if Fates::per_writer(file).len() > 1 {
            counts.shared_local += 1;
        }
    }
    for file in written {
        let path = local_path(&file.name);
        let exists = on_disk.contains(&path);
        let owners = registry.owners(&path);
        assert_eq!(
            exists,
            !owners.is_empty(),
            "local copy {path}: on disk {exists}, but the local registry's owners are {owners:?}"
        );
        if !exists {
            continue;
        }
        let claimants = fates.local_claimants(file, &path);
        let names: Vec<&str> = claimants.iter().map(|&id| fates.name(id)).collect();
        assert!(
            !claimants.is_empty(),
            "local copy {path} is left although no writer can claim it any more (change sets {:?})",
            file.blocks
        );
        for owner in owners {
            let Some(&(m, i)) = fates.by_host.get(&owner) else {
                panic!("local copy {path} is owned by unknown writer {owner}")
            };
            let id = fates.models[m].writers[i].id;
            assert!(
                claimants.contains(&id),
                "local copy {path} is owned by {}, which cannot claim it (claimants {names:?}; change sets {:?}; its fates {:?})",
                fates.models[m].writers[i].name,
                file.blocks,
                Fates::per_writer(file).get(&id).map(|sqns| sqns
                    .iter()
                    .map(|s| (*s, fates.fates[m][i].get(s).copied()))
                    .collect::<Vec<_>>())
            );
        }
    }
    for model in fates.models {
        for (i, w) in model.writers.iter().enumerate() {
            for required in model.required_local(i) {
                counts.required_local += 1;
                let path = &required.path;
                let why = if required.confirmed {
                    "confirmed"
                } else {
                    "still held"
                };
                assert!(
                    on_disk.contains(path),
                    "{}: local copy {path} of its {why} checkpoint {} was deleted, although no \
                     discard of the writer reached it (discard bound {:?}, last used by {})",
                    w.name,
                    required.checkpoint,
                    w.discard_bound,
                    required.last
                );
                assert!(
                    registry.owners(path).contains(&w.host_id),
                    "{}: local copy {path} of its {why} checkpoint {} is not owned by it",
                    w.name,
                    required.checkpoint
                );
            }
        }
    }
    counts
}

/// What [`final_check`] found.
#[derive(Debug, Default, Clone, Copy)]
pub struct FinalCounts {
    /// Files left that no confirmed checkpoint owns (kept by closed writers).
    pub abandoned: u64,
    /// Files of attempts that lost to a faster one (written and deleted again).
    pub late: u64,
    /// Local copies left.
    pub local_left: u64,
}

/// After every writer was closed and everything settled: only files of confirmed
/// snapshots and files a close kept are left, the task registry tracks exactly the
/// latter, the upload metrics match what the store saw, and every confirmed snapshot
/// still reads back; with local recovery, the local copies left are exactly those some
/// writer may still claim, including every one a writer must still claim (as at every
/// sync point: [`check_files`]).
pub fn final_check(
    models: &[&Model],
    store: &FaultStore,
    storage: &ChangelogStorage,
    copies: &Copies,
    speculative: bool,
) -> FinalCounts {
    let written = store.written();
    check_files(models, store, storage, &written, copies);
    let fates = Fates::new(models);
    let protected: HashSet<&String> = models.iter().flat_map(|m| &m.protected).collect();
    let kept: HashSet<&String> = written
        .iter()
        .filter(|f| {
            f.blocks
                .iter()
                .any(|b| matches!(fates.fate(b.writer, b.sqn), Fate::Abandoned | Fate::Unknown))
        })
        .map(|f| &f.path)
        .collect();
    let mut counts = FinalCounts::default();
    for path in path_strings(&store.files()) {
        assert!(
            protected.contains(&path) || kept.contains(&path),
            "file {path} is left over after every writer was closed"
        );
        if !protected.contains(&path) {
            counts.abandoned += 1;
        }
    }
    assert_eq!(
        storage.task_registry().tracked() as u64,
        counts.abandoned,
        "files still tracked by the task registry vs unconfirmed files left"
    );
    // Every attempt reached the store once; nothing is queued or in flight.
    let metrics = storage.metrics();
    assert_eq!(metrics.upload_requests, store.creates(), "upload attempts");
    assert_eq!(metrics.upload_failures, store.failures(), "failed attempts");
    // Late attempts also write files (deleted again), which do not count as uploads.
    if speculative {
        assert!(metrics.uploaded_files <= written.len() as u64);
        counts.late = written.len() as u64 - metrics.uploaded_files;
    } else {
        assert_eq!(
            metrics.uploaded_files,
            written.len() as u64,
            "files written"
        );
    }
    assert_eq!(metrics.upload_queue_size, 0, "queued uploads");
    assert_eq!(metrics.bytes_in_flight, 0, "bytes in flight");
    for model in models {
        for (i, snap) in &model.confirmed {
            check_content(
                storage,
                model,
                *i,
                snap.from,
                snap.to,
                &snap.snapshot.remote,
                "remote",
                true,
            );
        }
    }
    // Local handles of confirmed snapshots whose copies must all still exist read back.
    for model in models {
        for (i, snap) in &model.confirmed {
            let Some(local) = &snap.snapshot.local else {
                continue;
            };
            let required: HashSet<String> = model
                .required_local(*i)
                .into_iter()
                .map(|r| r.path)
                .collect();
            if local
                .entries
                .iter()
                .all(|e| required.contains(&e.handle.path))
            {
                check_content(storage, model, *i, snap.from, snap.to, local, "local", true);
            }
        }
    }
    counts.local_left = dir_paths(&local_dir(storage)).len() as u64;
    counts
}
