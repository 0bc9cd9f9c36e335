//! Local copies, owned per writer and checkpoint.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Discarder, WriterId};

/// One writer's claim on a local copy.
#[derive(Debug, Default, Clone, Copy)]
struct Owner {
    /// Change sets in the file that the writer was given and has not released.
    refs: u64,
    /// A checkpoint of the writer was confirmed with the file: only a discard ends the claim.
    confirmed: bool,
    /// The highest checkpoint the writer registered the file under.
    last_checkpoint: Option<i64>,
}

/// Local copies (Flink's `LocalChangelogRegistry`), owned per writer: one local file holds
/// change sets of every writer in its batch, so one writer's confirm or abort discards only
/// that writer's claims, and the file is deleted once no writer claims it.
///
/// A writer claims a local copy when its upload result is handed to it. The claim ends when
/// the writer releases every change set in it without a confirm (as the task registry does
/// for remote files), or when a discard reaches the checkpoint it was last registered under.
#[derive(Clone)]
pub struct LocalRegistry {
    files: Arc<Mutex<HashMap<String, HashMap<WriterId, Owner>>>>,
    discarder: Discarder,
}

impl LocalRegistry {
    pub(crate) fn new(discarder: Discarder) -> Self {
        Self {
            files: Arc::default(),
            discarder,
        }
    }

    /// `writer` was given `count` change sets in the local file `path`.
    pub(crate) fn hold(&self, writer: WriterId, path: &str, count: u64) {
        let mut files = self.files.lock().unwrap();
        claim(&mut files, writer, path).refs += count;
    }

    /// `writer` no longer needs one change set in `path`.
    pub(crate) fn release(&self, writer: WriterId, path: &str) {
        self.update(path, writer, |owner| {
            owner.refs = owner.refs.saturating_sub(1);
            owner.refs > 0 || owner.confirmed
        });
    }

    /// A checkpoint of `writer` holding `path` was confirmed: the claim now lasts until a
    /// discard.
    pub(crate) fn stop_tracking(&self, writer: WriterId, path: &str) {
        self.update(path, writer, |owner| {
            owner.confirmed = true;
            true
        });
    }

    /// Marks `path` as used by `checkpoint` of `writer`, keeping the highest id.
    pub fn register(&self, writer: WriterId, path: &str, checkpoint: i64) {
        let mut files = self.files.lock().unwrap();
        let owner = claim(&mut files, writer, path);
        owner.last_checkpoint = Some(
            owner
                .last_checkpoint
                .map_or(checkpoint, |l| l.max(checkpoint)),
        );
    }

    /// Ends every claim of `writer` last registered under a checkpoint below `checkpoint`
    /// and returns those paths (the writer must forget them); files that nobody claims any
    /// more are deleted.
    pub fn discard_up_to(&self, writer: WriterId, checkpoint: i64) -> Vec<String> {
        let mut discarded = Vec::new();
        let mut unclaimed = Vec::new();
        let mut files = self.files.lock().unwrap();
        files.retain(|path, owners| {
            if owners
                .get(&writer)
                .is_some_and(|o| o.last_checkpoint.is_some_and(|last| last < checkpoint))
            {
                owners.remove(&writer);
                discarded.push(path.clone());
                if owners.is_empty() {
                    unclaimed.push(path.clone());
                    return false;
                }
            }
            true
        });
        drop(files);
        for path in unclaimed {
            self.discarder.discard(path);
        }
        discarded.sort();
        discarded
    }

    /// The highest checkpoint any writer registered `path` under.
    #[cfg(feature = "test-util")]
    pub fn last_used(&self, path: &str) -> Option<i64> {
        let files = self.files.lock().unwrap();
        files
            .get(path)?
            .values()
            .filter_map(|o| o.last_checkpoint)
            .max()
    }

    /// Whether `writer` claims `path`: false once its discard ended the claim.
    pub fn claims(&self, writer: WriterId, path: &str) -> bool {
        let files = self.files.lock().unwrap();
        files
            .get(path)
            .is_some_and(|owners| owners.contains_key(&writer))
    }

    /// Writers that claim `path`.
    #[cfg(feature = "test-util")]
    pub fn owners(&self, path: &str) -> Vec<WriterId> {
        let files = self.files.lock().unwrap();
        let mut owners: Vec<WriterId> = files
            .get(path)
            .map(|o| o.keys().copied().collect())
            .unwrap_or_default();
        owners.sort();
        owners
    }

    /// Applies `f` to `writer`'s claim on `path`; `false` ends the claim, and the file is
    /// deleted when it was the last.
    fn update(&self, path: &str, writer: WriterId, f: impl FnOnce(&mut Owner) -> bool) {
        let mut files = self.files.lock().unwrap();
        let Some(owners) = files.get_mut(path) else {
            tracing::debug!(%path, writer, "local copy no longer claimed");
            return;
        };
        let Some(owner) = owners.get_mut(&writer) else {
            tracing::debug!(%path, writer, "local copy not claimed by this writer");
            return;
        };
        if f(owner) {
            return;
        }
        owners.remove(&writer);
        if owners.is_empty() {
            files.remove(path);
            drop(files);
            self.discarder.discard(path.to_string());
        }
    }
}

/// `writer`'s claim on `path`, made if it has none.
fn claim<'a>(
    files: &'a mut HashMap<String, HashMap<WriterId, Owner>>,
    writer: WriterId,
    path: &str,
) -> &'a mut Owner {
    files
        .entry(path.to_string())
        .or_default()
        .entry(writer)
        .or_default()
}
