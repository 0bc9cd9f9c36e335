//! Local copies, owned per writer and checkpoint: the rules are
//! `dstl_proto::ownership::LocalClaims`'; this shares them between threads and deletes
//! what nobody claims any more.

use std::sync::{Arc, Mutex};

use dstl_proto::ownership::{LocalClaims, Released};

use crate::sync::LockExt;

use super::{Discarder, WriterId};
use crate::store::Holder;

/// Local copies (Flink's `LocalChangelogRegistry`), owned per writer: one local file holds
/// change sets of every writer in its batch, so one writer's confirm or abort discards only
/// that writer's claims, and the file is deleted once no writer claims it.
///
/// A writer claims a local copy when its upload result is handed to it. The claim ends when
/// the writer releases every change set in it without a confirm (as the task registry does
/// for remote files), or when a discard reaches the checkpoint it was last registered under.
#[derive(Clone)]
pub struct LocalRegistry {
    claims: Arc<Mutex<LocalClaims>>,
    discarder: Discarder,
}

impl LocalRegistry {
    pub(crate) fn new(discarder: Discarder) -> Self {
        Self {
            claims: Arc::default(),
            discarder,
        }
    }

    /// `writer` was given `count` change sets in the local file `path`.
    pub(crate) fn hold(&self, writer: WriterId, path: &str, count: u64) {
        self.claims.locked().hold(writer, path, count);
    }

    /// `writer` no longer needs one change set in `path`.
    pub(crate) fn release(&self, writer: WriterId, path: &str) {
        let released = self.claims.locked().release(writer, path);
        self.apply(writer, path, released);
    }

    /// A checkpoint of `writer` holding `path` was confirmed: the claim now lasts until a
    /// discard.
    pub(crate) fn stop_tracking(&self, writer: WriterId, path: &str) {
        let released = self.claims.locked().stop_tracking(writer, path);
        self.apply(writer, path, released);
    }

    /// Marks `path` as used by `checkpoint` of `writer`, keeping the highest id.
    pub fn register(&self, writer: WriterId, path: &str, checkpoint: i64) {
        self.claims.locked().register(writer, path, checkpoint);
    }

    /// Ends every claim of `writer` last registered under a checkpoint below `checkpoint`
    /// and returns those paths (the writer must forget them); files that nobody claims any
    /// more are deleted.
    pub fn discard_up_to(&self, writer: WriterId, checkpoint: i64) -> Vec<String> {
        let discarded = self.claims.locked().discard_up_to(writer, checkpoint);
        for path in discarded.delete {
            self.discarder.discard(Holder::LocalCopy, path);
        }
        discarded.forgotten
    }

    /// The highest checkpoint any writer registered `path` under.
    #[cfg(feature = "test-util")]
    pub fn last_used(&self, path: &str) -> Option<i64> {
        self.claims.locked().last_used(path)
    }

    /// Whether `writer` claims `path`: false once its discard ended the claim.
    pub fn claims(&self, writer: WriterId, path: &str) -> bool {
        self.claims.locked().claims(writer, path)
    }

    /// Writers that claim `path`.
    #[cfg(feature = "test-util")]
    pub fn owners(&self, path: &str) -> Vec<WriterId> {
        self.claims.locked().owners(path)
    }

    fn apply(&self, writer: WriterId, path: &str, released: Released) {
        match released {
            Released::Kept => {}
            Released::Delete => self.discarder.discard(Holder::LocalCopy, path.to_string()),
            Released::Untracked => {
                tracing::debug!(%path, writer, "local copy not claimed by this writer")
            }
        }
    }
}
