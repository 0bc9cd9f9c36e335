//! The stores of one storage, and which of them holds a file.

use std::sync::Arc;

use super::{LocalStore, Store};

/// Which of a storage's stores holds a file. It travels with the path from whoever
/// knows it (the task registry tracks uploads, the local registry local copies), so no
/// store is chosen by the shape of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// The store uploads go to.
    Remote,
    /// The directory of local copies.
    LocalCopy,
}

/// The stores of one storage: uploads go to `remote`, local copies to `local`.
#[derive(Clone)]
pub(crate) struct Stores {
    pub remote: Arc<dyn Store>,
    pub local: Option<LocalStore>,
}

impl Stores {
    /// Deletes `path` from the store that holds it.
    pub fn delete(&self, holder: Holder, path: &str) -> std::io::Result<()> {
        match (holder, &self.local) {
            (Holder::Remote, _) => self.remote.delete(path),
            (Holder::LocalCopy, Some(local)) => local.delete(path),
            (Holder::LocalCopy, None) => Err(std::io::Error::other(format!(
                "{path} is named as a local copy, but this storage keeps none"
            ))),
        }
    }
}
