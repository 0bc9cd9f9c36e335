//! The driver: random parameters per seed, the operations a driver calls on its writers
//! (checking every answer against the model), sync points, and running a seed with one
//! driver or with several on their own threads.

use std::collections::{HashSet, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dstl::{ChangelogStorage, Error, KeyGroupRange, PersistFuture, Writer, WriterError};
use dstl_tests::fault_store::{FaultOptions, FaultStore, RandomFaults};
use dstl_tests::harness::{open_with_store, path_strings};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checks::{self, Copies, FinalCounts, check_content, check_files};
use crate::model::{
    Fate, Holding, Model, PersistRecord, PersistState, Snap, TAG_LEN, Upload, file_name, index_file,
};

/// Operations remembered for the failure message.
const TRACE_LEN: usize = 60;

/// The last operations of a seed, for the failure message.
pub type Trace = Arc<Mutex<VecDeque<String>>>;

#[derive(Debug, Clone)]
pub struct Params {
    pub writers: usize,
    pub steps: usize,
    pub threshold: u64,
    pub conf: Vec<String>,
    pub fail_p: f64,
    pub delay_p: f64,
    pub max_delay_us: u64,
    /// Attempts time out while creates are still running.
    pub speculative: bool,
    /// Every upload also writes a local copy; snapshots carry local handles.
    pub local_recovery: bool,
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

impl Params {
    pub fn random(rng: &mut ChaCha8Rng) -> Self {
        let threshold = *pick(rng, &[0u64, 40, 120, 400, 1500, 5 << 20]);
        let delay = *pick(rng, &["0", "0", "1ms", "3ms"]);
        let size_threshold = *pick(rng, &["0", "200b", "2kb", "10mb"]);
        // A small in-flight limit makes appends and persists wait for completions.
        let (max_in_flight, size_threshold) = match rng.random_range(0..4) {
            0 => (
                "2kb",
                if size_threshold == "10mb" {
                    "2kb"
                } else {
                    size_threshold
                },
            ),
            _ => ("100mb", size_threshold),
        };
        let attempts = rng.random_range(1..=3u32);
        let policy = if rng.random_bool(0.15) {
            "none"
        } else {
            "fixed"
        };
        let timeout = *pick(rng, &["0", "0", "30 s"]);
        let threads = *pick(rng, &[1u32, 2, 5]);
        let compression = rng.random_bool(0.4);
        let conf = vec![
            format!("dstl.dfs.preemptive-persist-threshold={threshold}b"),
            format!("dstl.dfs.batch.persist-delay={delay}"),
            format!("dstl.dfs.batch.persist-size-threshold={size_threshold}"),
            format!("dstl.dfs.upload.max-attempts={attempts}"),
            format!("dstl.dfs.upload.retry-policy={policy}"),
            format!("dstl.dfs.upload.timeout={timeout}"),
            "dstl.dfs.upload.next-attempt-delay=0".to_string(),
            format!("dstl.dfs.upload.num-threads={threads}"),
            format!("dstl.dfs.upload.max-in-flight={max_in_flight}"),
            format!("dstl.dfs.compression.enabled={compression}"),
            "dstl.writer.max-writers=16".to_string(),
            "dstl.writer.memory-limit=32mb".to_string(),
        ];
        let mut params = Self {
            writers: rng.random_range(2..=4),
            steps: rng.random_range(100..=280),
            threshold,
            conf,
            fail_p: *pick(rng, &[0.0, 0.05, 0.2, 0.5]),
            delay_p: *pick(rng, &[0.0, 0.3, 0.8]),
            max_delay_us: rng.random_range(0..=2_000),
            speculative: false,
            local_recovery: false,
        };
        // Some seeds time attempts out after a millisecond or two while creates take up
        // to 4 ms: attempts overtake each other and losers' files must be deleted.
        if rng.random_bool(0.25) {
            params.speculative = true;
            params.delay_p = 0.85;
            params.max_delay_us = 4_000;
            params.conf.extend([
                format!("dstl.dfs.upload.timeout={}ms", rng.random_range(1..=2)),
                format!("dstl.dfs.upload.max-attempts={}", rng.random_range(2..=4)),
                "dstl.dfs.upload.retry-policy=fixed".to_string(),
            ]);
        }
        // Some seeds keep local copies; their writers share batches (a delay and a size
        // threshold gather tasks of several writers), so one local copy holds change
        // sets of several writers, each claiming it on its own.
        if rng.random_bool(0.3) {
            params.local_recovery = true;
            let delay = *pick(rng, &["1ms", "2ms", "3ms"]);
            let size_threshold = if max_in_flight == "2kb" {
                "2kb"
            } else {
                *pick(rng, &["2kb", "10mb"])
            };
            params.conf.extend([
                "dstl.local-recovery.enabled=true".to_string(),
                format!("dstl.dfs.batch.persist-delay={delay}"),
                format!("dstl.dfs.batch.persist-size-threshold={size_threshold}"),
            ]);
        }
        params
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub ops: u64,
    pub persists_ok: u64,
    pub persists_failed: u64,
    pub already_failed: u64,
    pub confirms: u64,
    /// Confirms and resets of closed writers (they succeed).
    pub after_close: u64,
    pub syncs: u64,
    pub files: u64,
    pub creates: u64,
    pub injected_failures: u64,
    pub closes: u64,
    /// Files left at the end that a closed writer kept (no confirmed checkpoint owns them).
    pub abandoned_files: u64,
    /// Change sets a close left to the host: released (no returned snapshot named their
    /// file), kept (one did), or either (the model could not learn which).
    pub released_at_close: u64,
    pub kept_at_close: u64,
    pub unknown_fates: u64,
    /// Files of attempts that lost to a faster one (deleted again).
    pub late_files: u64,
    pub local_seeds: u64,
    /// Snapshots with a local handle (read back through it).
    pub local_snapshots: u64,
    /// Snapshots without one under local recovery (a change set lost its copy).
    pub local_none: u64,
    /// Local copies a writer had to claim, summed over the sync points.
    pub required_local: u64,
    /// Local copies holding change sets of several writers, summed over the sync points.
    pub shared_local: u64,
    pub local_left: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.ops += o.ops;
        self.persists_ok += o.persists_ok;
        self.persists_failed += o.persists_failed;
        self.already_failed += o.already_failed;
        self.confirms += o.confirms;
        self.after_close += o.after_close;
        self.syncs += o.syncs;
        self.files += o.files;
        self.creates += o.creates;
        self.injected_failures += o.injected_failures;
        self.closes += o.closes;
        self.abandoned_files += o.abandoned_files;
        self.released_at_close += o.released_at_close;
        self.kept_at_close += o.kept_at_close;
        self.unknown_fates += o.unknown_fates;
        self.late_files += o.late_files;
        self.local_seeds += o.local_seeds;
        self.local_snapshots += o.local_snapshots;
        self.local_none += o.local_none;
        self.required_local += o.required_local;
        self.shared_local += o.shared_local;
        self.local_left += o.local_left;
    }

    fn add_counts(&mut self, counts: checks::FileCounts) {
        self.required_local += counts.required_local;
        self.shared_local += counts.shared_local;
    }

    fn add_final(&mut self, counts: FinalCounts) {
        self.abandoned_files = counts.abandoned;
        self.late_files = counts.late;
        self.local_left = counts.local_left;
    }
}

fn writer_error(result: &Result<impl Sized, Error>) -> Option<&WriterError> {
    match result {
        Err(Error::Writer { source, .. }) => Some(source),
        _ => None,
    }
}

fn describe<T>(result: &Result<T, Error>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("error: {e}"),
    }
}

fn expect_closed<T>(result: &Result<T, Error>, what: &str) {
    assert!(
        matches!(writer_error(result), Some(WriterError::Closed(_))),
        "{what} on a closed writer: expected a Closed error, got {}",
        describe(result)
    );
}

/// `result` is a writer error that `expected` accepts; `what` names the call and why it
/// must fail.
fn expect_rejected<T>(result: &Result<T, Error>, expected: fn(&WriterError) -> bool, what: &str) {
    assert!(
        writer_error(result).is_some_and(expected),
        "{what}: {}",
        describe(result)
    );
}

/// A persist whose future the driver still holds.
struct Pending {
    /// Index into the writer's `persists`.
    persist: usize,
    future: PersistFuture,
    /// The writer was closed (or dropped) after this persist started.
    closed_since: bool,
    /// `persist` answered at once.
    immediate: bool,
}

/// One driver: its writers, and the model of them. A seed runs one driver (with random
/// sync points), or several on their own threads that sync together.
pub struct Sim {
    rng: ChaCha8Rng,
    params: Params,
    /// Alone: the driver syncs at random points itself.
    solo: bool,
    /// Open writers this driver keeps (it creates new ones when closes leave fewer).
    min_open: usize,
    /// Writers this driver creates at most.
    max_writers: usize,
    pub model: Model,
    /// `None` once the handle was dropped without closing.
    handles: Vec<Option<Writer>>,
    pending: Vec<Vec<Pending>>,
    trace: Trace,
    pub stats: Stats,
    /// Local copies compared with their remote files (alone; drivers that sync together
    /// share one).
    copies: Copies,
    store: Arc<FaultStore>,
    storage: Arc<ChangelogStorage>,
}

impl Sim {
    fn new(
        rng: ChaCha8Rng,
        params: &Params,
        id_base: u16,
        solo: bool,
        trace: &Trace,
        store: &Arc<FaultStore>,
        storage: &Arc<ChangelogStorage>,
    ) -> Self {
        Self {
            rng,
            params: params.clone(),
            solo,
            min_open: if solo { 2 } else { 1 },
            max_writers: if solo { 10 } else { 5 },
            model: Model::new(id_base, params.threshold, params.local_recovery),
            handles: Vec::new(),
            pending: Vec::new(),
            trace: trace.clone(),
            stats: Stats {
                local_seeds: u64::from(params.local_recovery && solo),
                ..Stats::default()
            },
            copies: Copies::default(),
            store: store.clone(),
            storage: storage.clone(),
        }
    }

    fn log(&self, line: String) {
        let mut trace = self.trace.lock().unwrap();
        if trace.len() == TRACE_LEN {
            trace.pop_front();
        }
        trace.push_back(line);
    }

    /// Logs writer `i`'s `call` (with its arguments) and its result. A call on a closed
    /// writer must have failed as closed (`what` names the call then): returns whether
    /// the writer is closed, when there is nothing more to check.
    fn logged_closed<T>(
        &self,
        i: usize,
        call: &str,
        result: &Result<T, Error>,
        what: &str,
    ) -> bool {
        self.log(format!("{} {call} -> {}", self.name(i), describe(result)));
        let closed = self.closed(i);
        if closed {
            expect_closed(result, what);
        }
        closed
    }

    fn handle(&self, i: usize) -> &Writer {
        self.handles[i].as_ref().expect("writer handle dropped")
    }

    fn name(&self, i: usize) -> String {
        self.model.writers[i].name.clone()
    }

    fn closed(&self, i: usize) -> bool {
        self.model.writers[i].closed
    }

    fn add_writer(&mut self) {
        let start = self.rng.random_range(0..20);
        let range = KeyGroupRange {
            start,
            end: start + self.rng.random_range(0..12),
        };
        let name = self.model.next_name();
        let handle = self.storage.create_writer(&name, range).unwrap();
        self.log(format!("create {name} {range:?}"));
        self.model.add_writer(handle.id(), range);
        self.handles.push(Some(handle));
        self.pending.push(Vec::new());
    }

    fn open_writers(&self) -> Vec<usize> {
        (0..self.model.writers.len())
            .filter(|&i| !self.closed(i))
            .collect()
    }

    /// A value for writer `i`'s change set `sqn`: tagged, or a short untagged one.
    fn value(&mut self, i: usize, sqn: u64, tagged: bool) -> Vec<u8> {
        if !tagged {
            let len = self.rng.random_range(0..TAG_LEN);
            return (0..len).map(|_| self.rng.random()).collect();
        }
        let w = &mut self.model.writers[i];
        w.counter += 1;
        let mut value = Vec::with_capacity(TAG_LEN + 64);
        value.extend_from_slice(&w.id.to_be_bytes());
        value.extend_from_slice(&(sqn as u32).to_be_bytes());
        value.extend_from_slice(&w.counter.to_be_bytes());
        let pad = if self.rng.random_bool(0.05) {
            self.rng.random_range(100..700)
        } else {
            self.rng.random_range(0..40)
        };
        value.extend((0..pad).map(|_| self.rng.random::<u8>()));
        value
    }

    fn random_key_group(&mut self, i: usize) -> i32 {
        let range = self.model.writers[i].range;
        self.rng.random_range(range.start..=range.end)
    }

    // ---- operations ----

    fn op_append(&mut self, i: usize, meta: bool) {
        let (sqn, tagged) = {
            let w = &self.model.writers[i];
            (w.active_sqn, w.active.is_empty())
        };
        let tagged = tagged || self.rng.random_bool(0.7);
        let key_group = if meta { -1 } else { self.random_key_group(i) };
        let value = self.value(i, sqn, tagged);
        let result = if meta {
            self.handle(i).append_meta(&value)
        } else {
            self.handle(i).append(key_group, &value)
        };
        if self.logged_closed(
            i,
            &format!("append kg={key_group} len={}", value.len()),
            &result,
            "append",
        ) {
            return;
        }
        let trigger = self.model.push_change(i, key_group, value);
        self.preemptive_outcome(i, trigger, result.err());
    }

    /// Checks the outcome of a call that may have triggered a pre-emptive persist.
    /// Returns false if the call failed (on that persist).
    fn preemptive_outcome(&mut self, i: usize, trigger: Option<u64>, error: Option<Error>) -> bool {
        let name = self.name(i);
        match (trigger, error) {
            (None, None) => true,
            (None, Some(e)) => panic!("{name}: append failed without a pre-emptive persist: {e}"),
            (Some(from), None) => {
                assert!(
                    !self.model.must_fail(i, from),
                    "{name}: the pre-emptive persist from {from} succeeded although an upload from there on failed"
                );
                self.model.schedule(i, from);
                true
            }
            (
                Some(from),
                Some(Error::Writer {
                    source: WriterError::AlreadyFailed(message),
                    ..
                }),
            ) => {
                self.model.learn_failure(i, from, &message);
                self.stats.already_failed += 1;
                false
            }
            (Some(from), Some(e)) => {
                panic!("{name}: append with a pre-emptive persist from {from} failed: {e}")
            }
        }
    }

    fn op_append_batch(&mut self, i: usize) {
        let n = self.rng.random_range(1..=8);
        let threshold = self.params.threshold;
        let (mut sqn, mut size, mut empty) = {
            let w = &self.model.writers[i];
            (w.active_sqn, w.active_size, w.active.is_empty())
        };
        let mut key_groups = Vec::new();
        let mut lengths = Vec::new();
        let mut values = Vec::new();
        for _ in 0..n {
            let tagged = empty || self.rng.random_bool(0.6);
            let key_group = if self.rng.random_bool(0.2) {
                -1
            } else {
                self.random_key_group(i)
            };
            let value = self.value(i, sqn, tagged);
            size += value.len() as u64;
            empty = false;
            if size >= threshold {
                sqn += 1;
                size = 0;
                empty = true;
            }
            key_groups.push(key_group);
            lengths.push(value.len() as u32);
            values.push(value);
        }
        let data: Vec<u8> = values.concat();
        let result = self.handle(i).append_batch(&key_groups, &lengths, &data);
        if self.logged_closed(
            i,
            &format!("append_batch kgs={key_groups:?} lens={lengths:?}"),
            &result,
            "append_batch",
        ) {
            return;
        }
        let mut error = result.err();
        for (key_group, value) in key_groups.into_iter().zip(values) {
            let trigger = self.model.push_change(i, key_group, value);
            if trigger.is_some() && !self.preemptive_outcome(i, trigger, error.take()) {
                return;
            }
        }
        if let Some(e) = error {
            panic!("{}: append_batch failed: {e}", self.name(i));
        }
    }

    fn op_invalid_append(&mut self, i: usize) {
        let range = self.model.writers[i].range;
        let which = self.rng.random_range(0..5);
        let w = self.handle(i);
        let (what, result) = match which {
            0 => ("below range", w.append(range.start - 1, b"0123456789x")),
            1 => ("above range", w.append(range.end + 1, b"0123456789x")),
            2 => ("meta key group", w.append(-1, b"0123456789x")),
            3 => (
                "batch lengths mismatch",
                w.append_batch(&[range.start], &[3], b"0123456789x"),
            ),
            _ => (
                "batch key group -2",
                w.append_batch(&[range.start, -2], &[10, 1], b"0123456789x"),
            ),
        };
        if self.logged_closed(i, &format!("invalid append ({what})"), &result, "append") {
            return;
        }
        expect_rejected(
            &result,
            |e| matches!(e, WriterError::InvalidArgument(_)),
            &format!(
                "{}: append ({what}) must fail with InvalidArgument",
                self.name(i)
            ),
        );
    }

    fn op_next_sequence_number(&mut self, i: usize) {
        let result = self.handle(i).next_sequence_number();
        self.log(format!(
            "{} next_sequence_number -> {result:?}",
            self.name(i)
        ));
        if !self.closed(i) {
            self.model.rollover(i);
        }
        let expected = self.model.writers[i].active_sqn;
        assert_eq!(
            result.unwrap(),
            expected,
            "{}: next_sequence_number",
            self.name(i)
        );
    }

    fn choose_from(&mut self, i: usize) -> u64 {
        let w = &self.model.writers[i];
        let (lowest, active) = (w.lowest, w.active_sqn);
        let confirmed_to = self.model.confirmed_of(i).map(|s| s.to).next_back();
        match self.rng.random_range(0..100) {
            0..45 => self.rng.random_range(lowest..=active),
            45..70 => lowest,
            70..80 => active,
            80..90 => confirmed_to.unwrap_or(lowest),
            90..94 => lowest.saturating_sub(1),
            94..98 => active + self.rng.random_range(1..3),
            _ => u64::MAX,
        }
    }

    fn op_persist(&mut self, i: usize) {
        let from = self.choose_from(i);
        let checkpoint = self.model.next_checkpoint;
        self.model.next_checkpoint += 1;
        let result = self.handle(i).persist(from, checkpoint);
        let name = self.name(i);
        let (lowest, active) = {
            let w = &self.model.writers[i];
            (w.lowest, w.active_sqn)
        };
        self.log(format!(
            "{name} persist from={from} cp={checkpoint} (lowest {lowest}, active {active}) -> {}",
            match &result {
                Ok(f) if f.is_immediate() => "ready".to_string(),
                Ok(_) => "pending".to_string(),
                Err(e) => format!("error: {e}"),
            }
        ));
        if self.closed(i) {
            return expect_closed(&result, "persist");
        }
        let future = match result {
            Err(Error::Writer {
                source: WriterError::AlreadyFailed(message),
                ..
            }) => {
                self.model.learn_failure(i, from, &message);
                self.stats.already_failed += 1;
                return;
            }
            Err(e) => {
                assert!(
                    !self.model.must_fail(i, from),
                    "{name}: persist from {from} must fail with AlreadyFailed, got {e}"
                );
                match e.writer_error() {
                    Some(WriterError::Truncated(_)) => {
                        assert!(lowest > from, "{name}: Truncated for {from}: {e}")
                    }
                    Some(WriterError::NotYetAppended(_)) => assert!(
                        lowest <= from && from > active,
                        "{name}: NotYetAppended for {from}: {e}"
                    ),
                    _ => panic!("{name}: persist from {from} failed: {e}"),
                }
                return;
            }
            Ok(future) => future,
        };
        assert!(
            !self.model.must_fail(i, from),
            "{name}: persist from {from} must fail with AlreadyFailed"
        );
        assert!(
            lowest <= from && from <= active,
            "{name}: persist from {from} accepted with lowest {lowest}, active {active}"
        );
        self.model.rollover(i);
        let w = &self.model.writers[i];
        let to = w.active_sqn;
        let all_ready = (from..to).all(|s| {
            let cs = &w.sets[&s];
            matches!(cs.upload, Upload::Done { .. }) && cs.holding == Holding::Held
        });
        let unscheduled = (from..to).any(|s| w.sets[&s].upload == Upload::NotScheduled);
        if future.is_immediate() {
            assert!(
                !unscheduled,
                "{name}: persist [{from}, {to}) is ready although a change set was never uploaded"
            );
        }
        if all_ready {
            assert!(
                future.is_immediate(),
                "{name}: persist [{from}, {to}) is pending although everything was uploaded"
            );
        }
        self.model.schedule(i, from);
        let clock = self.model.clock;
        let persists = &mut self.model.writers[i].persists;
        persists.push(PersistRecord {
            from,
            to,
            checkpoint,
            issued_at: clock,
            state: PersistState::Waiting,
            confirmed: false,
        });
        let pending = Pending {
            persist: persists.len() - 1,
            immediate: future.is_immediate(),
            future,
            closed_since: false,
        };
        if pending.immediate || self.rng.random_bool(0.55) {
            self.finish_persist(i, pending);
        } else {
            self.pending[i].push(pending);
            if self.pending[i].len() > 4 {
                let oldest = self.pending[i].remove(0);
                self.finish_persist(i, oldest);
            }
        }
    }

    fn op_wait(&mut self, i: usize) {
        if self.pending[i].is_empty() {
            return;
        }
        let n = self.rng.random_range(0..self.pending[i].len());
        let pending = self.pending[i].remove(n);
        if self.rng.random_bool(0.1) {
            // Nobody waits for it: the upload goes on and its results stay usable.
            let w = &mut self.model.writers[i];
            let p = &mut w.persists[pending.persist];
            p.state = PersistState::Dropped;
            let line = format!(
                "{} drop persist [{}, {}) cp={}",
                w.name, p.from, p.to, p.checkpoint
            );
            self.log(line);
            return;
        }
        self.finish_persist(i, pending);
    }

    /// Waits for a persist and checks its outcome against the model.
    fn finish_persist(&mut self, i: usize, pending: Pending) {
        let Pending {
            persist,
            future,
            closed_since,
            immediate,
        } = pending;
        let (from, to, checkpoint, issued_at) = {
            let p = &self.model.writers[i].persists[persist];
            (p.from, p.to, p.checkpoint, p.issued_at)
        };
        let outcome = future.wait();
        let name = self.name(i);
        self.log(format!(
            "{name} wait persist [{from}, {to}) cp={checkpoint} -> {}",
            describe(&outcome)
        ));
        let snapshot = match outcome {
            Ok(snapshot) => snapshot,
            Err(Error::Upload { .. }) => {
                let w = &mut self.model.writers[i];
                w.failed_ranges.push((from, to));
                w.persists[persist].state = PersistState::Failed;
                self.stats.persists_failed += 1;
                return;
            }
            Err(Error::Writer {
                source: WriterError::Closed(_),
                ..
            }) if closed_since => {
                self.model.writers[i].persists[persist].state = PersistState::Failed;
                self.stats.persists_failed += 1;
                return;
            }
            Err(e) => panic!("{name}: persist [{from}, {to}) cp={checkpoint} failed: {e}"),
        };
        self.stats.persists_ok += 1;
        let w = &self.model.writers[i];
        let remote = &snapshot.remote;
        if immediate {
            assert_eq!(
                remote.incremental_size, 0,
                "{name}: a ready persist uploaded nothing"
            );
        }
        assert_eq!(
            remote.entries.len() as u64,
            to - from,
            "{name}: snapshot [{from}, {to}) has one entry per change set"
        );
        assert_eq!(remote.key_group_range, w.range, "{name}: key-group range");
        assert_eq!(remote.storage_id, "filesystem");
        let mut state_size = 0;
        for (entry, sqn) in remote.entries.iter().zip(from..to) {
            let size = w.sets[&sqn].size;
            assert_eq!(entry.size, size, "{name}: size of change set {sqn}");
            state_size += size;
        }
        assert_eq!(remote.state_size, state_size, "{name}: state size");
        // Without a local handle under local recovery, a change set must have lost its
        // copy to a discard of this writer.
        if self.model.local_recovery {
            if snapshot.local.is_none() {
                assert!(
                    (from..to).any(|s| w.sets[&s].local_maybe_lost),
                    "{name}: snapshot [{from}, {to}) cp={checkpoint} has no local handle, although \
                     no discard of the writer can have dropped a copy of its change sets"
                );
                self.stats.local_none += 1;
            }
        } else {
            assert!(snapshot.local.is_none(), "{name}: no local recovery");
        }
        let discarded_since = w.discards.iter().any(|&(t, _)| t > issued_at);
        self.model.returned(i, persist, &snapshot);
        let fates = self.model.writer_fates(i);
        let sets = &self.model.writers[i].sets;
        let held = (from..to).all(|s| sets[&s].holding == Holding::Held);
        // Not released by the writer: held, or kept at a close (the snapshot named the
        // files before it).
        let claimed =
            (from..to).all(|s| matches!(sets[&s].holding, Holding::Held | Holding::AtClose));
        let kept = (from..to).all(|s| matches!(fates[&s], Fate::Held | Fate::Abandoned));
        check_content(
            &self.storage,
            &self.model,
            i,
            from,
            to,
            remote,
            "remote",
            kept,
        );
        if let Some(local) = &snapshot.local {
            self.check_local_handle(i, from, to, &snapshot);
            // The writer still claims the copies unless it released them or discarded
            // them since (maybe after the persist completed).
            check_content(
                &self.storage,
                &self.model,
                i,
                from,
                to,
                local,
                "local",
                claimed && !discarded_since,
            );
            self.stats.local_snapshots += 1;
        }
        if held || self.closed(i) {
            self.model.writers[i].completed.push((
                persist,
                Snap {
                    from,
                    to,
                    checkpoint,
                    snapshot,
                },
            ));
        }
    }

    /// A local handle mirrors the remote one: the same file names, offsets and sizes, in
    /// the local-copy directory.
    fn check_local_handle(&self, i: usize, from: u64, to: u64, snapshot: &dstl::SnapshotResult) {
        let name = self.name(i);
        let (remote, local) = (&snapshot.remote, snapshot.local.as_ref().unwrap());
        assert_eq!(
            local.entries.len(),
            remote.entries.len(),
            "{name}: local and remote handles of [{from}, {to}) differ in length"
        );
        let dir = checks::local_dir(&self.storage);
        for (l, r) in local.entries.iter().zip(&remote.entries) {
            assert!(
                file_name(&l.handle.path) == file_name(&r.handle.path)
                    && l.offset == r.offset
                    && l.size == r.size
                    && l.handle.file_size == r.handle.file_size,
                "{name}: local entry {l:?} does not mirror remote entry {r:?}"
            );
            assert!(
                std::path::Path::new(&l.handle.path).parent() == Some(dir.as_path()),
                "{name}: local copy {} is not in {}",
                l.handle.path,
                dir.display()
            );
        }
        assert_eq!(local.key_group_range, remote.key_group_range);
        assert_eq!(local.state_size, remote.state_size);
        assert_eq!(local.incremental_size, 0);
        assert_eq!(local.storage_id, remote.storage_id);
    }

    fn op_confirm(&mut self, i: usize) {
        let w = &self.model.writers[i];
        let (lowest, active) = (w.lowest, w.active_sqn);
        let closed = w.closed;
        let candidates: Vec<usize> = (0..w.completed.len())
            .filter(|&n| closed || w.completed[n].1.from >= lowest)
            .collect();
        if candidates.is_empty() || self.rng.random_bool(0.15) {
            let (from, to) = match self.rng.random_range(0..4) {
                0 => (active.max(1), active.max(1) - 1),
                1 => (lowest, active + 1),
                2 => (active + 1, active + 1),
                _ => (u64::MAX, u64::MAX),
            };
            let result = self.handle(i).confirm(from, to, 0);
            self.log(format!(
                "{} confirm [{from}, {to}) -> {}",
                self.name(i),
                describe(&result)
            ));
            expect_rejected(
                &result,
                |e| matches!(e, WriterError::InvalidRange(_)),
                &format!(
                    "{}: confirm [{from}, {to}) with active {active} must fail with InvalidRange",
                    self.name(i)
                ),
            );
            return;
        }
        let n = candidates[self.rng.random_range(0..candidates.len())];
        let (persist, snap) = self.model.writers[i].completed.remove(n);
        let result = self.handle(i).confirm(snap.from, snap.to, snap.checkpoint);
        self.log(format!(
            "{} confirm [{}, {}) cp={} -> {}",
            self.name(i),
            snap.from,
            snap.to,
            snap.checkpoint,
            describe(&result)
        ));
        result.unwrap_or_else(|e| panic!("{}: confirm failed: {e}", self.name(i)));
        // After close a confirm stops tracking nothing (the writer holds no results),
        // but still discards the writer's older local copies.
        self.model.discard(i, snap.checkpoint);
        if closed {
            self.stats.after_close += 1;
            return;
        }
        self.model.confirm(i, persist, snap);
        self.stats.confirms += 1;
    }

    fn op_reset(&mut self, i: usize) {
        let checkpoint = if self.rng.random_bool(0.2) {
            i64::MAX
        } else {
            self.model.next_checkpoint
        };
        let w = &self.model.writers[i];
        let result = self.handle(i).reset(w.lowest, w.active_sqn, checkpoint);
        self.log(format!(
            "{} reset cp={checkpoint} -> {}",
            self.name(i),
            describe(&result)
        ));
        result.unwrap_or_else(|e| panic!("{}: reset failed: {e}", self.name(i)));
        if self.closed(i) {
            self.stats.after_close += 1;
        }
        self.model.discard(i, checkpoint.saturating_add(1));
    }

    fn op_truncate(&mut self, i: usize) {
        let w = &self.model.writers[i];
        let (lowest, active) = (w.lowest, w.active_sqn);
        let snapshot_from = self
            .model
            .confirmed_of(i)
            .map(|s| s.from)
            .chain(w.completed.iter().map(|(_, s)| s.from))
            .next_back();
        let to = match self.rng.random_range(0..100) {
            0..35 => self.rng.random_range(lowest..=active),
            35..65 => snapshot_from.unwrap_or(lowest),
            65..85 => active,
            85..90 => lowest.saturating_sub(1),
            90..96 => active + 1,
            _ => u64::MAX,
        };
        let result = self.handle(i).truncate(to);
        if self.logged_closed(
            i,
            &format!("truncate to={to} (lowest {lowest}, active {active})"),
            &result,
            "truncate",
        ) {
            return;
        }
        if to > active {
            expect_rejected(
                &result,
                |e| matches!(e, WriterError::InvalidArgument(_)),
                &format!("{}: truncate to {to} beyond active {active}", self.name(i)),
            );
            return;
        }
        result.unwrap_or_else(|e| panic!("{}: truncate to {to} failed: {e}", self.name(i)));
        self.model.truncate(i, to);
    }

    /// A close (or drop) in the model; pending persists may now fail with `Closed`.
    fn close_model(&mut self, i: usize, release_from: u64) {
        self.model.close(i, release_from);
        for p in &mut self.pending[i] {
            p.closed_since = true;
        }
        self.stats.closes += 1;
    }

    fn op_close(&mut self, i: usize, how: u32) {
        let (what, result, release_from) = match how {
            0 => ("close", self.handle(i).close(), u64::MAX),
            1 => {
                let from = self
                    .rng
                    .random_range(0..=self.model.writers[i].active_sqn + 2);
                (
                    "truncate_and_close",
                    self.handle(i).truncate_and_close(from),
                    from,
                )
            }
            _ => {
                // The operator dies without closing: the sandbox goes with the handle.
                self.handles[i] = None;
                self.log(format!("{} drop", self.name(i)));
                if !self.closed(i) {
                    self.close_model(i, u64::MAX);
                }
                return;
            }
        };
        if self.logged_closed(i, &format!("{what}({release_from})"), &result, what) {
            return;
        }
        result.unwrap_or_else(|e| panic!("{}: {what} failed: {e}", self.name(i)));
        self.close_model(i, release_from);
    }

    // ---- sync points ----

    /// Alone: waits until every upload and deletion has finished and was delivered,
    /// then checks the store against the model.
    fn sync(&mut self) {
        self.storage.wait_idle();
        let written = self.store.written();
        let on_disk = self.store_paths();
        self.resolve(&written, &on_disk);
        let counts = check_files(
            &[&self.model],
            &self.store,
            &self.storage,
            &written,
            &self.copies,
        );
        self.stats.add_counts(counts);
    }

    fn store_paths(&self) -> HashSet<String> {
        path_strings(&self.store.files()).into_iter().collect()
    }

    fn resolve(&mut self, written: &[dstl_tests::fault_store::Written], on_disk: &HashSet<String>) {
        self.stats.syncs += 1;
        self.log("sync".into());
        // A writer that trapped while an upload outcome was delivered to it has not said
        // so to any call yet: nothing the simulation does may trap a writer.
        for (i, handle) in self.handles.iter().enumerate() {
            if let Some(cause) = handle.as_ref().and_then(Writer::failure) {
                panic!("{} trapped: {cause}", self.model.writers[i].name);
            }
        }
        self.model
            .resolve(written, on_disk, self.params.speculative);
    }

    // ---- a whole run ----

    pub fn step(&mut self) {
        self.stats.ops += 1;
        self.model.clock += 1;
        let open = self.open_writers();
        let i = if open.is_empty() || self.rng.random_bool(0.05) {
            self.rng.random_range(0..self.model.writers.len())
        } else {
            open[self.rng.random_range(0..open.len())]
        };
        if self.handles[i].is_none() {
            return;
        }
        match self.rng.random_range(0..1000) {
            0..250 => self.op_append(i, false),
            250..300 => self.op_append(i, true),
            300..390 => self.op_append_batch(i),
            390..400 => self.op_invalid_append(i),
            400..480 => self.op_next_sequence_number(i),
            480..620 => self.op_persist(i),
            620..700 => self.op_wait(i),
            700..780 => self.op_confirm(i),
            780..800 => self.op_reset(i),
            800..860 => self.op_truncate(i),
            860..870 => self.op_close(i, 0),
            870..880 => self.op_close(i, 1),
            880..884 => self.op_close(i, 2),
            _ if self.solo => self.sync(),
            _ => {}
        }
        if self.open_writers().len() < self.min_open && self.model.writers.len() < self.max_writers
        {
            self.add_writer();
        }
    }

    /// Every persist completes.
    pub fn finish_all_persists(&mut self) {
        self.model.clock += 1;
        for i in 0..self.model.writers.len() {
            while !self.pending[i].is_empty() {
                let pending = self.pending[i].remove(0);
                self.finish_persist(i, pending);
            }
        }
    }

    /// Closes every writer, releasing what no confirmed checkpoint owns.
    pub fn close_all(&mut self) {
        self.model.clock += 1;
        for i in self.open_writers() {
            let lowest = self.model.writers[i].lowest;
            let from = self.rng.random_range(0..=lowest);
            let result = self.handle(i).truncate_and_close(from);
            self.log(format!(
                "{} final truncate_and_close({from}) -> {}",
                self.name(i),
                describe(&result)
            ));
            result.unwrap();
            self.close_model(i, from);
        }
    }

    /// Counts what became of the change sets the writers held when they closed.
    fn count_close_fates(&mut self) {
        let fates = self.model.fates();
        for (w, fates) in self.model.writers.iter().zip(fates) {
            for (sqn, fate) in fates {
                if w.sets[&sqn].holding != Holding::AtClose {
                    continue;
                }
                match fate {
                    Fate::Released => self.stats.released_at_close += 1,
                    Fate::Abandoned => self.stats.kept_at_close += 1,
                    Fate::Unknown => self.stats.unknown_fates += 1,
                    Fate::Held => unreachable!("a closed writer holds nothing"),
                }
            }
        }
    }
}

/// A fresh directory for one seed: in memory (`/dev/shm`) where there is one, since
/// every file write ends in `fsync`s that on a disk make the run slow and its timing
/// depend on whatever else the machine writes (the simulation checks ownership and
/// contents, not durability: `host/tests/crash.rs` does that).
fn seed_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new().prefix("dstl-sim-").tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().unwrap()
}

fn open_seed(
    seed: u64,
    params: &Params,
    dir: &std::path::Path,
) -> (Arc<ChangelogStorage>, Arc<FaultStore>) {
    let conf: Vec<&str> = params.conf.iter().map(String::as_str).collect();
    let (storage, store) = open_with_store(dir, &conf, |config| {
        FaultStore::open(
            &config.job_dir(),
            FaultOptions {
                random: Some(RandomFaults {
                    seed: seed ^ 0x5eed,
                    fail_p: params.fail_p,
                    delay_p: params.delay_p,
                    max_delay: Duration::from_micros(params.max_delay_us),
                }),
                indexer: Some(Box::new(index_file)),
            },
        )
    });
    (Arc::new(storage), store)
}

/// One driver with 2–4 writers on the test thread.
fn run_solo(seed: u64, mut rng: ChaCha8Rng, params: Params, trace: &Trace) -> Stats {
    let tmp = seed_dir();
    let (storage, store) = open_seed(seed, &params, tmp.path());
    let sim_rng = ChaCha8Rng::seed_from_u64(rng.random());
    let mut sim = Sim::new(sim_rng, &params, 0, true, trace, &store, &storage);
    for _ in 0..params.writers {
        sim.add_writer();
    }
    for _ in 0..params.steps {
        sim.step();
    }
    sim.finish_all_persists();
    sim.sync();
    sim.close_all();
    storage.wait_idle();
    let counts = checks::final_check(
        &[&sim.model],
        &store,
        &storage,
        &sim.copies,
        params.speculative,
    );
    sim.stats.add_final(counts);
    sim.count_close_fates();
    sim.stats.files = store.written().len() as u64;
    sim.stats.creates = store.creates();
    sim.stats.injected_failures = store.failures();
    let stats = sim.stats;
    // Writers go before their storage.
    drop(sim);
    stats
}

/// Several drivers, each with its own writers on its own thread, calling into the
/// storage at the same time; every `ROUND` steps they stop together for a sync.
fn run_concurrent(seed: u64, mut rng: ChaCha8Rng, params: Params, trace: &Trace) -> Stats {
    const ROUND: usize = 20;
    let tmp = seed_dir();
    let (storage, store) = open_seed(seed, &params, tmp.path());
    let threads = rng.random_range(2..=3usize);
    let sims: Vec<Mutex<Sim>> = (0..threads)
        .map(|t| {
            let sim_rng = ChaCha8Rng::seed_from_u64(rng.random());
            let mut sim = Sim::new(
                sim_rng,
                &params,
                t as u16 * 100,
                false,
                trace,
                &store,
                &storage,
            );
            let writers = if params.writers > 2 { 2 } else { 1 };
            for _ in 0..writers {
                sim.add_writer();
            }
            Mutex::new(sim)
        })
        .collect();
    let barrier = std::sync::Barrier::new(threads);
    // The first failure; afterwards every thread only keeps meeting the barriers.
    let failure: Mutex<Option<Box<dyn std::any::Any + Send>>> = Mutex::new(None);
    let phase = |f: &mut dyn FnMut()| {
        if failure.lock().unwrap().is_some() {
            return;
        }
        if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
            failure.lock().unwrap().get_or_insert(panic);
        }
    };
    let counts = Mutex::new(checks::FileCounts::default());
    let copies = Copies::default();
    // Everyone stopped: wait for uploads, learn their outcomes, check the files.
    let sync = |t: usize| {
        barrier.wait();
        if t == 0 {
            phase(&mut || storage.wait_idle());
        }
        barrier.wait();
        let written = store.written();
        let on_disk: HashSet<String> = path_strings(&store.files()).into_iter().collect();
        phase(&mut || sims[t].lock().unwrap().resolve(&written, &on_disk));
        barrier.wait();
        if t == 0 {
            phase(&mut || {
                let guards: Vec<_> = sims.iter().map(|s| s.lock().unwrap()).collect();
                let refs: Vec<&Model> = guards.iter().map(|g| &g.model).collect();
                let found = check_files(&refs, &store, &storage, &written, &copies);
                let mut counts = counts.lock().unwrap();
                counts.required_local += found.required_local;
                counts.shared_local += found.shared_local;
            });
        }
        barrier.wait();
    };
    let final_counts = Mutex::new(FinalCounts::default());
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (phase, sync, sims) = (&phase, &sync, &sims);
            let (final_counts, copies) = (&final_counts, &copies);
            let (store, storage) = (&store, &storage);
            scope.spawn(move || {
                for _ in 0..params.steps.div_ceil(ROUND) {
                    phase(&mut || {
                        let mut sim = sims[t].lock().unwrap();
                        for _ in 0..ROUND {
                            sim.step();
                        }
                    });
                    sync(t);
                }
                phase(&mut || sims[t].lock().unwrap().finish_all_persists());
                sync(t);
                phase(&mut || sims[t].lock().unwrap().close_all());
                sync(t);
                if t == 0 {
                    phase(&mut || {
                        let guards: Vec<_> = sims.iter().map(|s| s.lock().unwrap()).collect();
                        let refs: Vec<&Model> = guards.iter().map(|g| &g.model).collect();
                        *final_counts.lock().unwrap() =
                            checks::final_check(&refs, store, storage, copies, params.speculative);
                    });
                }
            });
        }
    });
    if let Some(panic) = failure.into_inner().unwrap() {
        std::panic::resume_unwind(panic);
    }
    let mut stats = Stats::default();
    for sim in sims {
        let mut sim = sim.into_inner().unwrap();
        sim.count_close_fates();
        stats.add(&sim.stats);
    }
    stats.add_counts(counts.into_inner().unwrap());
    stats.add_final(final_counts.into_inner().unwrap());
    stats.local_seeds = u64::from(params.local_recovery);
    stats.files = store.written().len() as u64;
    stats.creates = store.creates();
    stats.injected_failures = store.failures();
    stats
}

/// Seeds with `seed % 3 == 2` drive writers from several threads at once.
pub fn run_seed(seed: u64, trace: &Trace) -> Stats {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let params = Params::random(&mut rng);
    let concurrent = seed % 3 == 2;
    trace
        .lock()
        .unwrap()
        .push_back(format!("concurrent: {concurrent}; params {params:?}"));
    if concurrent {
        run_concurrent(seed, rng, params, trace)
    } else {
        run_solo(seed, rng, params, trace)
    }
}
