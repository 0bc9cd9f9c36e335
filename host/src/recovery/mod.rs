//! Recovery and clean-up: reading snapshots back ([`reader`], with the [`cache`] of files
//! shared by many handles), the manifest JSON that names them ([`manifest`]), and
//! collecting files no manifest names ([`gc`]).

pub mod cache;
pub mod gc;
pub mod manifest;
pub mod reader;

use dstl_proto::codec::Change;
use dstl_proto::types::ChangelogHandle;

use self::cache::RecoveryCache;
use self::reader::ReadError;
use crate::config::Config;
use crate::store::FileSource;

/// Reads snapshots back after a failure: many handles (of one writer, or of every writer
/// of a job), which typically point into the same files. Each file is read and
/// decompressed once while it is in use (see [`cache`]); distinct files of a handle are
/// fetched in parallel.
pub struct Recovery {
    files: FileSource,
    cache: Option<RecoveryCache>,
}

impl Recovery {
    /// A reader with the object-store settings and cache settings of `config`
    /// (`dstl.dfs.download.local-cache.idle-timeout-ms`, `dstl.recovery.cache-size`; an
    /// idle timeout of 0 turns the cache off).
    pub fn new(config: &Config) -> Self {
        let cache = (!config.cache_idle_timeout.is_zero() && config.recovery_cache_size > 0)
            .then(|| RecoveryCache::new(config.cache_idle_timeout, config.recovery_cache_size));
        Self {
            files: FileSource::new(Some(config.s3())),
            cache,
        }
    }

    /// Every change of `handle`, in order.
    pub fn read(&self, handle: &ChangelogHandle) -> Result<Vec<Change>, ReadError> {
        reader::read_handle_cached(handle, &self.files, self.cache.as_ref())
    }

    /// Calls `visit` with every change of `handle`, in order, without allocating per
    /// change (see [`reader::visit_handle`]).
    pub fn visit(
        &self,
        handle: &ChangelogHandle,
        visit: &mut dyn FnMut(i32, &[u8]),
    ) -> Result<(), ReadError> {
        reader::visit_handle(handle, &self.files, self.cache.as_ref(), visit)
    }

    /// The cache, if on.
    pub fn cache(&self) -> Option<&RecoveryCache> {
        self.cache.as_ref()
    }
}
