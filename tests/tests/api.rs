//! The public API's shape: configuration that cannot hold a bad value, persist futures
//! that keep their outcome, bad writer options refused by value, and S3 credentials
//! checked when a storage opens (against a real SeaweedFS). A storage on the caller's
//! runtime: `caller_runtime.rs` (a binary of its own, since it counts threads).

use std::time::{Duration, Instant};

use dstl::{ChangelogStorage, Config, ConfigError, Error, S3Error, WriterOptions};
use dstl_tests::harness::{RANGE, config, open_temp};
use dstl_tests::seaweed::{ACCESS_KEY, Seaweed};

#[test]
fn a_config_refuses_bad_values_and_keeps_its_old_ones() {
    let bad_base = Config::new()
        .with("dstl.dfs.base-path", "ftp://x")
        .unwrap_err();
    assert!(
        matches!(&bad_base, ConfigError::InvalidLocation { key, .. } if key == "dstl.dfs.base-path"),
        "{bad_base}"
    );
    let mut config = Config::new();
    let job = config.job_id().to_string();
    let escape = config.set_job_id("../../x").unwrap_err();
    assert!(escape.to_string().contains("`dstl.job-id`"), "{escape}");
    assert_eq!(config.job_id(), job);
    let dir = config.job_dir();
    assert!(
        dir.ends_with(format!("{job}/dstl")),
        "the job directory stays inside the base: {}",
        dir.display()
    );
    // A rejected value leaves the key as it was, also for keys checked after parsing.
    let limit = config.writer_memory_limit;
    assert!(config.set("dstl.writer.memory-limit", "1kb").is_err());
    assert_eq!(config.writer_memory_limit, limit);
    assert!(config.set_max_attempts(0).is_err());
    assert_eq!(config.max_attempts, 3);
    // Typed setters and chaining.
    config.set_compression(true);
    config
        .set_upload_timeout(Duration::from_millis(1500))
        .unwrap();
    // A typed value passes the checks of its text, naming the key.
    let refused = config.set_persist_delay(Duration::from_secs(2 * 86400));
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("dstl.dfs.batch.persist-delay"),
    );
    assert!(config.set_max_in_flight(0).is_err());
    let config = config.with("dstl.dfs.batch.persist-delay", "2 ms").unwrap();
    assert!(config.compression);
    assert_eq!(config.upload_timeout, Duration::from_millis(1500));
    assert_eq!(config.persist_delay, Duration::from_millis(2));
}

#[test]
fn a_current_thread_runtime_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let error = ChangelogStorage::builder(config(tmp.path(), &[]))
        .runtime(runtime.handle().clone())
        .open()
        .err()
        .expect("a current-thread runtime cannot serve uploads");
    assert!(
        matches!(&error, Error::InvalidArgument(m) if m.contains("multi-threaded")),
        "{error}"
    );
}

#[test]
fn a_persist_future_keeps_its_outcome_for_wait_after_try_wait() {
    let (_tmp, storage) = open_temp(&[]);
    let w = storage.create_writer("op", RANGE).unwrap();
    w.append(1, b"x").unwrap();
    let mut future = w.persist(0, 1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        if let Some(outcome) = future.try_wait() {
            break outcome.unwrap();
        }
        assert!(Instant::now() < deadline, "the persist never completed");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(future.try_wait().unwrap().unwrap(), seen);
    assert_eq!(future.wait().unwrap(), seen);
    // The same for a persist that was ready at once.
    let mut ready = w.persist(1, 2).unwrap();
    assert!(ready.is_immediate());
    let first = ready.try_wait().unwrap().unwrap();
    assert_eq!(ready.wait().unwrap(), first);
}

#[test]
fn writer_options_out_of_range_are_refused_by_value() {
    let (_tmp, storage) = open_temp(&[]);
    for (options, named) in [
        (WriterOptions::new().memory_limit(4096), "4096"),
        (
            WriterOptions::new().call_timeout(Duration::from_micros(10)),
            "10µs",
        ),
    ] {
        let error = storage
            .create_writer_with("op", RANGE, options)
            .err()
            .expect("refused");
        assert!(
            matches!(&error, Error::InvalidArgument(m) if m.contains(named)),
            "{error}"
        );
    }
}

#[test]
fn s3_credentials_are_checked_when_the_storage_opens() {
    let server = Seaweed::start("creds");
    let tmp = tempfile::tempdir().unwrap();
    let base = format!("s3://{}/x", server.bucket);
    let with = |pairs: &[String]| {
        let mut config = config(tmp.path(), &[]);
        config.set("dstl.dfs.base-path", &base).unwrap();
        config
            .apply_pairs(pairs.iter().map(String::as_str))
            .unwrap();
        config
    };
    let endpoint = format!("dstl.s3.endpoint={}", server.endpoint());
    // A wrong secret: the server refuses the probe at open, not the first upload.
    let started = Instant::now();
    let refused = ChangelogStorage::open(with(&[
        endpoint.clone(),
        format!("dstl.s3.access-key-id={ACCESS_KEY}"),
        "dstl.s3.secret-access-key=wrong".into(),
    ]))
    .err()
    .expect("wrong credentials are refused at open");
    assert!(started.elapsed() < Duration::from_secs(15));
    let text = dstl::describe(&refused);
    assert!(
        text.contains("refused the credentials") && text.contains(&server.bucket),
        "{text}"
    );
    assert!(matches!(
        refused
            .setup_cause()
            .and_then(|s| s.downcast_ref::<S3Error>()),
        Some(S3Error::Refused { .. })
    ));
    // No credentials for an explicit endpoint: refused before any request.
    let missing = dstl::S3Store::open(&with(&[endpoint]).s3().clone(), "creds", "x", "")
        .err()
        .expect("no credentials");
    assert!(
        matches!(&missing, S3Error::NoCredentials { .. })
            && missing.to_string().contains("dstl.s3.access-key-id"),
        "{missing}"
    );
}
