//! The manifest file of one snapshot (a contract other tools rely on: see README.md,
//! "Manifest"): read, and written atomically. Its JSON is dstl-proto's `manifest`.

use std::path::Path;

pub use dstl_proto::manifest::{Entry, LocalManifest, Manifest, ManifestParseError, Range};

/// Why a manifest cannot be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// [`ManifestFile::load`]: the file cannot be read (missing, no permission).
    #[error("cannot read manifest {}: {source}", path.display())]
    Read {
        /// The manifest.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// [`ManifestFile::load`]: the file is not manifest JSON (a field missing or of the
    /// wrong type, or not JSON at all).
    #[error("invalid manifest {}: {source}", path.display())]
    Parse {
        /// The manifest.
        path: std::path::PathBuf,
        /// What does not parse.
        #[source]
        source: ManifestParseError,
    },
}

/// Reading and writing a [`Manifest`] file (the JSON itself is dstl-proto's `manifest`).
pub trait ManifestFile: Sized {
    /// Reads a manifest file.
    fn load(path: &Path) -> Result<Self, ManifestError>;

    /// Writes the manifest to `path` atomically: a reader sees the old or the new one whole.
    fn store(&self, path: &Path) -> std::io::Result<()>;
}

impl ManifestFile for Manifest {
    fn load(path: &Path) -> Result<Self, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Manifest::parse(&text).map_err(|source| ManifestError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    fn store(&self, path: &Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(self.to_json().as_bytes())?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        crate::store::sync_parent(path)
    }
}
