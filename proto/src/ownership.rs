//! Who owns which file, as plain data structures with no I/O: the rules that decide when
//! a file may be deleted, in one place for every host. A host keeps them behind its own
//! lock and deletes what they hand back.
//!
//! - [`TaskRefs`] (Flink's `TaskChangelogRegistry`): an uploaded file starts with one
//!   reference per change set in it, across every writer of its batch; a release drops
//!   one, and at zero the file is to be deleted. A confirmed checkpoint takes the file
//!   over (`stop_tracking`): from then on it is never deleted here.
//! - [`LocalClaims`] (Flink's `LocalChangelogRegistry`, owned per writer as in dstl, F14):
//!   one local copy holds change sets of every writer in its batch; each writer claims it
//!   while it holds change sets of it, or until a discard (confirm or abort) reaches the
//!   checkpoint it was last registered under once confirmed; the file is to be deleted
//!   when no writer claims it.
//!
//! - [`Holdings`]: what a host delivered to one writer's guest, which is all the guest may
//!   release, stop tracking, register or name in a snapshot it returns; and which
//!   references to release when its sandbox goes away (those no returned snapshot names).
//!
//! The kinds of methods: inputs (`start_tracking`, `hold`, `release`, `stop_tracking`,
//! `register`, `discard_up_to`), whose return values are the outputs (the files to
//! delete), and queries (`count`, `claims`, `owners`, ...). Nothing here deletes, logs or
//! locks.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::types::{SnapshotResult, StreamHandle, UploadResult};

/// Identifies one writer (ownership of local copies is per writer).
pub type WriterId = u64;

/// What a change in ownership means for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// Still owned.
    Kept,
    /// Nobody owns it any more: delete it.
    Delete,
    /// The file was not tracked (confirmed, or released already): nothing to do.
    Untracked,
}

/// Reference counts of uploaded files that no confirmed checkpoint owns yet.
#[derive(Debug, Default, Clone)]
pub struct TaskRefs {
    counts: HashMap<String, u64>,
}

/// What [`TaskRefs::start_tracking`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracking {
    /// The file is tracked with its count.
    Started,
    /// The file was tracked already; its count was replaced (a bug of the caller).
    Replaced,
    /// A file no change set uses is nobody's: delete it (a bug of the caller, never a
    /// panic).
    Empty,
}

impl TaskRefs {
    /// Input: a new file `path` holds `count` change sets.
    pub fn start_tracking(&mut self, path: &str, count: u64) -> Tracking {
        if count == 0 {
            return Tracking::Empty;
        }
        match self.counts.insert(path.to_string(), count) {
            Some(_) => Tracking::Replaced,
            None => Tracking::Started,
        }
    }

    /// Input: a confirmed checkpoint owns `path` now; it is never deleted here.
    pub fn stop_tracking(&mut self, path: &str) {
        self.counts.remove(path);
    }

    /// Input: one change set no longer needs `path`.
    pub fn release(&mut self, path: &str) -> Released {
        let Some(count) = self.counts.get_mut(path) else {
            return Released::Untracked;
        };
        *count = count.saturating_sub(1);
        if *count > 0 {
            return Released::Kept;
        }
        self.counts.remove(path);
        Released::Delete
    }

    /// Query: the count of a tracked file, `None` if untracked.
    pub fn count(&self, path: &str) -> Option<u64> {
        self.counts.get(path).copied()
    }

    /// Query: files tracked.
    pub fn tracked(&self) -> usize {
        self.counts.len()
    }
}

/// One writer's claim on a local copy.
#[derive(Debug, Default, Clone, Copy)]
struct Claim {
    /// Change sets in the file the writer was given and has not released.
    refs: u64,
    /// A checkpoint of the writer was confirmed with the file: only a discard ends the claim.
    confirmed: bool,
    /// The highest checkpoint the writer registered the file under.
    last_checkpoint: Option<i64>,
}

/// Local copies, claimed per writer.
#[derive(Debug, Default, Clone)]
pub struct LocalClaims {
    files: HashMap<String, HashMap<WriterId, Claim>>,
}

/// What [`LocalClaims::discard_up_to`] ended.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Discarded {
    /// Every file whose claim of the writer ended (sorted): the writer must forget them.
    pub forgotten: Vec<String>,
    /// Those that nobody claims any more: delete them.
    pub delete: Vec<String>,
}

impl LocalClaims {
    /// Input: `writer` was given `count` change sets in the local file `path`.
    pub fn hold(&mut self, writer: WriterId, path: &str, count: u64) {
        self.claim(writer, path).refs += count;
    }

    /// Input: `writer` no longer needs one change set in `path`.
    pub fn release(&mut self, writer: WriterId, path: &str) -> Released {
        self.update(path, writer, |claim| {
            claim.refs = claim.refs.saturating_sub(1);
            claim.refs > 0 || claim.confirmed
        })
    }

    /// Input: a checkpoint of `writer` holding `path` was confirmed: the claim lasts until
    /// a discard.
    pub fn stop_tracking(&mut self, writer: WriterId, path: &str) -> Released {
        self.update(path, writer, |claim| {
            claim.confirmed = true;
            true
        })
    }

    /// Input: `path` is used by `checkpoint` of `writer` (the highest one counts).
    pub fn register(&mut self, writer: WriterId, path: &str, checkpoint: i64) {
        let claim = self.claim(writer, path);
        claim.last_checkpoint = Some(
            claim
                .last_checkpoint
                .map_or(checkpoint, |l| l.max(checkpoint)),
        );
    }

    /// Input: ends every claim of `writer` last registered under a checkpoint below
    /// `checkpoint`.
    pub fn discard_up_to(&mut self, writer: WriterId, checkpoint: i64) -> Discarded {
        let mut out = Discarded::default();
        self.files.retain(|path, claims| {
            if claims
                .get(&writer)
                .is_some_and(|c| c.last_checkpoint.is_some_and(|last| last < checkpoint))
            {
                claims.remove(&writer);
                out.forgotten.push(path.clone());
                if claims.is_empty() {
                    out.delete.push(path.clone());
                    return false;
                }
            }
            true
        });
        out.forgotten.sort();
        out.delete.sort();
        out
    }

    /// Query: whether `writer` claims `path`.
    pub fn claims(&self, writer: WriterId, path: &str) -> bool {
        self.files
            .get(path)
            .is_some_and(|claims| claims.contains_key(&writer))
    }

    /// Query: the writers that claim `path`, sorted.
    pub fn owners(&self, path: &str) -> Vec<WriterId> {
        let mut owners: Vec<WriterId> = self
            .files
            .get(path)
            .map(|c| c.keys().copied().collect())
            .unwrap_or_default();
        owners.sort();
        owners
    }

    /// Query: the highest checkpoint any writer registered `path` under.
    pub fn last_used(&self, path: &str) -> Option<i64> {
        self.files
            .get(path)?
            .values()
            .filter_map(|c| c.last_checkpoint)
            .max()
    }

    fn claim(&mut self, writer: WriterId, path: &str) -> &mut Claim {
        self.files
            .entry(path.to_string())
            .or_default()
            .entry(writer)
            .or_default()
    }

    /// Applies `f` to `writer`'s claim on `path`; `false` ends the claim.
    fn update(
        &mut self,
        path: &str,
        writer: WriterId,
        f: impl FnOnce(&mut Claim) -> bool,
    ) -> Released {
        let Some(claims) = self.files.get_mut(path) else {
            return Released::Untracked;
        };
        let Some(claim) = claims.get_mut(&writer) else {
            return Released::Untracked;
        };
        if f(claim) {
            return Released::Kept;
        }
        claims.remove(&writer);
        if !claims.is_empty() {
            return Released::Kept;
        }
        self.files.remove(path);
        Released::Delete
    }
}

// ---------------------------------------------------------------------------------------
// What one writer's guest holds: the host does not trust the guest (ARCHITECTURE.md, "File
// ownership").

/// A guest call a host refuses: the guest named a file it does not hold, or returned a
/// snapshot naming change sets never delivered to it. The host traps the writer, since a
/// guest that does this is buggy or hostile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("guest fault: {0}")]
pub struct GuestFault(pub String);

/// One file the guest holds references to.
#[derive(Debug)]
pub struct Holding {
    /// Change sets in the file delivered to the guest and not released by it.
    pub refs: u64,
    /// A local copy (owned in the local registry) rather than a store file.
    pub local: bool,
    /// A snapshot naming the file was returned to the caller: a checkpoint may use it.
    handed_out: bool,
}

/// What the host delivered to the guest of one file: all a snapshot it returns may name.
#[derive(Debug)]
struct Delivered {
    /// The file's logical size, as delivered.
    file_size: u64,
    /// `(offset, size)` of every change set in the file delivered to the guest.
    change_sets: HashSet<(u64, u64)>,
}

/// How many files the guest released are still remembered as delivered. A snapshot may
/// name change sets the guest has released already (a persist that started before a
/// truncate, for instance); pending persists are few, so the most recent files suffice,
/// and the record stays bounded for a writer that lives for weeks.
const RELEASED_KEPT: usize = 1024;

/// The files the guest holds references to, as the host delivered them. The guest may
/// release, stop tracking or register only these; when its sandbox goes away, the host
/// releases those no returned snapshot names.
#[derive(Default)]
pub struct Holdings {
    held: HashMap<String, Holding>,
    /// Every held file, and the last [`RELEASED_KEPT`] released ones.
    delivered: HashMap<String, Delivered>,
    /// Released files in the order they were released (a file held again may be listed).
    released: VecDeque<String>,
}

impl Holdings {
    /// The guest was given `results`.
    pub fn add(&mut self, results: &[UploadResult]) {
        for result in results {
            self.add_one(&result.remote, false, result.offset, result.size);
            if let Some(local) = &result.local {
                self.add_one(&local.handle, true, local.offset, result.size);
            }
        }
    }

    fn add_one(&mut self, file: &StreamHandle, local: bool, offset: u64, size: u64) {
        self.held
            .entry(file.path.clone())
            .or_insert(Holding {
                refs: 0,
                local,
                handed_out: false,
            })
            .refs += 1;
        self.delivered
            .entry(file.path.clone())
            .or_insert_with(|| Delivered {
                file_size: file.file_size,
                change_sets: HashSet::new(),
            })
            .change_sets
            .insert((offset, size));
    }

    /// Whether `path` is a held local copy; a fault if the guest does not hold it.
    pub fn check(&self, path: &str, operation: &str) -> Result<bool, GuestFault> {
        match self.held.get(path) {
            Some(holding) if holding.refs > 0 => Ok(holding.local),
            _ => Err(GuestFault(format!(
                "{operation} of {path}, a file this writer does not hold"
            ))),
        }
    }

    /// Drops one reference; whether the file is a local copy.
    pub fn release(&mut self, path: &str) -> Result<bool, GuestFault> {
        let local = self.check(path, "release")?;
        let holding = self.held.get_mut(path).expect("checked");
        holding.refs -= 1;
        if holding.refs == 0 {
            self.held.remove(path);
            self.remember_released(path);
        }
        Ok(local)
    }

    /// Keeps what was delivered of `path`, no longer held, among the last released files.
    fn remember_released(&mut self, path: &str) {
        self.released.push_back(path.to_string());
        while self.released.len() > RELEASED_KEPT {
            let oldest = self.released.pop_front().expect("longer than the bound");
            if !self.held.contains_key(&oldest) && !self.released.contains(&oldest) {
                self.delivered.remove(&oldest);
            }
        }
    }

    /// Checks a snapshot the guest returns for the caller and marks its files. Every
    /// entry must be a change set the host delivered to this writer: a guest that names
    /// another writer's change sets or a local path of its choosing would have recovery
    /// read what it has no claim to.
    pub fn hand_out(&mut self, snapshot: &SnapshotResult) -> Result<(), GuestFault> {
        let entries = || {
            let local = snapshot.local.iter().flat_map(|l| &l.entries);
            snapshot.remote.entries.iter().chain(local)
        };
        for entry in entries() {
            let path = &entry.handle.path;
            let Some(delivered) = self.delivered.get(path) else {
                return Err(GuestFault(format!(
                    "a returned snapshot names {path}, a file never delivered to this writer"
                )));
            };
            if entry.handle.file_size != delivered.file_size
                || !delivered.change_sets.contains(&(entry.offset, entry.size))
            {
                return Err(GuestFault(format!(
                    "a returned snapshot names a change set of {path} at offset {} of {} bytes \
                     (file size {}) that was never delivered to this writer",
                    entry.offset, entry.size, entry.handle.file_size
                )));
            }
        }
        for entry in entries() {
            if let Some(holding) = self.held.get_mut(&entry.handle.path) {
                holding.handed_out = true;
            }
        }
        Ok(())
    }

    /// Local copies the local registry discarded for this writer: the guest forgets them.
    pub fn forget(&mut self, paths: &[String]) {
        for path in paths {
            if self.held.remove(path).is_some() {
                self.remember_released(path);
            }
        }
    }

    /// Takes the references no returned snapshot covers, to release them. The others stay
    /// held: a checkpoint the coordinator knows about may still need those files.
    pub fn take_unreturned(&mut self) -> Vec<(String, Holding)> {
        let mut unreturned = Vec::new();
        self.held.retain(|path, holding| {
            if !holding.handed_out {
                unreturned.push((
                    path.clone(),
                    Holding {
                        refs: std::mem::take(&mut holding.refs),
                        local: holding.local,
                        handed_out: false,
                    },
                ));
            }
            holding.handed_out
        });
        unreturned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_goes_when_its_last_change_set_is_released() {
        let mut refs = TaskRefs::default();
        assert_eq!(refs.start_tracking("f", 2), Tracking::Started);
        assert_eq!(refs.release("f"), Released::Kept);
        assert_eq!(refs.count("f"), Some(1));
        assert_eq!(refs.release("f"), Released::Delete);
        assert_eq!(refs.release("f"), Released::Untracked);
        assert_eq!(refs.tracked(), 0);
    }

    #[test]
    fn a_confirmed_file_is_never_deleted_here() {
        let mut refs = TaskRefs::default();
        refs.start_tracking("f", 1);
        refs.stop_tracking("f");
        assert_eq!(refs.release("f"), Released::Untracked);
    }

    #[test]
    fn an_empty_file_is_deleted_and_a_second_start_reported() {
        let mut refs = TaskRefs::default();
        assert_eq!(refs.start_tracking("e", 0), Tracking::Empty);
        assert_eq!(refs.tracked(), 0);
        refs.start_tracking("f", 1);
        assert_eq!(refs.start_tracking("f", 3), Tracking::Replaced);
        assert_eq!(refs.count("f"), Some(3));
    }

    #[test]
    fn a_shared_local_copy_goes_when_no_writer_claims_it() {
        let mut local = LocalClaims::default();
        local.hold(1, "l", 1);
        local.hold(2, "l", 2);
        assert_eq!(local.owners("l"), [1, 2]);
        assert_eq!(local.release(1, "l"), Released::Kept);
        assert!(!local.claims(1, "l"));
        assert_eq!(local.release(2, "l"), Released::Kept);
        assert_eq!(local.release(2, "l"), Released::Delete);
        assert!(local.owners("l").is_empty());
    }

    #[test]
    fn one_writers_discard_never_deletes_a_copy_another_claims() {
        let mut local = LocalClaims::default();
        local.hold(1, "l", 1);
        local.hold(2, "l", 1);
        local.stop_tracking(1, "l");
        local.register(1, "l", 5);
        local.register(2, "l", 7);
        assert_eq!(local.last_used("l"), Some(7));
        // Writer 1 confirmed checkpoint 6: its claim (last used by 5) ends...
        assert_eq!(
            local.discard_up_to(1, 6),
            Discarded {
                forgotten: vec!["l".into()],
                delete: vec![]
            }
        );
        // ... writer 2's stays until its own discard reaches 7.
        assert_eq!(local.discard_up_to(2, 7), Discarded::default());
        assert_eq!(
            local.discard_up_to(2, 8),
            Discarded {
                forgotten: vec!["l".into()],
                delete: vec!["l".into()]
            }
        );
    }

    #[test]
    fn a_confirmed_claim_survives_releases_until_a_discard() {
        let mut local = LocalClaims::default();
        local.hold(1, "l", 1);
        local.stop_tracking(1, "l");
        assert_eq!(local.release(1, "l"), Released::Kept);
        assert!(local.claims(1, "l"));
        local.register(1, "l", 3);
        assert_eq!(local.discard_up_to(1, 4).delete, vec!["l".to_string()]);
    }

    fn result(path: &str, offset: u64, local: Option<&str>) -> UploadResult {
        UploadResult {
            sequence_number: 0,
            remote: StreamHandle {
                path: path.into(),
                file_size: 100,
            },
            offset,
            local: local.map(|l| crate::types::LocalCopy {
                handle: StreamHandle {
                    path: l.into(),
                    file_size: 100,
                },
                offset,
            }),
            size: 10,
        }
    }

    fn snapshot(path: &str, offset: u64) -> SnapshotResult {
        SnapshotResult {
            remote: crate::types::ChangelogHandle {
                key_group_range: crate::types::KeyGroupRange { start: 0, end: 1 },
                entries: vec![crate::types::HandleEntry {
                    handle: StreamHandle {
                        path: path.into(),
                        file_size: 100,
                    },
                    offset,
                    size: 10,
                }],
                state_size: 10,
                incremental_size: 10,
                storage_id: crate::types::STORAGE_ID.into(),
            },
            local: None,
        }
    }

    #[test]
    fn a_guest_may_release_only_what_it_was_given() {
        let mut holdings = Holdings::default();
        holdings.add(&[result("f", 0, Some("l")), result("f", 10, None)]);
        assert_eq!(holdings.check("l", "register"), Ok(true));
        assert_eq!(holdings.release("f"), Ok(false));
        assert_eq!(holdings.release("f"), Ok(false));
        assert!(
            holdings
                .release("f")
                .unwrap_err()
                .0
                .contains("does not hold")
        );
        assert!(holdings.check("g", "stop-tracking").is_err());
    }

    #[test]
    fn a_returned_snapshot_may_name_only_delivered_change_sets_and_keeps_their_files() {
        let mut holdings = Holdings::default();
        holdings.add(&[result("f", 0, None), result("h", 0, None)]);
        assert!(
            holdings.hand_out(&snapshot("f", 50)).is_err(),
            "never delivered"
        );
        assert!(holdings.hand_out(&snapshot("other", 0)).is_err());
        holdings.hand_out(&snapshot("f", 0)).unwrap();
        let unreturned: Vec<String> = holdings
            .take_unreturned()
            .into_iter()
            .map(|(path, _)| path)
            .collect();
        assert_eq!(unreturned, ["h"], "the handed-out file stays held");
        assert_eq!(holdings.check("f", "release"), Ok(false));
    }
}
