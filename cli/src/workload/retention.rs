//! What `dstl run` deletes while it runs, as a job manager would: the files of subsumed
//! checkpoints. Without it a run keeps every file it ever wrote, and `dstl run --duration
//! 10min` fills a disk at the writers' speed.
//!
//! A writer hands a file over once a checkpoint naming it is confirmed (the task registry
//! stops tracking it), so from then on only the run deletes it. It may do so once no
//! writer's latest confirmed checkpoint names the file and no writer can name it again.
//! The second half needs care, because writers share files: a file confirmed by one
//! writer may hold another writer's changes that a persist still in flight, or one not
//! started yet, will name. Handles carry no sequence numbers, so the proof goes by a
//! logical clock instead:
//!
//! - The clock ticks whenever a confirmed checkpoint is registered; a file's *first
//!   sighting* is the tick at which a confirmed handle first named it. Every change in
//!   the file was appended before it was uploaded, so before its first sighting.
//! - A writer reads the clock just before it asks for the sequence number a persist ends
//!   at (`to`). A persist whose reading is at or after a file's first sighting therefore
//!   ends after every change of that writer in the file.
//! - A writer's persists start at the end of its last confirmed checkpoint. So the oldest
//!   `from` it can still name is the `from` of its oldest persist in flight, or the end of
//!   its last confirmed checkpoint when none is; its *safe tick* is the clock reading of
//!   the persist that ended there. Once a writer's safe tick is at or after a file's first
//!   sighting, no handle of that writer will name the file again.
//!
//! So a file is deleted once every open writer's safe tick has reached its first sighting
//! and no writer's latest confirmed checkpoint names it. A closed writer names nothing
//! new. [`Retention`] only decides; the run deletes what it returns, after writing the
//! manifest of the checkpoint that subsumed the file, so a crash in between leaves only
//! files that `dstl gc` collects.
//!
//! Kinds of methods: a query ([`Retention::now`], the clock reading), and inputs
//! ([`Retention::confirmed`], [`Retention::closed`]) that return the files to delete.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

/// The run's record of confirmed files; shared by the writers' threads.
pub(crate) struct Retention {
    state: Mutex<State>,
}

struct State {
    clock: u64,
    /// Files confirmed and not deleted, by first sighting.
    first_seen: HashMap<String, u64>,
    /// The same files, grouped by first sighting, until every open writer's safe tick
    /// has passed it.
    waiting: BTreeMap<u64, Vec<String>>,
    /// How many writers' latest confirmed checkpoints name each file.
    named: HashMap<String, usize>,
    writers: Vec<Writer>,
    /// Safe ticks of the open writers, with how many writers are at each.
    safe_ticks: BTreeMap<u64, usize>,
    /// Every file given up so far: a confirmed checkpoint naming one of them would be
    /// data lost, and fails the run instead of passing unnoticed.
    deleted: HashSet<String>,
}

/// A confirmed checkpoint named a file the run had already given up: the proof in the
/// module's documentation failed, and the run says so rather than lose data quietly.
#[derive(Debug, thiserror::Error)]
#[error("a checkpoint of op-{writer} names {file}, which the run deleted as subsumed")]
pub(crate) struct DeletedTooEarly {
    writer: usize,
    file: String,
}

struct Writer {
    /// The distinct files its latest confirmed checkpoint names.
    latest: Vec<String>,
    safe: u64,
    open: bool,
}

impl Retention {
    /// A record for `writers` open writers, none of which confirmed anything.
    pub(crate) fn new(writers: usize) -> Self {
        let state = State {
            clock: 0,
            first_seen: HashMap::new(),
            waiting: BTreeMap::new(),
            named: HashMap::new(),
            writers: (0..writers)
                .map(|_| Writer {
                    latest: Vec::new(),
                    safe: 0,
                    open: true,
                })
                .collect(),
            safe_ticks: BTreeMap::from([(0, writers)]),
            deleted: HashSet::new(),
        };
        Self {
            state: Mutex::new(state),
        }
    }

    /// The clock reading a persist takes just before it asks for its `to`.
    pub(crate) fn now(&self) -> u64 {
        self.state.lock().unwrap().clock
    }

    /// Writer `writer` confirmed a checkpoint naming `files` (its latest from now on), and
    /// its safe tick is now `safe`. Returns the files to delete.
    pub(crate) fn confirmed<'a>(
        &self,
        writer: usize,
        files: impl IntoIterator<Item = &'a str>,
        safe: u64,
    ) -> Result<Vec<String>, DeletedTooEarly> {
        let mut state = self.state.lock().unwrap();
        state.clock += 1;
        let tick = state.clock;
        let mut latest: Vec<String> = Vec::new();
        for file in files {
            if state.deleted.contains(file) {
                return Err(DeletedTooEarly {
                    writer,
                    file: file.to_string(),
                });
            }
            if !latest.iter().any(|f| f == file) {
                latest.push(file.to_string());
            }
        }
        for file in &latest {
            if !state.first_seen.contains_key(file) {
                state.first_seen.insert(file.clone(), tick);
                state.waiting.entry(tick).or_default().push(file.clone());
            }
            *state.named.entry(file.clone()).or_default() += 1;
        }
        let previous = std::mem::replace(&mut state.writers[writer].latest, latest);
        let mut unnamed = Vec::new();
        for file in previous {
            let count = state.named.get_mut(&file).expect("a named file is counted");
            *count -= 1;
            if *count == 0 {
                state.named.remove(&file);
                unnamed.push(file);
            }
        }
        let old = std::mem::replace(&mut state.writers[writer].safe, safe);
        if state.writers[writer].open {
            state.move_safe_tick(old, Some(safe));
        }
        Ok(state.collect(unnamed))
    }

    /// Writer `writer` closed: it names no file it has not named already. Returns the
    /// files to delete.
    pub(crate) fn closed(&self, writer: usize) -> Vec<String> {
        let mut state = self.state.lock().unwrap();
        if !std::mem::replace(&mut state.writers[writer].open, false) {
            return Vec::new();
        }
        let safe = state.writers[writer].safe;
        state.move_safe_tick(safe, None);
        state.collect(Vec::new())
    }
}

impl State {
    /// An open writer's safe tick moved from `old` to `new` (`None`: it closed).
    fn move_safe_tick(&mut self, old: u64, new: Option<u64>) {
        if let Some(count) = self.safe_ticks.get_mut(&old) {
            *count -= 1;
            if *count == 0 {
                self.safe_ticks.remove(&old);
            }
        }
        if let Some(new) = new {
            *self.safe_ticks.entry(new).or_default() += 1;
        }
    }

    /// Returns the files every open writer is past that no latest checkpoint names: of
    /// those the slowest writer just passed, and of `unnamed` (files that just lost their
    /// last name). A file passed but still named is deleted when it loses its last name
    /// (the slowest safe tick never goes back).
    fn collect(&mut self, unnamed: Vec<String>) -> Vec<String> {
        let past = self.safe_ticks.keys().next().copied().unwrap_or(u64::MAX);
        let later = match past.checked_add(1) {
            Some(next) => self.waiting.split_off(&next),
            None => BTreeMap::new(),
        };
        let passed = std::mem::replace(&mut self.waiting, later);
        let mut delete = Vec::new();
        for file in passed.into_values().flatten().chain(unnamed) {
            let behind = self.first_seen.get(&file).is_some_and(|&seen| seen <= past);
            if behind && !self.named.contains_key(&file) {
                self.first_seen.remove(&file);
                self.deleted.insert(file.clone());
                delete.push(file);
            }
        }
        delete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_goes_once_no_latest_checkpoint_names_it_and_every_writer_is_past_it() {
        let r = Retention::new(2);
        // Writer 0 persists (reading 0) and confirms a checkpoint in file a.
        assert_eq!(r.now(), 0);
        assert!(r.confirmed(0, ["a"], 0).unwrap().is_empty());
        // Writer 1 has changes in a too, in a persist that started before a was seen.
        assert!(r.confirmed(1, ["a"], 0).unwrap().is_empty());
        // Writer 0's next checkpoint (persist read tick 1, so past a) is in b: a is still
        // named by writer 1, and writer 1 is not past it.
        let tick = r.now();
        assert!(r.confirmed(0, ["b"], tick).unwrap().is_empty());
        // Writer 1 confirms a checkpoint started after a was seen, in b: nobody names a,
        // and both writers are past it.
        let tick1 = r.now();
        assert_eq!(r.confirmed(1, ["b"], tick1).unwrap(), vec!["a".to_string()]);
        // b was first seen at tick 3; writer 0's safe tick is 2: b waits.
        assert!(r.confirmed(0, ["c"], r.now()).unwrap().is_empty());
        assert_eq!(
            r.confirmed(1, ["c", "c"], r.now()).unwrap(),
            vec!["b".to_string()]
        );
        // A checkpoint naming a file already given up is an error naming both.
        let e = r.confirmed(0, ["c", "a"], r.now()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a checkpoint of op-0 names a, which the run deleted as subsumed"
        );
    }

    #[test]
    fn a_persist_in_flight_that_may_still_name_a_file_keeps_it() {
        let r = Retention::new(2);
        assert!(r.confirmed(0, ["a"], 0).unwrap().is_empty());
        // Writer 1 never confirmed: its persists may still name a, whoever else moves on.
        for _ in 0..3 {
            assert!(r.confirmed(0, ["b"], r.now()).unwrap().is_empty());
        }
        // Writer 1 confirms, naming a, with a safe tick before a: still kept.
        assert!(r.confirmed(1, ["a", "b"], 0).unwrap().is_empty());
        // Writer 1 closes: it names nothing new, but its latest checkpoint names a.
        assert!(r.closed(1).is_empty());
        assert!(r.closed(1).is_empty());
        assert!(r.closed(0).is_empty());
    }

    #[test]
    fn closing_releases_the_files_only_closed_writers_held_back() {
        let r = Retention::new(2);
        assert!(r.confirmed(0, ["a"], 0).unwrap().is_empty());
        assert!(r.confirmed(0, ["b"], r.now()).unwrap().is_empty());
        // a waits for writer 1, which never confirms and then closes.
        assert_eq!(r.closed(1), vec!["a".to_string()]);
        // b stays: writer 0's latest checkpoint names it, even after it closes.
        assert!(r.closed(0).is_empty());
    }
}
