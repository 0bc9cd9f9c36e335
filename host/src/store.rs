//! Where changelog files live. This store is a local directory; every file
//! becomes visible only whole (written under a temporary name, fsync'd, then linked into
//! place without overwriting) and its directory entry is fsync'd before the write counts.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where uploads put files. Implementations must make a file visible only whole, never
/// overwrite one, and leave nothing behind when `create` fails.
pub trait Store: Send + Sync + 'static {
    /// Creates a new file `name` holding `bytes`; returns the path (or URL) that handles
    /// will name it by.
    fn create(&self, name: &str, bytes: &[u8]) -> std::io::Result<String>;
    /// Deletes a file this store created; a missing file counts as deleted.
    fn delete(&self, path: &str) -> std::io::Result<()>;
    /// Where the files go, for messages.
    fn describe(&self) -> String;
}

impl Store for LocalStore {
    fn create(&self, name: &str, bytes: &[u8]) -> std::io::Result<String> {
        LocalStore::create(self, name, bytes)
    }

    fn delete(&self, path: &str) -> std::io::Result<()> {
        delete(path)
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
}

/// A directory of changelog files.
#[derive(Debug, Clone)]
pub struct LocalStore {
    dir: PathBuf,
}

impl LocalStore {
    /// A store writing into `dir`, created if missing. The path is made absolute so
    /// handles name files independently of the working directory.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        fs::create_dir_all(dir)?;
        let dir = fs::canonicalize(dir)?;
        Ok(Self { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates `name` with `bytes`, atomically and durably; fails if it exists.
    /// A failed write leaves nothing behind.
    pub fn create(&self, name: &str, bytes: &[u8]) -> std::io::Result<String> {
        let target = self.dir.join(name);
        let staging = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let mut linked = false;
        let result = (|| {
            let mut file = File::create_new(&staging)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            drop(file);
            // A hard link creates the name only if it is free, so a file is never
            // overwritten, and it appears with all its bytes at once.
            fs::hard_link(&staging, &target)?;
            linked = true;
            File::open(&self.dir)?.sync_all()
        })();
        let _ = fs::remove_file(&staging);
        if result.is_err() && linked {
            // The link was made but the directory sync failed: do not leave a file that
            // the caller will believe was never written.
            let _ = fs::remove_file(&target);
        }
        result.map(|()| target.to_string_lossy().into_owned())
    }
}

/// Reads a whole file.
pub fn read(path: &str) -> std::io::Result<Vec<u8>> {
    fs::read(path)
}

/// Deletes a file; a missing file counts as deleted.
pub fn delete(path: &str) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_is_whole_and_never_overwrites() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalStore::open(&tmp.path().join("a/b")).unwrap();
        let path = PathBuf::from(store.create("f", b"hello").unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"hello");
        assert!(LocalStore::create(&store, "f", b"other").is_err());
        assert_eq!(fs::read(&path).unwrap(), b"hello");
        let names: Vec<_> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["f"]);
        delete(path.to_str().unwrap()).unwrap();
        delete(path.to_str().unwrap()).unwrap();
    }
}
