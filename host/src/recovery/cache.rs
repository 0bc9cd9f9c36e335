//! The recovery cache: the logical bytes of files that several handles (of one writer,
//! or of many) point into, kept so that each file is read and decompressed once per
//! recovery rather than once per handle. An entry not used for the idle timeout
//! (`dstl.dfs.download.local-cache.idle-timeout-ms`) is dropped; so are the least recently
//! used ones when the cache holds more than its size (`dstl.recovery.cache-size`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sync::LockExt;

/// Logical bytes of whole files, by path.
pub struct RecoveryCache {
    idle_timeout: Duration,
    max_bytes: u64,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    files: HashMap<String, Entry>,
    bytes: u64,
    hits: u64,
    misses: u64,
}

struct Entry {
    logical: Arc<Vec<u8>>,
    last_used: Instant,
}

impl RecoveryCache {
    /// A cache that drops entries idle for `idle_timeout` and holds at most `max_bytes`.
    pub fn new(idle_timeout: Duration, max_bytes: u64) -> Self {
        Self {
            idle_timeout,
            max_bytes,
            entries: Mutex::default(),
        }
    }

    /// The logical bytes of `path`, loaded with `load` unless cached.
    pub fn get_or_load<E>(
        &self,
        path: &str,
        load: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Arc<Vec<u8>>, E> {
        let now = Instant::now();
        {
            let mut entries = self.entries.locked();
            self.expire(&mut entries, now);
            if let Some(entry) = entries.files.get_mut(path) {
                entry.last_used = now;
                let logical = entry.logical.clone();
                entries.hits += 1;
                return Ok(logical);
            }
            entries.misses += 1;
        }
        // Loaded without the lock: reads of other files go on meanwhile.
        let logical = Arc::new(load()?);
        let size = logical.len() as u64;
        if size <= self.max_bytes {
            let mut entries = self.entries.locked();
            let previous = entries.files.insert(
                path.to_string(),
                Entry {
                    logical: logical.clone(),
                    last_used: Instant::now(),
                },
            );
            entries.bytes += size;
            entries.bytes -= previous.map_or(0, |previous| previous.logical.len() as u64);
            self.shrink(&mut entries);
        }
        Ok(logical)
    }

    /// Reads served from the cache and reads that loaded a file.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        let entries = self.entries.locked();
        (entries.hits, entries.misses)
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.entries.locked().bytes
    }

    fn expire(&self, entries: &mut Entries, now: Instant) {
        let idle = self.idle_timeout;
        let mut freed = 0;
        entries.files.retain(|_, e| {
            let keep = now.duration_since(e.last_used) < idle;
            if !keep {
                freed += e.logical.len() as u64;
            }
            keep
        });
        entries.bytes -= freed;
    }

    fn shrink(&self, entries: &mut Entries) {
        while entries.bytes > self.max_bytes {
            let Some(oldest) = entries
                .files
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(path, _)| path.clone())
            else {
                return;
            };
            let entry = entries.files.remove(&oldest).expect("present");
            entries.bytes -= entry.logical.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(bytes: &[u8], calls: &std::cell::Cell<u32>) -> Result<Vec<u8>, ()> {
        calls.set(calls.get() + 1);
        Ok(bytes.to_vec())
    }

    #[test]
    fn a_file_is_loaded_once_while_in_use() {
        let cache = RecoveryCache::new(Duration::from_secs(60), 1 << 20);
        let calls = std::cell::Cell::new(0);
        for _ in 0..3 {
            let got = cache.get_or_load("a", || load(b"abc", &calls)).unwrap();
            assert_eq!(*got, b"abc");
        }
        assert_eq!(calls.get(), 1);
        assert_eq!(cache.hits_and_misses(), (2, 1));
        assert_eq!(cache.bytes(), 3);
    }

    #[test]
    fn idle_entries_expire() {
        let cache = RecoveryCache::new(Duration::ZERO, 1 << 20);
        let calls = std::cell::Cell::new(0);
        cache.get_or_load("a", || load(b"abc", &calls)).unwrap();
        cache.get_or_load("a", || load(b"abc", &calls)).unwrap();
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn the_least_recently_used_go_when_full() {
        let cache = RecoveryCache::new(Duration::from_secs(60), 5);
        let calls = std::cell::Cell::new(0);
        cache.get_or_load("a", || load(b"aaa", &calls)).unwrap();
        cache.get_or_load("b", || load(b"bbb", &calls)).unwrap();
        assert_eq!(cache.bytes(), 3, "a was dropped to make room for b");
        cache.get_or_load("b", || load(b"bbb", &calls)).unwrap();
        assert_eq!(calls.get(), 2);
        // Larger than the cache: served, not kept.
        cache.get_or_load("c", || load(b"cccccc", &calls)).unwrap();
        assert_eq!(cache.bytes(), 3);
    }
}
