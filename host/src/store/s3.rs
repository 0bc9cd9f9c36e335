//! S3-compatible object stores through the `object_store` crate.
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
    ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
};

use super::{Store, StoredFile};

/// How to reach an S3-compatible service. Unset fields fall back to the usual AWS
/// environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    /// Endpoint URL, e.g. `http://127.0.0.1:8333`.
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    pub region: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Allow plain http; by default only for loopback endpoints.
    pub allow_http: Option<bool>,
    /// Timeout of one HTTP request (default 30 s).
    pub request_timeout: Option<Duration>,
}

impl S3Settings {
    fn resolved(&self) -> S3Settings {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        S3Settings {
            endpoint: self.endpoint.clone().or_else(|| env("AWS_ENDPOINT_URL")),
            region: self
                .region
                .clone()
                .or_else(|| env("AWS_REGION"))
                .or_else(|| env("AWS_DEFAULT_REGION")),
            access_key_id: self
                .access_key_id
                .clone()
                .or_else(|| env("AWS_ACCESS_KEY_ID")),
            secret_access_key: self
                .secret_access_key
                .clone()
                .or_else(|| env("AWS_SECRET_ACCESS_KEY")),
            allow_http: self.allow_http,
            request_timeout: self.request_timeout,
        }
    }
}

fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.split_once(']').map(|(h, _)| h))
        .unwrap_or_else(|| host.rsplit_once(':').map_or(host, |(h, _)| h));
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Why an S3 store cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// The settings do not make a client.
    #[error("invalid S3 settings for bucket {bucket}: {source}")]
    Settings {
        /// The bucket.
        bucket: String,
        /// What the client said.
        #[source]
        source: object_store::Error,
    },
    /// The client's runtime did not start.
    #[error("cannot start the S3 client runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// One bucket (and key prefix) of an S3-compatible service.
pub struct S3Store {
    client: Arc<AmazonS3>,
    bucket: String,
    /// Key prefix of this store's files, without trailing `/`.
    prefix: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl S3Store {
    /// A store writing to `s3://bucket/<prefix>/<job_id>/dstl/`.
    pub fn open(
        settings: &S3Settings,
        bucket: &str,
        prefix: &str,
        job_id: &str,
    ) -> Result<Self, S3Error> {
        let prefix = [prefix, job_id, if job_id.is_empty() { "" } else { "dstl" }]
            .iter()
            .filter(|p| !p.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("/");
        Self::open_at(settings, bucket, &prefix)
    }

    /// A store writing to `s3://bucket/<key_prefix>/` (no leading or trailing `/`).
    pub fn open_at(settings: &S3Settings, bucket: &str, key_prefix: &str) -> Result<Self, S3Error> {
        let settings = settings.resolved();
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
            source,
        })?;
        let prefix = key_prefix.to_string();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dstl-s3")
            .enable_all()
            .build()
            .map_err(S3Error::Runtime)?;
        Ok(Self {
            client: Arc::new(client),
            bucket: bucket.to_string(),
            prefix,
            runtime: Some(runtime),
        })
    }

    /// Runs a request to completion from synchronous code (never from a runtime worker:
    /// then on a scoped thread).
    fn block<F: Future + Send>(&self, future: F) -> F::Output
    where
        F::Output: Send,
    {
        let runtime = self
            .runtime
            .as_ref()
            .expect("runtime lives as long as the store");
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| runtime.block_on(future))
                    .join()
                    .expect("S3 request panicked")
            })
        } else {
            runtime.block_on(future)
        }
    }

    /// Replaces the content of `path`, a file of this store, with `bytes` (or creates
    /// it): for small records that change, never for changelog files.
    pub fn overwrite(&self, path: &str, bytes: &[u8]) -> std::io::Result<()> {
        let key = self.key(path)?;
        let payload = PutPayload::from(bytes.to_vec());
        self.block(self.client.put(&key, payload))
            .map(|_| ())
            .map_err(|e| io_error(format!("cannot write {path}"), e))
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
        let key = Key::parse(format!("{}/{name}", self.prefix))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let url = self.url(&key);
        let payload = PutPayload::from(bytes.to_vec());
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
                if existing == bytes {
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
        let key = self.key(path)?;
        match self.block(self.client.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_error(format!("cannot delete {path}"), e)),
        }
    }

    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        let key = self.key(path)?;
        self.block(async {
            let result = self.client.get(&key).await?;
            result.bytes().await
        })
        .map(|b| b.to_vec())
        .map_err(|e| io_error(format!("cannot read {path}"), e))
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
        let prefix = Key::from(self.prefix.as_str());
        let metas: Vec<_> = self
            .block(self.client.list(Some(&prefix)).try_collect::<Vec<_>>())
            .map_err(|e| io_error(format!("cannot list {}", self.describe()), e))?;
        let mut files: Vec<StoredFile> = metas
            .into_iter()
            .map(|m| StoredFile {
                path: self.url(&m.location),
                size: m.size,
                modified: SystemTime::UNIX_EPOCH
                    + Duration::from_millis(m.last_modified.timestamp_millis().max(0) as u64),
            })
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

impl Drop for S3Store {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_for_loopback() {
        assert!(is_loopback_http("http://127.0.0.1:8333"));
        assert!(is_loopback_http("http://localhost:9000/"));
        assert!(is_loopback_http("http://[::1]:9000"));
        assert!(!is_loopback_http("http://10.0.0.1:9000"));
        assert!(!is_loopback_http("https://127.0.0.1:9000"));
        assert!(!is_loopback_http("http://example.com"));
    }
}
