//! The shared writer scenarios (`tests/scenarios/*.json`, format in its README.md)
//! through the wasmtime host, via the public `dstl` API and the fault-injecting store
//! (`dstl_tests::fault_store`), which fails or holds back file creations as the scenario
//! says. The Node host runs the same files (`js/test/scenarios.test.mjs` with `js/support/scenario-runner.mjs`).
//!
//! Every file is parsed strictly: an unparseable file, an unknown field, operation or
//! error kind fails the test, so no scenario is silently skipped. A scenario that lists
//! only the Node host is reported as skipped with its reason.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail, ensure};
use dstl::{
    ChangelogStorage, Config, Error, KeyGroupRange, PersistFuture, SnapshotResult, Writer,
    WriterOptions,
};
use dstl_tests::fault_store::{Fault, FaultStore};
use dstl_tests::harness::{changelog_files, path_strings, read_changes, snapshot_paths};
use serde_json::{Map, Value};

const JOB_ID: &str = "000000000000002a466c696e6b416e63";

const TOP_FIELDS: &[&str] = &[
    "name",
    "description",
    "spec",
    "hosts",
    "only_because",
    "config",
    "steps",
];

/// Fields each operation takes besides `op` and `expect`.
const OPS: &[(&str, &[&str])] = &[
    (
        "create",
        &[
            "writer",
            "name",
            "key_groups",
            "memory_limit",
            "call_timeout",
        ],
    ),
    ("append", &["writer", "key_group", "value"]),
    ("append_meta", &["writer", "value"]),
    (
        "append_batch",
        &["writer", "key_groups", "lengths", "data", "repeat"],
    ),
    ("next_sequence_number", &["writer", "save", "value"]),
    ("initial_sequence_number", &["writer", "value"]),
    (
        "persist",
        &["writer", "from", "checkpoint", "as", "immediate"],
    ),
    ("await", &["persist", "snapshot"]),
    ("truncate", &["writer", "to"]),
    ("confirm", &["writer", "from", "to", "checkpoint"]),
    ("reset", &["writer", "from", "to", "checkpoint"]),
    ("truncate_and_close", &["writer", "from"]),
    ("close", &["writer"]),
    ("drop", &["writer"]),
    ("failure", &["writer", "contains"]),
    ("fail_uploads", &["times"]),
    ("hang_uploads", &["times"]),
    ("release_uploads", &[]),
    ("break_store", &[]),
    ("repair_store", &[]),
    ("close_storage", &[]),
    ("idle", &[]),
    (
        "check",
        &[
            "uploads",
            "upload_failures",
            "files",
            "files_are",
            "exist",
            "gone",
            "tracked",
            "local_files",
        ],
    ),
    ("flag_byte", &["persist", "value"]),
    (
        "damage_file",
        &["persist", "truncate_to", "overwrite", "remove"],
    ),
    ("read", &["persist"]),
];

const SNAPSHOT_FIELDS: &[&str] = &[
    "changes",
    "local_changes",
    "entries",
    "local_entries",
    "state_size",
    "incremental_size",
    "storage_id",
    "key_group_range",
    "same_entries_as",
    "same_file",
    "distinct_files",
];

const ERROR_FIELDS: &[&str] = &[
    "error",
    "message",
    "contains",
    "starts_with",
    "display_starts_with",
];

const ERROR_KINDS: &[&str] = &[
    "closed",
    "truncated",
    "not-yet-appended",
    "already-failed",
    "invalid-range",
    "invalid-argument",
    "upload-failed",
    "trapped",
    "host-invalid-argument",
    "storage-closed",
    "read",
];

fn scenario_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// Parses a scenario file and checks its shape.
fn load(path: &Path) -> Result<Map<String, Value>> {
    let text = std::fs::read_to_string(path)?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} does not parse", path.display()))?;
    let Value::Object(scenario) = value else {
        bail!("{} is not a JSON object", path.display());
    };
    for key in scenario.keys() {
        ensure!(TOP_FIELDS.contains(&key.as_str()), "unknown field {key}");
    }
    let stem = path.file_stem().unwrap().to_string_lossy();
    ensure!(
        scenario.get("name").and_then(Value::as_str) == Some(&*stem),
        "name differs from the file name {stem}"
    );
    let hosts = scenario
        .get("hosts")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("hosts missing"))?;
    ensure!(
        !hosts.is_empty()
            && hosts
                .iter()
                .all(|h| matches!(h.as_str(), Some("rust" | "node"))),
        "hosts must list rust and/or node"
    );
    ensure!(
        hosts.len() == 2 || scenario.get("only_because").is_some(),
        "a scenario for one host must say why (only_because)"
    );
    let steps = scenario
        .get("steps")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("steps missing"))?;
    ensure!(!steps.is_empty(), "no steps");
    for (i, step) in steps.iter().enumerate() {
        let step = step
            .as_object()
            .ok_or_else(|| anyhow!("step {i} is not an object"))?;
        let op = step.get("op").and_then(Value::as_str).unwrap_or("");
        let fields = OPS
            .iter()
            .find(|(name, _)| *name == op)
            .map(|(_, fields)| *fields)
            .ok_or_else(|| anyhow!("step {i}: unknown operation {op:?}"))?;
        for key in step.keys() {
            ensure!(
                key == "op" || key == "expect" || fields.contains(&key.as_str()),
                "step {i}: unknown field {key} of {op}"
            );
        }
        if let Some(expect) = step.get("expect") {
            let expect = expect
                .as_object()
                .ok_or_else(|| anyhow!("step {i}: expect is not an object"))?;
            for key in expect.keys() {
                ensure!(
                    ERROR_FIELDS.contains(&key.as_str()),
                    "step {i}: unknown expect field {key}"
                );
            }
            let kind = expect.get("error").and_then(Value::as_str).unwrap_or("");
            ensure!(
                ERROR_KINDS.contains(&kind),
                "step {i}: unknown error kind {kind:?}"
            );
        }
        if let Some(snapshot) = step.get("snapshot").and_then(Value::as_object) {
            for key in snapshot.keys() {
                ensure!(
                    SNAPSHOT_FIELDS.contains(&key.as_str()),
                    "step {i}: unknown snapshot field {key}"
                );
            }
        }
    }
    Ok(scenario)
}

/// A value of the scenario format as bytes.
fn bytes(spec: &Value) -> Result<Vec<u8>> {
    if let Some(text) = spec.as_str() {
        return Ok(text.as_bytes().to_vec());
    }
    let int = |key: &str| spec.get(key).and_then(Value::as_u64);
    if let Some(hex) = spec.get("hex").and_then(Value::as_str) {
        ensure!(hex.len() % 2 == 0, "odd hex {hex}");
        return (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(Into::into))
            .collect();
    }
    if let (Some(byte), Some(len)) = (int("byte"), int("len")) {
        return Ok(vec![byte as u8; len as usize]);
    }
    if let (Some(pattern), Some(len)) = (int("pattern"), int("len")) {
        return Ok((0..len)
            .map(|j| ((pattern * 31 + j * 7) % 256) as u8)
            .collect());
    }
    bail!("not a value: {spec}")
}

/// A persist: pending, or completed.
enum Persisted {
    Pending(PersistFuture),
    Done(SnapshotResult),
}

struct Run {
    storage: Option<ChangelogStorage>,
    store: Arc<FaultStore>,
    config: Config,
    writers: HashMap<String, Writer>,
    persists: HashMap<String, Persisted>,
    saved: HashMap<String, u64>,
}

fn field<'a>(step: &'a Map<String, Value>, key: &str) -> Result<&'a Value> {
    step.get(key).ok_or_else(|| anyhow!("missing field {key}"))
}

fn str_field<'a>(step: &'a Map<String, Value>, key: &str) -> Result<&'a str> {
    field(step, key)?
        .as_str()
        .ok_or_else(|| anyhow!("{key} is not a string"))
}

fn int_field(step: &Map<String, Value>, key: &str) -> Result<i64> {
    field(step, key)?
        .as_i64()
        .ok_or_else(|| anyhow!("{key} is not an integer"))
}

/// A failed call, as the scenario format names it: (kind, detail, display).
fn describe_error(error: &Error) -> (String, String, String) {
    let display = error.to_string();
    let (kind, detail) = match error {
        Error::Writer { source, .. } => (source.kind(), error.writer_detail().unwrap()),
        Error::Upload { .. } => ("upload-failed", error.writer_detail().unwrap()),
        Error::Trapped { cause, .. } => ("trapped", cause.clone()),
        Error::InvalidArgument(m) => ("host-invalid-argument", m.clone()),
        Error::StorageClosed { .. } => ("storage-closed", error.to_string()),
        other => return ("other".into(), other.to_string(), display),
    };
    (kind.to_string(), detail, display)
}

fn texts(value: Option<&Value>) -> Vec<String> {
    match value {
        None => vec![],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        Some(v) => v.as_str().map(String::from).into_iter().collect(),
    }
}

/// `value` with `{file}` in every text replaced by `file`.
fn with_file(value: &Value, file: &str) -> Value {
    match value {
        Value::String(text) => Value::String(text.replace("{file}", file)),
        Value::Array(items) => Value::Array(items.iter().map(|v| with_file(v, file)).collect()),
        other => other.clone(),
    }
}

/// Checks a failure, described as (kind, detail, display), against `expect`; `{file}` in
/// an expected text stands for `file`.
fn check_error(
    (kind, detail, display): (String, String, String),
    expect: &Map<String, Value>,
    file: Option<&str>,
) -> Result<()> {
    let expect: Map<String, Value> = expect
        .iter()
        .map(|(key, value)| {
            (
                key.clone(),
                file.map_or_else(|| value.clone(), |f| with_file(value, f)),
            )
        })
        .collect();
    let want = expect["error"].as_str().unwrap();
    ensure!(
        kind == want,
        "expected a {want} error, got {kind}: {display}"
    );
    if let Some(message) = expect.get("message").and_then(Value::as_str) {
        ensure!(
            detail == message,
            "message {detail:?} differs from {message:?}"
        );
    }
    for text in texts(expect.get("contains")) {
        ensure!(
            detail.contains(&text),
            "{detail:?} does not contain {text:?}"
        );
    }
    if let Some(start) = expect.get("starts_with").and_then(Value::as_str) {
        ensure!(
            detail.starts_with(start),
            "{detail:?} does not start with {start:?}"
        );
    }
    if let Some(start) = expect.get("display_starts_with").and_then(Value::as_str) {
        ensure!(
            display.starts_with(start),
            "{display:?} does not start with {start:?}"
        );
    }
    Ok(())
}

/// Why a step failed: the host reported an error (a call's, or a read's), or an
/// expectation did not hold.
enum StepError {
    Host(Error),
    Read(dstl::ReadError),
    Check(anyhow::Error),
}

impl StepError {
    /// A host's failure as the scenario format names it: (kind, detail, display).
    fn described(&self) -> Option<(String, String, String)> {
        match self {
            StepError::Host(e) => Some(describe_error(e)),
            StepError::Read(e) => Some(("read".into(), e.to_string(), e.to_string())),
            StepError::Check(_) => None,
        }
    }
}

/// `ensure!` for [`Run::step`]: a failed expectation, not a host error.
macro_rules! check {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(StepError::Check(anyhow!($($arg)+)));
        }
    };
}

impl From<Error> for StepError {
    fn from(e: Error) -> Self {
        StepError::Host(e)
    }
}

impl From<dstl::ReadError> for StepError {
    fn from(e: dstl::ReadError) -> Self {
        StepError::Read(e)
    }
}

impl From<anyhow::Error> for StepError {
    fn from(e: anyhow::Error) -> Self {
        StepError::Check(e)
    }
}

impl Run {
    fn storage(&self) -> Result<&ChangelogStorage> {
        self.storage
            .as_ref()
            .ok_or_else(|| anyhow!("the storage was closed"))
    }

    fn writer(&self, step: &Map<String, Value>) -> Result<&Writer> {
        let name = str_field(step, "writer")?;
        self.writers
            .get(name)
            .ok_or_else(|| anyhow!("unknown writer {name}"))
    }

    fn number(&self, step: &Map<String, Value>, key: &str) -> Result<u64> {
        let value = field(step, key)?;
        match value {
            Value::String(s) if s == "max_u64" => Ok(u64::MAX),
            Value::String(s) if s == "max_i64" => Ok(i64::MAX as u64),
            Value::String(s) if s.starts_with('$') => self
                .saved
                .get(&s[1..])
                .copied()
                .ok_or_else(|| anyhow!("no saved value {s}")),
            v => v
                .as_u64()
                .ok_or_else(|| anyhow!("{key} is not a number: {v}")),
        }
    }

    fn checkpoint(&self, step: &Map<String, Value>) -> Result<i64> {
        match field(step, "checkpoint")? {
            Value::String(s) if s == "max_i64" => Ok(i64::MAX),
            v => v
                .as_i64()
                .ok_or_else(|| anyhow!("checkpoint is not an integer: {v}")),
        }
    }

    fn snapshot(&self, name: &str) -> Result<&SnapshotResult> {
        match self.persists.get(name) {
            Some(Persisted::Done(snapshot)) => Ok(snapshot),
            _ => bail!("persist {name} has not completed successfully"),
        }
    }

    fn read(&self, handle: &dstl::ChangelogHandle) -> Result<Vec<(i32, Vec<u8>)>> {
        Ok(read_changes(self.storage()?, handle)?)
    }

    fn step(&mut self, step: &Map<String, Value>) -> Result<(), StepError> {
        let op = step["op"].as_str().unwrap();
        match op {
            "create" => {
                let name = step
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or(str_field(step, "writer")?);
                let (start, end) = match step.get("key_groups") {
                    Some(range) => (
                        range[0].as_i64().unwrap_or(-1) as i32,
                        range[1].as_i64().unwrap_or(-1) as i32,
                    ),
                    None => (0, 127),
                };
                let mut options = WriterOptions::new();
                if let Some(v) = step.get("memory_limit") {
                    options = options.memory_limit(
                        dstl::config::parse_memory(v.as_str().unwrap_or(""))
                            .ok_or_else(|| anyhow!("bad memory_limit {v}"))?,
                    );
                }
                if let Some(v) = step.get("call_timeout") {
                    options = options.call_timeout(
                        dstl::config::parse_duration(v.as_str().unwrap_or(""))
                            .ok_or_else(|| anyhow!("bad call_timeout {v}"))?,
                    );
                }
                let writer = self.storage()?.create_writer_with(
                    name,
                    KeyGroupRange { start, end },
                    options,
                )?;
                self.writers
                    .insert(str_field(step, "writer")?.to_string(), writer);
            }
            "append" => {
                let key_group = int_field(step, "key_group")? as i32;
                let value = bytes(field(step, "value")?)?;
                self.writer(step)?.append(key_group, &value)?;
            }
            "append_meta" => {
                let value = bytes(field(step, "value")?)?;
                self.writer(step)?.append_meta(&value)?;
            }
            "append_batch" => {
                let (key_groups, lengths, data) = if let Some(repeat) = step.get("repeat") {
                    let get = |k: &str| {
                        repeat
                            .get(k)
                            .and_then(Value::as_i64)
                            .ok_or_else(|| anyhow!("repeat.{k} missing"))
                    };
                    let count = get("count")? as usize;
                    let length = get("length")? as usize;
                    (
                        vec![get("key_group")? as i32; count],
                        vec![length as u32; count],
                        vec![get("byte")? as u8; count * length],
                    )
                } else {
                    let ints = |k: &str| -> Result<Vec<i64>> {
                        field(step, k)?
                            .as_array()
                            .ok_or_else(|| anyhow!("{k} is not a list"))?
                            .iter()
                            .map(|v| v.as_i64().ok_or_else(|| anyhow!("{k}: {v}")))
                            .collect()
                    };
                    (
                        ints("key_groups")?.into_iter().map(|v| v as i32).collect(),
                        ints("lengths")?.into_iter().map(|v| v as u32).collect(),
                        bytes(field(step, "data")?)?,
                    )
                };
                self.writer(step)?
                    .append_batch(&key_groups, &lengths, &data)?;
            }
            "next_sequence_number" | "initial_sequence_number" => {
                let writer = self.writer(step)?;
                let value = if op == "next_sequence_number" {
                    writer.next_sequence_number()?
                } else {
                    writer.initial_sequence_number()?
                };
                if let Some(want) = step.get("value").and_then(Value::as_u64) {
                    check!(value == want, "sequence number {value}, expected {want}");
                }
                if let Some(name) = step.get("save").and_then(Value::as_str) {
                    self.saved.insert(name.to_string(), value);
                }
            }
            "persist" => {
                let from = self.number(step, "from")?;
                let checkpoint = self.checkpoint(step)?;
                let future = self.writer(step)?.persist(from, checkpoint)?;
                if let Some(want) = step.get("immediate").and_then(Value::as_bool) {
                    check!(
                        future.is_immediate() == want,
                        "immediate is {}, expected {want}",
                        future.is_immediate()
                    );
                }
                self.persists.insert(
                    str_field(step, "as")?.to_string(),
                    Persisted::Pending(future),
                );
            }
            "await" => {
                let name = str_field(step, "persist")?;
                let future = match self.persists.remove(name) {
                    Some(Persisted::Pending(future)) => future,
                    Some(done @ Persisted::Done(_)) => {
                        self.persists.insert(name.to_string(), done);
                        Err(anyhow!("persist {name} was awaited already"))?
                    }
                    None => Err(anyhow!("unknown persist {name}"))?,
                };
                let snapshot = future.wait()?;
                self.persists
                    .insert(name.to_string(), Persisted::Done(snapshot));
                if let Some(expect) = step.get("snapshot").and_then(Value::as_object) {
                    self.check_snapshot(name, expect)?;
                }
            }
            "truncate" => {
                let to = self.number(step, "to")?;
                self.writer(step)?.truncate(to)?;
            }
            "confirm" | "reset" => {
                let from = self.number(step, "from")?;
                let to = self.number(step, "to")?;
                let checkpoint = self.checkpoint(step)?;
                let writer = self.writer(step)?;
                if op == "confirm" {
                    writer.confirm(from, to, checkpoint)?;
                } else {
                    writer.reset(from, to, checkpoint)?;
                }
            }
            "truncate_and_close" => {
                let from = self.number(step, "from")?;
                self.writer(step)?.truncate_and_close(from)?;
            }
            "close" => self.writer(step)?.close()?,
            "drop" => {
                let name = str_field(step, "writer")?;
                self.writers
                    .remove(name)
                    .ok_or_else(|| anyhow!("unknown writer {name}"))?;
            }
            "failure" => {
                let failure = self
                    .writer(step)?
                    .failure()
                    .ok_or_else(|| anyhow!("the writer has not failed"))?;
                for text in texts(step.get("contains")) {
                    check!(failure.contains(&text), "{failure} does not contain {text}");
                }
            }
            "fail_uploads" | "hang_uploads" => {
                let times = int_field(step, "times")?;
                let fault = if op == "fail_uploads" {
                    Fault::Fail
                } else {
                    self.store.close_gate();
                    Fault::Hang
                };
                self.store.plan((0..times).map(|_| fault.clone()));
            }
            "release_uploads" => self.store.open_gate(),
            "break_store" => self.store.set_broken(true),
            "repair_store" => self.store.set_broken(false),
            // Kept, closed: later creates must fail by the storage's own check.
            "close_storage" => self.storage()?.close(),
            "idle" => self.storage()?.wait_idle(),
            "check" => self.check(step)?,
            "flag_byte" => {
                let snapshot = self.snapshot(str_field(step, "persist")?)?;
                let file = std::fs::read(&snapshot.remote.entries[0].handle.path)
                    .context("reading the snapshot's file")?;
                let want = int_field(step, "value")?;
                check!(
                    i64::from(file[0]) == want,
                    "flag byte {}, expected {want}",
                    file[0]
                );
            }
            "damage_file" => {
                let path = self.first_file(str_field(step, "persist")?)?;
                if step.get("remove").and_then(Value::as_bool) == Some(true) {
                    std::fs::remove_file(&path).context("removing the file")?;
                } else if let Some(len) = step.get("truncate_to").and_then(Value::as_u64) {
                    let file = std::fs::OpenOptions::new().write(true).open(&path);
                    file.and_then(|f| f.set_len(len))
                        .context("truncating the file")?;
                } else if let Some(overwrite) = step.get("overwrite") {
                    let at = overwrite["at"]
                        .as_u64()
                        .ok_or_else(|| anyhow!("overwrite.at"))?;
                    let mut bytes = std::fs::read(&path).context("reading the file")?;
                    let value = self::bytes(&overwrite["value"])?;
                    let range = usize::try_from(at)
                        .ok()
                        .and_then(|at| Some(at..at.checked_add(value.len())?))
                        .filter(|range| range.end <= bytes.len())
                        .ok_or_else(|| anyhow!("overwrite at {at} runs past the file's end"))?;
                    bytes[range].copy_from_slice(&value);
                    std::fs::write(&path, bytes).context("writing the file")?;
                } else {
                    Err(anyhow!(
                        "damage_file needs remove, truncate_to or overwrite"
                    ))?;
                }
            }
            "read" => {
                let snapshot = self.snapshot(str_field(step, "persist")?)?;
                self.storage()?.read(&snapshot.remote)?;
            }
            other => Err(anyhow!("unknown operation {other}"))?,
        }
        Ok(())
    }

    /// The first remote file of a completed persist.
    fn first_file(&self, persist: &str) -> Result<String> {
        let snapshot = self.snapshot(persist)?;
        let entry = snapshot.remote.entries.first();
        Ok(entry
            .ok_or_else(|| anyhow!("persist {persist} has no file"))?
            .handle
            .path
            .clone())
    }

    fn check_snapshot(&self, name: &str, expect: &Map<String, Value>) -> Result<()> {
        let snapshot = self.snapshot(name)?;
        let remote = &snapshot.remote;
        expect_u64(expect, "entries", remote.entries.len() as u64, "entries")?;
        expect_u64(expect, "state_size", remote.state_size, "state size")?;
        expect_u64(
            expect,
            "incremental_size",
            remote.incremental_size,
            "incremental size",
        )?;
        if let Some(want) = expect.get("storage_id").and_then(Value::as_str) {
            ensure!(
                remote.storage_id == want,
                "storage id {}",
                remote.storage_id
            );
        }
        if let Some(range) = expect.get("key_group_range") {
            let got = [remote.key_group_range.start, remote.key_group_range.end];
            ensure!(
                range[0].as_i64() == Some(got[0] as i64)
                    && range[1].as_i64() == Some(got[1] as i64),
                "key-group range {got:?}, expected {range}"
            );
        }
        if let Some(want) = expect.get("local_entries") {
            let got = snapshot.local.as_ref().map(|l| l.entries.len() as u64);
            ensure!(
                got == want.as_u64(),
                "local entries {got:?}, expected {want}"
            );
        }
        let changes = |spec: &Value| -> Result<Vec<(i32, Vec<u8>)>> {
            spec.as_array()
                .ok_or_else(|| anyhow!("changes is not a list"))?
                .iter()
                .map(|c| {
                    Ok((
                        c[0].as_i64().ok_or_else(|| anyhow!("key group"))? as i32,
                        bytes(&c[1])?,
                    ))
                })
                .collect()
        };
        if let Some(spec) = expect.get("changes") {
            let got = self.read(remote)?;
            ensure!(
                got == changes(spec)?,
                "read back {} changes that differ from the expected {}: {:?}",
                got.len(),
                spec.as_array().map_or(0, Vec::len),
                got.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
            );
        }
        if let Some(spec) = expect.get("local_changes") {
            let local = snapshot
                .local
                .as_ref()
                .ok_or_else(|| anyhow!("no local handle"))?;
            ensure!(self.read(local)? == changes(spec)?, "local changes differ");
        }
        if let Some(other) = expect.get("same_entries_as").and_then(Value::as_str) {
            ensure!(
                remote.entries == self.snapshot(other)?.remote.entries,
                "entries differ from {other}'s"
            );
        }
        let mut files: BTreeSet<&str> = remote
            .entries
            .iter()
            .map(|e| e.handle.path.as_str())
            .collect();
        expect_u64(
            expect,
            "distinct_files",
            files.len() as u64,
            "distinct files",
        )?;
        if let Some(other) = expect.get("same_file").and_then(Value::as_str) {
            files.extend(
                self.snapshot(other)?
                    .remote
                    .entries
                    .iter()
                    .map(|e| e.handle.path.as_str()),
            );
            ensure!(
                files.len() == 1,
                "not one file for both snapshots: {files:?}"
            );
        }
        Ok(())
    }

    fn check(&self, step: &Map<String, Value>) -> Result<()> {
        let storage = self.storage()?;
        storage.wait_idle();
        let metrics = storage.metrics();
        let uint = |key: &str| step.get(key).and_then(Value::as_u64);
        expect_u64(step, "uploads", metrics.upload_requests, "upload attempts")?;
        expect_u64(
            step,
            "upload_failures",
            metrics.upload_failures,
            "failed attempts",
        )?;
        let files = path_strings(&changelog_files(&self.config.job_dir()));
        let what = format!("files in the job directory {files:?}");
        expect_u64(step, "files", files.len() as u64, &what)?;
        if let Some(names) = step.get("files_are").and_then(Value::as_array) {
            let mut expected = BTreeSet::new();
            for name in names {
                let name = name.as_str().ok_or_else(|| anyhow!("files_are: {name}"))?;
                expected.extend(
                    self.snapshot(name)?
                        .remote
                        .entries
                        .iter()
                        .map(|e| e.handle.path.clone()),
                );
            }
            let expected: Vec<String> = expected.into_iter().collect();
            ensure!(
                files == expected,
                "the job directory holds {files:?}, expected {expected:?}"
            );
        }
        for (key, exist) in [("exist", true), ("gone", false)] {
            for name in step
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = name.as_str().ok_or_else(|| anyhow!("{key}: {name}"))?;
                for path in snapshot_paths(self.snapshot(name)?) {
                    ensure!(
                        Path::new(&path).exists() == exist,
                        "{path} of {name}: exists is {}",
                        !exist
                    );
                }
            }
        }
        if let Some(want) = uint("tracked") {
            let tracked = storage.task_registry().tracked() as u64;
            ensure!(tracked == want, "{tracked} tracked files, expected {want}");
        }
        if let Some(want) = uint("local_files") {
            let local = path_strings(&changelog_files(&self.config.local_copies_dir()));
            ensure!(
                local.len() as u64 == want,
                "{} local copies, expected {want}: {local:?}",
                local.len()
            );
        }
        Ok(())
    }
}

/// If `expect` has a number at `key`, `actual` (`what` names it in the error) is that
/// number.
fn expect_u64(expect: &Map<String, Value>, key: &str, actual: u64, what: &str) -> Result<()> {
    if let Some(want) = expect.get(key).and_then(Value::as_u64) {
        ensure!(actual == want, "{what}: {actual}, expected {want}");
    }
    Ok(())
}

fn run(scenario: &Map<String, Value>) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let mut config = dstl_tests::harness::config(
        tmp.path(),
        &[
            &format!("dstl.job-id={JOB_ID}"),
            "dstl.writer.max-writers=16",
        ],
    );
    for (key, value) in scenario
        .get("config")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let value = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        config.set(key, &value)?;
    }
    let store = FaultStore::new(&config.job_dir());
    let storage = ChangelogStorage::builder(config.clone())
        .store(store.clone())
        .open()?;
    let mut run = Run {
        storage: Some(storage),
        store,
        config,
        writers: HashMap::new(),
        persists: HashMap::new(),
        saved: HashMap::new(),
    };
    let steps = scenario["steps"].as_array().unwrap();
    let outcome = (|| {
        for (i, step) in steps.iter().enumerate() {
            let step = step.as_object().unwrap();
            let op = step["op"].as_str().unwrap();
            let context = || format!("step {i} ({op})");
            let result = run.step(step);
            let file = step
                .get("persist")
                .and_then(Value::as_str)
                .and_then(|persist| run.first_file(persist).ok());
            match (step.get("expect").and_then(Value::as_object), result) {
                (None, Ok(())) => {}
                (_, Err(StepError::Check(e))) => return Err(e.context(context())),
                (None, Err(e)) => bail!(
                    "{}: unexpected error: {}",
                    context(),
                    e.described().unwrap_or_default().2
                ),
                (Some(expect), Ok(())) => bail!(
                    "{}: expected a {} error, but it succeeded",
                    context(),
                    expect["error"]
                ),
                (Some(expect), Err(e)) => {
                    let described = e.described().unwrap_or_default();
                    check_error(described, expect, file.as_deref()).with_context(context)?
                }
            }
        }
        Ok(())
    })();
    // Let hung creations finish before the storage shuts down.
    run.store.open_gate();
    run.writers.clear();
    drop(run.storage.take());
    outcome
}

#[test]
fn shared_scenarios() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(scenario_dir())
        .expect("tests/scenarios exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "only {} scenario files", files.len());
    let mut failures = Vec::new();
    let (mut passed, mut skipped) = (0, 0);
    for path in &files {
        let scenario = match load(path) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{}: {e:#}", path.display()));
                continue;
            }
        };
        let name = scenario["name"].as_str().unwrap().to_string();
        let hosts = scenario["hosts"].as_array().unwrap();
        if !hosts.iter().any(|h| h == "rust") {
            skipped += 1;
            println!(
                "scenario {name} ... skipped: not for the wasmtime host: {}",
                scenario["only_because"].as_str().unwrap_or("")
            );
            continue;
        }
        let started = std::time::Instant::now();
        match run(&scenario) {
            Ok(()) => {
                passed += 1;
                println!(
                    "scenario {name} ... ok ({} ms)",
                    started.elapsed().as_millis()
                );
            }
            Err(e) => {
                println!("scenario {name} ... FAILED");
                failures.push(format!("{name}: {e:#}"));
            }
        }
    }
    println!(
        "shared scenarios: {passed} passed, {} failed, {skipped} skipped",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "failed scenarios:\n{}",
        failures.join("\n")
    );
}
