//! Routing of deletions to the store that owns a path.

use std::sync::Arc;

use super::{LocalStore, Store};

/// The stores of one storage: uploads go to `remote`, local copies to `local`; paths
/// are routed to the store that owns them.
#[derive(Clone)]
pub(crate) struct Stores {
    pub remote: Arc<dyn Store>,
    pub local: Option<LocalStore>,
}

impl Stores {
    fn owner(&self, path: &str) -> &dyn Store {
        match &self.local {
            Some(local) if local.contains(path) => local,
            _ => &*self.remote,
        }
    }

    pub fn delete(&self, path: &str) -> std::io::Result<()> {
        self.owner(path).delete(path)
    }
}
