//! The S3 client, through the `object_store` crate (crate feature `s3`).
//!
//! Files are created with a conditional put (`If-None-Match: *`), so a file is never
//! overwritten and appears whole. A conditional put whose response was lost is retried by
//! the client and then reports "already exists" for our own write: that case is checked
//! by reading the object back and comparing, instead of failing the upload.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{
    ClientOptions, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};

use super::{S3Error, S3Settings, is_loopback_http};
use crate::store::{Store, StoredFile};

/// One bucket (and key prefix) of an S3-compatible service.
pub struct S3Store {
    client: Arc<AmazonS3>,
    bucket: String,
    /// Key prefix of this store's files, without trailing `/`.
    prefix: String,
    runtime: ClientRuntime,
}

/// Where the client's requests run: a runtime of the store's own (`dstl-s3`), the
/// caller's (a storage opened on the caller's runtime), or a runtime without threads that
/// each request drives on the calling thread (a file system over a bucket, which lives as
/// long as its process and must keep no threads of its own).
enum ClientRuntime {
    Own(Option<tokio::runtime::Runtime>),
    Caller(tokio::runtime::Handle),
    OnCaller(tokio::runtime::Runtime),
}

impl S3Store {
    /// A store writing to `s3://bucket/<prefix>/<job_id>/dstl/`, with a runtime of its
    /// own for the client. Checks the credentials first and probes the bucket with one
    /// request, so missing or refused credentials and an unreachable endpoint are
    /// reported here rather than by the first upload.
    pub fn open(
        settings: &S3Settings,
        bucket: &str,
        prefix: &str,
        job_id: &str,
    ) -> Result<Self, S3Error> {
        Self::open_at(
            settings,
            bucket,
            &super::job_key_prefix(prefix, job_id),
            None,
        )
    }

    /// The whole bucket as a store, for a file system over it (the Flink plugin's
    /// `dstl-s3://` file system): paths are `s3://bucket/<key>` for any key. Checks the
    /// credentials and probes the bucket as [`S3Store::open`] does.
    /// Its requests run on the calling thread: the store starts no thread.
    pub fn open_bucket(settings: &S3Settings, bucket: &str) -> Result<Self, S3Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(S3Error::Runtime)?;
        Self::open_with(settings, bucket, "", ClientRuntime::OnCaller(runtime))
    }

    /// The object at `path` (`s3://bucket/<key>` of this store), or `None` if there is
    /// none.
    pub fn stat(&self, path: &str) -> std::io::Result<Option<StoredFile>> {
        let key = self.key(path)?;
        match self.block(self.client.head(&key)) {
            Ok(meta) => Ok(Some(stored_file(path.to_string(), &meta))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(io_error(format!("cannot look up {path}"), e)),
        }
    }

    /// The objects whose keys start with `path`'s key followed by `/` (what a directory
    /// holds, at any depth), sorted by path.
    pub fn list_under(&self, path: &str) -> std::io::Result<Vec<StoredFile>> {
        let prefix = match path.strip_prefix(&format!("s3://{}", self.bucket)) {
            Some("") | Some("/") => Key::from(""),
            Some(_) => self.key(path)?,
            None => return Err(self.key(path).unwrap_err()),
        };
        self.block(self.list_prefix(prefix, format!("cannot list {path}")))
    }

    /// The objects under `prefix`, sorted by path; `what` names a failure.
    async fn list_prefix(&self, prefix: Key, what: String) -> std::io::Result<Vec<StoredFile>> {
        let metas: Vec<_> = self
            .client
            .list(Some(&prefix))
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| io_error(what, e))?;
        let mut files: Vec<StoredFile> = metas
            .iter()
            .map(|m| stored_file(self.url(&m.location), m))
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// Writes `bytes` as the object at `path`, whole: replacing what is there with
    /// `overwrite`, else failing with `AlreadyExists` if the object exists.
    pub fn put(&self, path: &str, bytes: &[u8], overwrite: bool) -> std::io::Result<()> {
        let mode = if overwrite {
            PutMode::Overwrite
        } else {
            PutMode::Create
        };
        self.write(path, bytes, mode, None)
    }

    /// A store writing to `s3://bucket/<key_prefix>/` (no leading or trailing `/`); its
    /// requests run on `runtime` (a multi-threaded runtime with I/O and time enabled),
    /// or on a runtime of its own when `None`.
    pub(crate) fn open_at(
        settings: &S3Settings,
        bucket: &str,
        key_prefix: &str,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<Self, S3Error> {
        let runtime = match runtime {
            Some(handle) => ClientRuntime::Caller(handle),
            None => ClientRuntime::Own(Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("dstl-s3")
                    .enable_all()
                    .build()
                    .map_err(S3Error::Runtime)?,
            )),
        };
        Self::open_with(settings, bucket, key_prefix, runtime)
    }

    fn open_with(
        settings: &S3Settings,
        bucket: &str,
        key_prefix: &str,
        runtime: ClientRuntime,
    ) -> Result<Self, S3Error> {
        let settings = settings.resolved();
        settings.check_credentials(bucket)?;
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(settings.region.as_deref().unwrap_or("us-east-1"))
            .with_virtual_hosted_style_request(false)
            .with_retry(RetryConfig {
                max_retries: 3,
                retry_timeout: Duration::from_secs(20),
                ..RetryConfig::default()
            });
        let mut options = ClientOptions::new()
            .with_timeout(settings.request_timeout.unwrap_or(Duration::from_secs(30)))
            .with_connect_timeout(Duration::from_secs(5));
        if let Some(endpoint) = &settings.endpoint {
            builder = builder.with_endpoint(endpoint);
            // Plain http only where it cannot leak: loopback, or when asked for.
            if settings
                .allow_http
                .unwrap_or_else(|| is_loopback_http(endpoint))
            {
                options = options.with_allow_http(true);
            }
        }
        builder = builder.with_client_options(options);
        if let (Some(id), Some(secret)) = (&settings.access_key_id, &settings.secret_access_key) {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        let client = builder.build().map_err(|source| S3Error::Settings {
            bucket: bucket.to_string(),
            source: Box::new(source),
        })?;
        let store = Self {
            client: Arc::new(client),
            bucket: bucket.to_string(),
            prefix: key_prefix.to_string(),
            runtime,
        };
        store.probe(&settings)?;
        Ok(store)
    }

    /// One cheap authenticated request (the metadata of a key that need not exist):
    /// credentials the service refuses, a missing bucket or a dead endpoint fail here.
    /// Bounded by the request timeout, at most 10 s, whatever the client's retries.
    fn probe(&self, settings: &S3Settings) -> Result<(), S3Error> {
        let endpoint = settings
            .endpoint
            .clone()
            .unwrap_or_else(|| "AWS S3".to_string());
        let key = Key::from(super::join_key(&[&self.prefix, ".dstl-probe"]));
        let limit = settings
            .request_timeout
            .unwrap_or(Duration::from_secs(10))
            .min(Duration::from_secs(10));
        let outcome =
            self.block(async { tokio::time::timeout(limit, self.client.head(&key)).await });
        let unreachable = |source: Box<dyn std::error::Error + Send + Sync>| S3Error::Unreachable {
            bucket: self.bucket.clone(),
            endpoint: endpoint.clone(),
            source,
        };
        match outcome {
            Ok(Ok(_)) | Ok(Err(object_store::Error::NotFound { .. })) => Ok(()),
            Ok(Err(
                e @ (object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }),
            )) => Err(S3Error::Refused {
                bucket: self.bucket.clone(),
                endpoint,
                source: Box::new(e),
            }),
            Ok(Err(e)) => Err(unreachable(Box::new(e))),
            Err(_) => Err(unreachable(
                format!("no answer within {} ms", limit.as_millis()).into(),
            )),
        }
    }

    /// Runs a request to completion from synchronous code (never from a runtime worker:
    /// then on a scoped thread).
    fn block<F: Future + Send>(&self, future: F) -> F::Output
    where
        F::Output: Send,
    {
        let run = || match &self.runtime {
            ClientRuntime::Own(runtime) => runtime
                .as_ref()
                .expect("runtime lives as long as the store")
                .handle()
                .block_on(future),
            ClientRuntime::Caller(handle) => handle.block_on(future),
            // Only the runtime's own `block_on` drives its I/O on the calling thread.
            ClientRuntime::OnCaller(runtime) => runtime.block_on(future),
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| s.spawn(run).join().expect("S3 request panicked"))
        } else {
            run()
        }
    }

    /// Runs a request, with a time limit if there is one: `what` and the limit name the
    /// failure when none came back in time.
    fn block_within<F: Future + Send>(
        &self,
        limit: Option<Duration>,
        what: impl FnOnce() -> String,
        future: F,
    ) -> std::io::Result<F::Output>
    where
        F::Output: Send,
    {
        let Some(limit) = limit else {
            return Ok(self.block(future));
        };
        self.block(async { tokio::time::timeout(limit, future).await })
            .map_err(|_| timed_out(what(), limit))
    }

    /// Writes `bytes` as the object at `path` in `mode`, giving up after `limit` if
    /// there is one.
    fn write(
        &self,
        path: &str,
        bytes: &[u8],
        mode: PutMode,
        limit: Option<Duration>,
    ) -> std::io::Result<()> {
        let key = self.key(path)?;
        let payload = PutPayload::from(bytes.to_vec());
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let what = || format!("cannot write {path}");
        self.block_within(limit, what, self.client.put_opts(&key, payload, options))?
            .map(|_| ())
            .map_err(|e| io_error(what(), e))
    }

    /// Replaces the content of `path`, a file of this store, with `bytes` (or creates
    /// it), giving up after `limit`: for small records that change, never for changelog
    /// files.
    pub(crate) fn overwrite_within(
        &self,
        path: &str,
        bytes: &[u8],
        limit: Duration,
    ) -> std::io::Result<()> {
        self.write(path, bytes, PutMode::Overwrite, Some(limit))
    }

    /// Deletes `path`, a file of this store, giving up after `limit` if there is one (a
    /// missing file is no error).
    pub(crate) fn delete_within(&self, path: &str, limit: Option<Duration>) -> std::io::Result<()> {
        let key = self.key(path)?;
        let what = || format!("cannot delete {path}");
        match self.block_within(limit, what, self.client.delete(&key))? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_error(what(), e)),
        }
    }

    /// Reads `path`, a file of this store, giving up after `limit` if there is one.
    pub(crate) fn read_within(
        &self,
        path: &str,
        limit: Option<Duration>,
    ) -> std::io::Result<Vec<u8>> {
        let key = self.key(path)?;
        let what = || format!("cannot read {path}");
        let read = async {
            let result = self.client.get(&key).await?;
            result.bytes().await
        };
        self.block_within(limit, what, read)?
            .map(|b| b.to_vec())
            .map_err(|e| io_error(what(), e))
    }

    /// Lists this store's files ([`Store::list`]), giving up after `limit` if there is
    /// one.
    pub(crate) fn list_within(&self, limit: Option<Duration>) -> std::io::Result<Vec<StoredFile>> {
        let prefix = Key::from(self.prefix.as_str());
        let what = || format!("cannot list {}", self.describe());
        self.block_within(limit, what, self.list_prefix(prefix, what()))?
    }

    fn url(&self, key: &Key) -> String {
        format!("s3://{}/{}", self.bucket, key)
    }

    /// The key of `path`, which must be a URL into this store's bucket (and prefix).
    fn key(&self, path: &str) -> std::io::Result<Key> {
        let invalid = || {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{path} is not a file of the store s3://{}/{}",
                    self.bucket, self.prefix
                ),
            )
        };
        let rest = path.strip_prefix("s3://").ok_or_else(invalid)?;
        let (bucket, key) = rest.split_once('/').ok_or_else(invalid)?;
        if bucket != self.bucket
            || (!self.prefix.is_empty() && !key.starts_with(&format!("{}/", self.prefix)))
            || key
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(invalid());
        }
        Key::parse(key).map_err(|_| invalid())
    }
}

fn timed_out(what: String, limit: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what}: no answer within {} ms", limit.as_millis()),
    )
}

/// An object's metadata as a [`StoredFile`] named `path`.
fn stored_file(path: String, meta: &ObjectMeta) -> StoredFile {
    StoredFile {
        path,
        size: meta.size,
        modified: SystemTime::UNIX_EPOCH
            + Duration::from_millis(meta.last_modified.timestamp_millis().max(0) as u64),
    }
}

fn io_error(what: String, e: object_store::Error) -> std::io::Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
        object_store::Error::AlreadyExists { .. } => std::io::ErrorKind::AlreadyExists,
        _ => std::io::ErrorKind::Other,
    };
    std::io::Error::new(kind, format!("{what}: {e}"))
}

impl Store for S3Store {
    fn create(&self, name: &str, bytes: &[u8]) -> std::io::Result<String> {
        self.create_parts(name, &[bytes])
    }

    fn create_parts(&self, name: &str, parts: &[&[u8]]) -> std::io::Result<String> {
        let key = Key::parse(format!("{}/{name}", self.prefix))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let url = self.url(&key);
        // The parts' one copy on their way out (blocks come from where a writer's sandbox
        // lent them): the request body, which the client's own retries reuse.
        let body = bytes::Bytes::from(parts.concat());
        let payload = PutPayload::from(body.clone());
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self.block(self.client.put_opts(&key, payload, options)) {
            Ok(_) => Ok(url),
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Maybe our own write whose response was lost: the names are fresh UUIDs,
                // so identical content means it is ours.
                let existing = self.read(&url)?;
                if existing[..] == body[..] {
                    tracing::debug!(%url, "conditional create reported our own earlier write");
                    Ok(url)
                } else {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!("{url} already exists with other content"),
                    ))
                }
            }
            Err(e) => Err(io_error(format!("cannot create {url}"), e)),
        }
    }

    fn delete(&self, path: &str) -> std::io::Result<()> {
        self.delete_within(path, None)
    }

    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        self.read_within(path, None)
    }

    fn read_range(&self, path: &str, range: Range<u64>) -> std::io::Result<Vec<u8>> {
        let key = self.key(path)?;
        if range.is_empty() {
            return Ok(Vec::new());
        }
        self.block(self.client.get_range(&key, range.clone()))
            .map(|b| b.to_vec())
            .map_err(|e| io_error(format!("cannot read bytes {range:?} of {path}"), e))
    }

    fn list(&self) -> std::io::Result<Vec<StoredFile>> {
        self.list_within(None)
    }

    fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

impl Drop for S3Store {
    fn drop(&mut self) {
        if let ClientRuntime::Own(runtime) = &mut self.runtime
            && let Some(runtime) = runtime.take()
        {
            runtime.shutdown_background();
        }
    }
}
