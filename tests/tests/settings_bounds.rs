//! Every configuration key at its boundary values: 0, 1, the largest value it accepts and
//! just past it. Each value is either refused by `Config::set` (or by the storage's
//! checks at open) with a message naming the key, or it works through the wasmtime host:
//! a storage opens, a writer appends and persists, and closing the storage resolves the
//! persist. Never a panic, a hang or a poisoned lock, which a value that overflows the
//! host's arithmetic (an instant plus a huge delay) or a limit nothing can pass (no bytes
//! in flight) used to cause.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use dstl::config::KEYS;
use dstl::{ChangelogStorage, Config, Error, TrapKind};
use dstl_tests::harness::{RANGE, config};

/// How a key's values are written, and the range it accepts.
enum Kind {
    /// A size in bytes, from and up to this many.
    Bytes(u128, u128),
    /// A duration, from and up to this many milliseconds.
    Millis(u128, u128),
    /// A whole number, from and up to this.
    Count(u128, u128),
    /// One of these words (a flag: `true` or `false`).
    Words(&'static [&'static str]),
    /// A path, a name or a URL: only parsed (running a storage on `0` would write into the
    /// working directory).
    Text,
}

fn kind(key: &str) -> Kind {
    const DAY_MS: u128 = 24 * 3600 * 1000;
    const FLAG: &[&str] = &["true", "false"];
    match key {
        "dstl.dfs.preemptive-persist-threshold"
        | "dstl.dfs.batch.persist-size-threshold"
        | "dstl.recovery.cache-size" => Kind::Bytes(0, u64::MAX as u128),
        "dstl.dfs.upload.max-in-flight" => Kind::Bytes(1, u64::MAX as u128),
        "dstl.dfs.upload.buffer-size" => Kind::Bytes(1, i32::MAX as u128),
        "dstl.writer.memory-limit" => Kind::Bytes(2 << 20, 4 << 30),
        "dstl.dfs.batch.persist-delay"
        | "dstl.dfs.upload.timeout"
        | "dstl.dfs.upload.next-attempt-delay"
        | "dstl.dfs.download.local-cache.idle-timeout-ms" => Kind::Millis(0, DAY_MS),
        "dstl.writer.call-timeout" | "dstl.s3.request-timeout" => Kind::Millis(1, DAY_MS),
        "dstl.dfs.upload.num-threads" | "dstl.dfs.discard.num-threads" => Kind::Count(1, 1024),
        "dstl.writer.max-writers" => Kind::Count(1, 65536),
        "dstl.dfs.upload.max-attempts" => Kind::Count(1, u32::MAX as u128),
        "dstl.metrics.writer-label-limit" => Kind::Count(0, u32::MAX as u128),
        "dstl.dfs.compression.enabled"
        | "dstl.dfs.local.fsync"
        | "dstl.dfs.local.direct-io"
        | "dstl.local-recovery.enabled"
        | "dstl.writer.signals-based-traps"
        | "dstl.s3.allow-http" => Kind::Words(FLAG),
        "dstl.dfs.upload.retry-policy" => Kind::Words(&["fixed", "none"]),
        "dstl.writer.engine" => Kind::Words(&["storage", "process"]),
        "dstl.dfs.base-path"
        | "dstl.job-id"
        | "dstl.local-recovery.dir"
        | "dstl.s3.endpoint"
        | "dstl.s3.region"
        | "dstl.s3.access-key-id"
        | "dstl.s3.secret-access-key" => Kind::Text,
        other => panic!("key {other} has no boundaries here yet: add it"),
    }
}

/// 0, 1, the smallest accepted value and just below it, the largest accepted value and
/// just past it (in the unit a bare number means); a word key's words, and 0 and 1.
fn boundaries(kind: &Kind) -> Vec<String> {
    let mut values: Vec<String> = vec!["0".into(), "1".into()];
    match kind {
        Kind::Bytes(min, max) | Kind::Millis(min, max) | Kind::Count(min, max) => {
            for n in [min.saturating_sub(1), *min, *max, max + 1] {
                values.push(n.to_string());
            }
        }
        Kind::Words(words) => values.extend(words.iter().map(|w| w.to_string())),
        Kind::Text => {}
    }
    values.dedup();
    let mut seen = std::collections::HashSet::new();
    values.retain(|v| seen.insert(v.clone()));
    values
}

/// What one value did.
#[derive(Debug)]
enum Outcome {
    /// Refused by `Config::set` or at open, with this message.
    Refused(String),
    /// It ran: the persist's outcome (an error is fine if typed and not a host panic).
    Ran(Result<(), Error>),
}

/// Opens a storage with `key=value`, appends, persists and closes, within `limit`.
fn run(key: &str, value: &str, limit: Duration) -> Outcome {
    let tmp = tempfile::tempdir().unwrap();
    let mut config: Config = config(tmp.path(), &[]);
    if let Err(e) = config.set(key, value) {
        return Outcome::Refused(e.to_string());
    }
    if matches!(kind(key), Kind::Text) {
        return Outcome::Ran(Ok(()));
    }
    let storage = match ChangelogStorage::open(config) {
        Ok(storage) => storage,
        Err(e) => return Outcome::Refused(dstl::describe(&e)),
    };
    let writer = match storage.create_writer("op", RANGE) {
        Ok(writer) => writer,
        Err(e) => return Outcome::Refused(dstl::describe(&e)),
    };
    let appended = (0..64).try_for_each(|i| writer.append(i % 128, &[i as u8; 100]));
    let mut future = match appended.and_then(|()| writer.persist(0, 1)) {
        Ok(future) => future,
        Err(e) => return Outcome::Ran(Err(e)),
    };
    // A persist waits for its batch (a persist delay of a day holds it that long);
    // closing the storage must resolve it either way.
    let started = Instant::now();
    while future.try_wait().is_none() && started.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    storage.close();
    let outcome = future
        .try_wait()
        .unwrap_or_else(|| panic!("{key}={value}: the persist is still pending after close"));
    let _ = writer.close();
    assert!(
        started.elapsed() < limit,
        "{key}={value}: took {:?}",
        started.elapsed()
    );
    Outcome::Ran(outcome.map(|_| ()))
}

#[test]
fn every_key_at_its_boundaries_works_or_is_refused_by_name() {
    let mut report = Vec::new();
    for key in KEYS {
        let kind = kind(key);
        for value in boundaries(&kind) {
            let (done, outcome) = mpsc::channel();
            let (k, v) = (key.to_string(), value.clone());
            // A hang is a failure, not a stuck test run.
            std::thread::spawn(move || {
                let _ = done.send(run(&k, &v, Duration::from_secs(60)));
            });
            let outcome = outcome
                .recv_timeout(Duration::from_secs(90))
                .unwrap_or_else(|e| panic!("{key}={value} hung or panicked: {e}"));
            match &outcome {
                Outcome::Refused(message) => assert!(
                    message.contains(key),
                    "{key}={value} was refused without naming the key: {message}"
                ),
                Outcome::Ran(Err(Error::Trapped {
                    kind: TrapKind::HostPanic,
                    cause,
                    ..
                })) => panic!("{key}={value}: the host panicked: {cause}"),
                Outcome::Ran(_) => {}
            }
            report.push(format!("{key}={value}: {outcome:?}"));
        }
    }
    // Nothing any of them did poisoned what the process shares (the engine of
    // `dstl.writer.engine=process`, its instance pool): a storage with the defaults works.
    let tmp = tempfile::tempdir().unwrap();
    let storage = ChangelogStorage::open(config(tmp.path(), &["dstl.writer.engine=process"]))
        .unwrap_or_else(|e| panic!("after the boundaries: {e}\n{}", report.join("\n")));
    let writer = storage.create_writer("after", RANGE).unwrap();
    writer.append(1, b"x").unwrap();
    writer.persist(0, 1).unwrap().wait().unwrap();
    storage.close();
    eprintln!("{}", report.join("\n"));
}

#[test]
fn values_that_overflowed_the_host_are_refused_by_name() {
    for (key, value, words) in [
        (
            "state.changelog.dstl.dfs.batch.persist-delay",
            "200000000000000d",
            "at most 1 d",
        ),
        ("dstl.dfs.upload.timeout", "106751991167300d", "at most 1 d"),
        ("dstl.dfs.upload.max-in-flight", "0", "at least 1 byte"),
    ] {
        let message = Config::new().with(key, value).unwrap_err().to_string();
        assert!(
            message.contains(key) && message.contains(words),
            "{message}"
        );
    }
}
