//! Without the crate feature `s3`: the S3 store type exists, so configurations and
//! signatures stay the same, but it cannot be opened.

use std::convert::Infallible;

use super::{S3Error, S3Settings};
use crate::store::{Store, StoredFile};

/// One bucket of an S3-compatible service; this build has no client (crate feature
/// `s3`), so [`S3Store::open`] fails with [`S3Error::NotBuilt`].
pub struct S3Store {
    never: Infallible,
}

impl S3Store {
    /// Fails: this build has no S3 client.
    pub fn open(_: &S3Settings, _: &str, _: &str, _: &str) -> Result<Self, S3Error> {
        Err(S3Error::NotBuilt)
    }

    pub(crate) fn open_at(
        _: &S3Settings,
        _: &str,
        _: &str,
        _: Option<tokio::runtime::Handle>,
    ) -> Result<Self, S3Error> {
        Err(S3Error::NotBuilt)
    }

    /// See the `s3` feature's store.
    pub fn open_bucket(_: &S3Settings, _: &str) -> Result<Self, S3Error> {
        Err(S3Error::NotBuilt)
    }

    /// See the `s3` feature's store.
    pub fn stat(&self, _: &str) -> std::io::Result<Option<StoredFile>> {
        match self.never {}
    }

    /// See the `s3` feature's store.
    pub fn list_under(&self, _: &str) -> std::io::Result<Vec<StoredFile>> {
        match self.never {}
    }

    /// See the `s3` feature's store.
    pub fn put(&self, _: &str, _: &[u8], _: bool) -> std::io::Result<()> {
        match self.never {}
    }

    pub(crate) fn overwrite_within(
        &self,
        _: &str,
        _: &[u8],
        _: std::time::Duration,
    ) -> std::io::Result<()> {
        match self.never {}
    }

    pub(crate) fn delete_within(
        &self,
        _: &str,
        _: Option<std::time::Duration>,
    ) -> std::io::Result<()> {
        match self.never {}
    }

    pub(crate) fn read_within(
        &self,
        _: &str,
        _: Option<std::time::Duration>,
    ) -> std::io::Result<Vec<u8>> {
        match self.never {}
    }

    pub(crate) fn list_within(
        &self,
        _: Option<std::time::Duration>,
    ) -> std::io::Result<Vec<StoredFile>> {
        match self.never {}
    }
}

impl Store for S3Store {
    fn create(&self, _: &str, _: &[u8]) -> std::io::Result<String> {
        match self.never {}
    }
    fn delete(&self, _: &str) -> std::io::Result<()> {
        match self.never {}
    }
    fn read(&self, _: &str) -> std::io::Result<Vec<u8>> {
        match self.never {}
    }
    fn list(&self) -> std::io::Result<Vec<StoredFile>> {
        match self.never {}
    }
    fn describe(&self) -> String {
        match self.never {}
    }
}
