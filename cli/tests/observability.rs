//! Metrics and traces of a real `dstl run` process: its `--prometheus` endpoint scraped
//! over HTTP while the job runs, `--duration`, `--log-format json`, and the errors for
//! bad values of these options.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dstl::telemetry::{METRICS, MetricKind, OTHER_WRITERS};
use serde_json::Value;

fn dstl() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dstl"));
    command.env_remove("RUST_LOG");
    command
}

fn describe(out: &Output) -> String {
    format!(
        "exit: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A `dstl run` in the background, its stderr read line by line.
struct Running {
    child: Child,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(dir: &Path, args: &[&str]) -> Self {
        let mut child = dstl()
            .arg("run")
            .arg("--dir")
            .arg(dir)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the dstl binary starts");
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            stderr: rx,
            seen: Vec::new(),
        }
    }

    /// The address from the endpoint's announcement on stderr.
    fn metrics_address(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            match self.stderr.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    let found = line
                        .strip_prefix("dstl: serving Prometheus metrics at http://")
                        .and_then(|rest| rest.strip_suffix("/metrics"))
                        .map(str::to_string);
                    self.seen.push(line);
                    if let Some(address) = found {
                        return address;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = self.child.kill();
        panic!(
            "dstl run announced no metrics endpoint; stderr:\n{}",
            self.seen.join("\n")
        );
    }

    /// Waits for the process; returns its stdout.
    fn finish(mut self) -> String {
        let mut stdout = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        let status = self.child.wait().unwrap();
        self.seen.extend(self.stderr.try_iter());
        assert!(
            status.success(),
            "dstl run failed: {status}\nstderr:\n{}",
            self.seen.join("\n")
        );
        stdout
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.child.kill();
        }
    }
}

/// One HTTP/1.1 request; the status line, the headers and the body.
fn get(address: &str, path: &str) -> (String, String, String) {
    let mut stream = TcpStream::connect(address).expect("the endpoint accepts connections");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("a response with headers");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

/// A parsed exposition: `# TYPE` per family, `# HELP` per family, and every sample by its
/// series (`name{labels}`).
struct Exposition {
    types: BTreeMap<String, String>,
    help: BTreeSet<String>,
    samples: BTreeMap<String, f64>,
}

fn scrape(address: &str) -> Exposition {
    let (status, headers, body) = get(address, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{headers}\n{body}");
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    let mut exposition = Exposition {
        types: BTreeMap::new(),
        help: BTreeSet::new(),
        samples: BTreeMap::new(),
    };
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            exposition.types.insert(name.into(), kind.into());
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            exposition
                .help
                .insert(rest.split(' ').next().unwrap().into());
        } else if !line.is_empty() && !line.starts_with('#') {
            let (series, value) = line.rsplit_once(' ').expect("series value");
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("bad sample {line:?}"));
            exposition.samples.insert(series.into(), value);
        }
    }
    exposition
}

impl Exposition {
    /// The sum of every series of `name` (all label values).
    fn total(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|(series, _)| {
                series.as_str() == name || series.starts_with(&format!("{name}{{"))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// The `writer` label values of `name`'s series.
    fn writers(&self, name: &str) -> BTreeSet<String> {
        self.samples
            .keys()
            .filter_map(|series| series.strip_prefix(&format!("{name}{{writer=\"")))
            .map(|rest| rest.split('"').next().unwrap().to_string())
            .collect()
    }
}

#[test]
fn prometheus_endpoint_serves_every_family_with_moving_counters_during_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    // Three writers but two writer labels: one of them reports as `other`. A low
    // pre-emptive threshold makes pre-emptive uploads happen between checkpoints.
    let mut run = Running::start(
        tmp.path(),
        &[
            "--writers",
            "3",
            "--duration",
            "8s",
            "--checkpoint-every",
            "3000",
            "--prometheus",
            "127.0.0.1:0",
            "--json",
            "--conf",
            "dstl.metrics.writer-label-limit=2",
            "--conf",
            "dstl.dfs.preemptive-persist-threshold=64kb",
        ],
    );
    let address = run.metrics_address();
    std::thread::sleep(Duration::from_millis(1500));
    let first = scrape(&address);
    std::thread::sleep(Duration::from_millis(2000));
    let second = scrape(&address);

    for info in METRICS {
        let kind = match info.kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        };
        assert_eq!(
            second.types.get(info.name).map(String::as_str),
            Some(kind),
            "family {} missing or of the wrong type; families: {:?}",
            info.name,
            second.types
        );
        assert!(
            second.help.contains(info.name),
            "no # HELP for {}",
            info.name
        );
        if info.kind == MetricKind::Histogram {
            let buckets = second
                .samples
                .keys()
                .filter(|s| s.starts_with(&format!("{}_bucket{{", info.name)))
                .count();
            assert!(
                buckets > info.buckets.len(),
                "{}: {buckets} buckets",
                info.name
            );
        }
    }

    // Counters (and histogram counts) move while the job runs.
    for name in [
        "dstl_upload_requests_total",
        "dstl_uploaded_files_total",
        "dstl_written_bytes_total",
        "dstl_upload_size_bytes_count",
        "dstl_upload_latency_seconds_count",
        "dstl_upload_attempts_per_upload_count",
        "dstl_upload_total_attempts_per_upload_count",
        "dstl_upload_batch_tasks_count",
        "dstl_writer_appends_total",
        "dstl_writer_appended_bytes_total",
        "dstl_writer_persists_total",
        "dstl_writer_persist_latency_seconds_count",
        "dstl_writer_preemptive_uploads_total",
    ] {
        let (before, after) = (first.total(name), second.total(name));
        assert!(
            after > before && before > 0.0,
            "{name} did not move between scrapes: {before} then {after}"
        );
    }
    // 100-byte changes: the bytes follow the appends. A writer bumps the two counters one
    // after the other, so a scrape may fall between them: by at most one batch of the
    // workload (512 changes) per writer.
    let (bytes, appends) = (
        second.total("dstl_writer_appended_bytes_total"),
        second.total("dstl_writer_appends_total"),
    );
    assert!(
        (bytes - 100.0 * appends).abs() <= 3.0 * 512.0 * 100.0,
        "{bytes} bytes for {appends} appends of 100 bytes"
    );
    assert_eq!(second.total("dstl_upload_failures_total"), 0.0);
    assert_eq!(second.total("dstl_writer_traps_total"), 0.0);
    assert!(second.total("dstl_upload_in_flight_bytes") >= 0.0);
    assert!(second.total("dstl_upload_queue_tasks") >= 0.0);

    // Two writers by name, the third under `other`.
    let writers = second.writers("dstl_writer_appends_total");
    assert_eq!(writers.len(), 3, "{writers:?}");
    assert!(writers.contains(OTHER_WRITERS), "{writers:?}");
    assert_eq!(
        writers.iter().filter(|w| w.starts_with("op-")).count(),
        2,
        "{writers:?}"
    );

    let (status, _, body) = get(&address, "/");
    assert_eq!(status, "HTTP/1.1 404 Not Found", "{body}");
    assert!(body.contains("/metrics"), "{body}");

    // The run ends by itself after its duration, verified, having appended what the
    // endpoint reported and more.
    let summary: Value = serde_json::from_str(run.finish().trim()).unwrap();
    assert_eq!(summary["verified"], true, "{summary}");
    let changes = summary["changes"].as_f64().unwrap();
    assert!(
        changes >= second.total("dstl_writer_appends_total"),
        "{summary}"
    );
    assert!(summary["wall_s"].as_f64().unwrap() >= 8.0, "{summary}");
    assert!(
        summary["metrics"]["upload_requests"].as_f64().unwrap()
            >= second.total("dstl_upload_requests_total"),
        "{summary}"
    );
}

#[test]
fn bad_values_of_the_new_options_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = dstl()
            .arg("run")
            .arg("--dir")
            .arg(tmp.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "expected a failure\n{}",
            describe(&out)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["--prometheus", "nonsense"]);
    assert!(e.contains("nonsense") && e.contains("HOST:PORT"), "{e}");
    let e = run(&["--duration", "5 parsecs"]);
    assert!(
        e.contains("5 parsecs") && e.contains("--duration") && e.contains("30s"),
        "{e}"
    );
    let e = run(&["--duration", "30"]);
    assert!(e.contains("with a unit"), "{e}");
    let e = run(&["--duration", "5s", "--changes", "10"]);
    assert!(e.contains("--changes") && e.contains("--duration"), "{e}");
    let e = run(&["--log-format", "xml"]);
    assert!(e.contains("xml") && e.contains("json"), "{e}");

    // An address already taken fails before the job starts, naming it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let e = run(&["--prometheus", &address, "--changes", "1000"]);
    assert!(e.contains(&address) && e.contains("cannot listen"), "{e}");
    assert!(
        !tmp.path().read_dir().unwrap().any(|_| true),
        "nothing was written"
    );
}

/// Under `--log-format json` the final error is a JSON line like every other one.
#[test]
fn json_logs_report_the_final_error_as_json_too() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-manifest.json");
    let out = dstl()
        .args(["--log-format", "json", "read"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", describe(&out));
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    let events: Vec<Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let error = events
        .iter()
        .find(|e| e["level"] == "ERROR")
        .unwrap_or_else(|| panic!("no ERROR event: {stderr}"));
    let message = error["fields"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&*missing.to_string_lossy()),
        "the error names the manifest: {error}"
    );
}

#[test]
fn json_logs_carry_the_writer_upload_and_recovery_spans() {
    let tmp = tempfile::tempdir().unwrap();
    let out = dstl()
        .env("RUST_LOG", "dstl=debug")
        .args(["--log-format", "json", "run", "--dir"])
        .arg(tmp.path())
        .args([
            "--writers",
            "2",
            "--changes",
            "20000",
            "--checkpoint-every",
            "5000",
            "--json",
            "--conf",
            "dstl.dfs.preemptive-persist-threshold=100kb",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).expect("stdout is the summary");
    assert_eq!(summary["verified"], true);
    let events: Vec<Value> = String::from_utf8(out.stderr.clone())
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let message = |event: &Value| {
        event["fields"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };

    // One event per upload batch, in its root span, with the batch's fields.
    let batches: Vec<&Value> = events
        .iter()
        .filter(|e| message(e) == "upload batch finished")
        .collect();
    assert!(!batches.is_empty(), "no upload batch events");
    for event in &batches {
        let span = &event["span"];
        assert_eq!(span["name"], "upload", "{event}");
        assert_eq!(span["outcome"], "ok", "{event}");
        assert!(span["tasks"].as_u64().unwrap() >= 1, "{event}");
        assert!(span["bytes"].as_u64().unwrap() > 0, "{event}");
        assert!(span["attempts"].as_u64().unwrap() >= 1, "{event}");
        let ids = span["task_ids"].as_str().unwrap();
        assert_eq!(
            ids.split(' ').count() as u64,
            span["tasks"].as_u64().unwrap(),
            "{event}"
        );
        assert_eq!(
            event["spans"].as_array().unwrap().len(),
            1,
            "a root span: {event}"
        );
        assert!(event["fields"]["attempt"].as_u64().is_some(), "{event}");
    }
    assert_eq!(
        batches.len() as u64,
        summary["metrics"]["upload_batch_sizes"]["count"]
            .as_u64()
            .unwrap(),
        "one event per batch the metrics counted"
    );

    // The guest's log lines (pre-emptive persists) come inside their writer's span.
    let in_writer: BTreeSet<String> = events
        .iter()
        .filter(|e| e["span"]["name"] == "writer")
        .map(|e| e["span"]["writer"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        in_writer,
        BTreeSet::from(["op-0".to_string(), "op-1".to_string()]),
        "events in writer spans"
    );

    // Every writer's last checkpoint is read back for verification: one recovery read each.
    let reads: Vec<&Value> = events
        .iter()
        .filter(|e| message(e) == "recovery read finished")
        .collect();
    assert_eq!(reads.len(), 2, "one verification read per writer");
    for event in reads {
        let span = &event["span"];
        assert_eq!(span["name"], "recovery_read", "{event}");
        assert_eq!(span["outcome"], "ok", "{event}");
        assert!(span["changes"].as_u64().unwrap() > 0, "{event}");
        assert!(span["files"].as_u64().unwrap() >= 1, "{event}");
    }
}
