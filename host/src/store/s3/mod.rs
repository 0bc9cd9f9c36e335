//! S3-compatible object stores: the settings and errors (always present, since a
//! configuration may name them) and the client, built with the crate feature `s3`
//! (`client.rs`, through `object_store`). Without the feature an `s3://` base path is
//! refused when it is parsed ([`super::LocationError::S3NotBuilt`]), and [`S3Store`]
//! cannot be opened.

#[cfg(feature = "s3")]
mod client;
#[cfg(not(feature = "s3"))]
mod disabled;

#[cfg(feature = "s3")]
pub use client::S3Store;
#[cfg(not(feature = "s3"))]
pub use disabled::S3Store;

use std::time::Duration;

/// The key prefix of a job's changelog files under a base prefix: `<prefix>/<job>/dstl`
/// (`<job>/dstl` under an empty prefix; just `prefix` for an empty job).
pub(crate) fn job_key_prefix(prefix: &str, job_id: &str) -> String {
    join_key(&[prefix, job_id, if job_id.is_empty() { "" } else { "dstl" }])
}

/// Key segments joined by `/`, empty ones left out (an empty base prefix adds nothing).
pub(crate) fn join_key(segments: &[&str]) -> String {
    segments
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("/")
}

/// How to reach an S3-compatible service, from the `dstl.s3.*` keys
/// ([`crate::Config::s3`]). Unset values fall back to the usual AWS environment
/// variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`) when a store is opened.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    pub(crate) endpoint: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<String>,
    pub(crate) allow_http: Option<bool>,
    pub(crate) request_timeout: Option<Duration>,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            // Never in logs or panic messages.
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "(set)"),
            )
            .field("allow_http", &self.allow_http)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl S3Settings {
    /// The endpoint URL (`dstl.s3.endpoint`), if set.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// The region (`dstl.s3.region`), if set.
    pub fn region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    /// The access key id (`dstl.s3.access-key-id`), if set.
    pub fn access_key_id(&self) -> Option<&str> {
        self.access_key_id.as_deref()
    }

    /// Whether a secret access key is set (`dstl.s3.secret-access-key`); the secret
    /// itself is not handed out.
    pub fn has_secret_access_key(&self) -> bool {
        self.secret_access_key.is_some()
    }

    /// Plain http to the endpoint (`dstl.s3.allow-http`); `None`: loopback endpoints only.
    pub fn allow_http(&self) -> Option<bool> {
        self.allow_http
    }

    /// Timeout of one HTTP request (`dstl.s3.request-timeout`); `None`: 30 s.
    pub fn request_timeout(&self) -> Option<Duration> {
        self.request_timeout
    }

    /// These settings with the AWS environment variables filling the unset values.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))]
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

    /// Fails fast when the credentials cannot work, before any request: an access key
    /// without its secret (or the reverse), or an explicit endpoint (an S3-compatible
    /// server, where no instance-metadata service hands out credentials) without
    /// credentials. Without an endpoint (AWS itself) missing keys are left to the
    /// client's other sources (web identity, instance metadata); opening a store then
    /// probes the bucket, so a failure still shows up at open.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))]
    fn check_credentials(&self, bucket: &str) -> Result<(), S3Error> {
        let missing = match (&self.access_key_id, &self.secret_access_key) {
            (Some(_), None) => Some("dstl.s3.secret-access-key (or AWS_SECRET_ACCESS_KEY)"),
            (None, Some(_)) => Some("dstl.s3.access-key-id (or AWS_ACCESS_KEY_ID)"),
            (None, None) if self.endpoint.is_some() => Some(
                "dstl.s3.access-key-id and dstl.s3.secret-access-key \
                 (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
            ),
            _ => None,
        };
        match missing {
            Some(missing) => Err(S3Error::NoCredentials {
                bucket: bucket.to_string(),
                endpoint: self
                    .endpoint
                    .clone()
                    .unwrap_or_else(|| "AWS S3".to_string()),
                missing,
            }),
            None => Ok(()),
        }
    }
}

/// Whether `endpoint` is plain http to this machine (where it cannot leak).
#[cfg_attr(not(feature = "s3"), allow(dead_code))]
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
#[non_exhaustive]
pub enum S3Error {
    /// The settings do not make a client.
    #[error("invalid S3 settings for bucket {bucket}: {source}")]
    Settings {
        /// The bucket.
        bucket: String,
        /// What the client said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Credentials are missing, or half of a pair is.
    #[error("no S3 credentials for bucket {bucket} at {endpoint}: set {missing}")]
    NoCredentials {
        /// The bucket.
        bucket: String,
        /// The endpoint (or `AWS S3`).
        endpoint: String,
        /// The keys to set.
        missing: &'static str,
    },
    /// The service refused the credentials (HTTP 401/403 on the probe at open).
    #[error("the S3 service at {endpoint} refused the credentials for bucket {bucket}: {source}")]
    Refused {
        /// The bucket.
        bucket: String,
        /// The endpoint (or `AWS S3`).
        endpoint: String,
        /// What it said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The probe at open failed otherwise: the endpoint is down, the bucket does not
    /// exist, or the request timed out.
    #[error("cannot reach bucket {bucket} at {endpoint}: {source}")]
    Unreachable {
        /// The bucket.
        bucket: String,
        /// The endpoint (or `AWS S3`).
        endpoint: String,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The client's runtime did not start.
    #[error("cannot start the S3 client runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// This build of dstl has no S3 client (crate feature `s3`).
    #[error("this build of dstl has no S3 support: enable the crate feature `s3`")]
    NotBuilt,
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

    #[test]
    fn half_a_credential_pair_is_refused_before_any_request() {
        let settings = S3Settings {
            access_key_id: Some("id".into()),
            ..S3Settings::default()
        };
        let e = settings.check_credentials("b").unwrap_err().to_string();
        assert!(e.contains("dstl.s3.secret-access-key"), "{e}");
        let settings = S3Settings {
            endpoint: Some("http://127.0.0.1:9".into()),
            ..S3Settings::default()
        };
        let e = settings.check_credentials("b").unwrap_err().to_string();
        assert!(
            e.contains("http://127.0.0.1:9") && e.contains("access-key-id"),
            "{e}"
        );
        // AWS itself: other credential sources may apply.
        assert!(S3Settings::default().check_credentials("b").is_ok());
    }
}
