//! The upload scheduler shared by all writers of a storage. Tasks of every writer queue
//! together in a [`Batcher`]; a batch leaves as one file. Admission waits on the in-flight
//! limit; the batch runs under the retry policy on the upload pool; each task's outcome
//! goes to its own writer's [`OutcomeSink`], after its bytes were returned to the
//! throttle, so a writer blocked on capacity is always woken.
//!
//! The batching decisions are [`Batcher`]'s; this is the thin tokio loop around it: one
//! timer task sleeps until the batch's deadline and is woken when a new deadline is set.
//! A batch that leaves runs in steps: `run_batch` (the file, under the retry policy) gives
//! an outcome; `record_success` or `record_failure` records it and tracks its file; the
//! outcomes are then delivered to their writers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use dstl_proto::batch::Batcher;
use tokio::sync::{Notify, Semaphore};
use tracing::Instrument;

use super::attempt::UploadedFile;
use super::buffers::BlockPool;
use super::retry::{self, RetryPolicy};
use super::throttle::Throttle;
use super::{OutcomeSink, Task, UploadError, UploadOutcome, Uploader};
use crate::background::{Job, Outstanding};
use crate::metrics::Metrics;
use crate::registry::{Registries, WriterId};
use crate::store::lease::LeaseWatch;
use crate::sync::LockExt;
use dstl_proto::error::Refusal;

/// The tasks of a batch as `writer-id/task-id`, for its span.
struct TaskIds<'a>(&'a [Recipient]);

impl std::fmt::Display for TaskIds<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, recipient) in self.0.iter().enumerate() {
            let separator = if i == 0 { "" } else { " " };
            write!(f, "{separator}{}/{}", recipient.writer, recipient.task)?;
        }
        Ok(())
    }
}

/// Who submitted a task, to hand it its outcome.
struct Recipient {
    sink: Weak<dyn OutcomeSink>,
    writer: WriterId,
    task: u64,
    size: u64,
    /// Keeps [`Outstanding::wait_idle`] waiting until the outcome is delivered.
    _job: Job,
}

/// Outcomes of a batch whose recipients were taken out of [`Scheduler::running`]: they
/// are delivered even if the blocking task meant to deliver them never runs (the
/// runtime shut down with the storage first), so no persist stays unresolved and no
/// file stays tracked for a writer that never heard of it.
struct Delivery {
    scheduler: Arc<Scheduler>,
    pending: Vec<(Recipient, UploadOutcome)>,
}

impl Drop for Delivery {
    fn drop(&mut self) {
        for (recipient, outcome) in self.pending.drain(..) {
            self.scheduler.deliver(&recipient, outcome);
        }
    }
}

/// A task waiting for its batch.
struct Queued {
    recipient: Recipient,
    task: Task,
}

/// How a scheduler batches, retries and limits uploads.
pub(crate) struct SchedulerSettings {
    pub delay: std::time::Duration,
    pub size_threshold: u64,
    pub max_in_flight: u64,
    pub policy: RetryPolicy,
    pub threads: usize,
}

/// Batches, throttles and runs uploads.
pub(crate) struct Scheduler {
    policy: RetryPolicy,
    queue: Mutex<Batcher<Queued>>,
    /// Wakes the timer task when a batch gets a deadline or the queue closes.
    timer: Arc<Notify>,
    pub throttle: Throttle,
    /// Buffers for the blocks of upload tasks, recycled when their upload ends.
    pub blocks: Arc<BlockPool>,
    uploader: Arc<Uploader>,
    registries: Registries,
    /// Stamps each file with the lease generation it was written in.
    lease: Arc<LeaseWatch>,
    permits: Arc<Semaphore>,
    /// Batches running, by number: whoever takes a batch's recipients out delivers its
    /// outcome (the batch when it ends, or [`Scheduler::abandon_running`] at close).
    running: Mutex<HashMap<u64, Vec<Recipient>>>,
    next_batch: AtomicU64,
    runtime: tokio::runtime::Handle,
    outstanding: Outstanding,
    metrics: Arc<Metrics>,
    /// Makes the next [`Scheduler::submit`] panic while it holds the queue's lock, as a
    /// defect of the host would (dstl's tests of what a panic must not break).
    #[cfg(feature = "test-util")]
    pub panic_next_submit: AtomicBool,
    /// The last failed batch logged as a warning. Batches failing for the same cause
    /// within [`FAILURE_WARNING_INTERVAL`] of it are logged at debug level: a full disk
    /// fails every batch, and is one warning instead of one per batch.
    warned_failure: Mutex<Option<WarnedFailure>>,
}

/// How long repeats of a failure's cause are logged at debug level after its warning.
/// Successes in between do not end it: on a disk that is almost full, deletions make room
/// for the odd batch while most fail.
const FAILURE_WARNING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// A failure logged as a warning, and its repeats since.
struct WarnedFailure {
    /// The innermost cause ([`root_cause`]).
    cause: String,
    at: Instant,
    repeats: u64,
}

impl Scheduler {
    pub fn new(
        settings: SchedulerSettings,
        uploader: Arc<Uploader>,
        registries: Registries,
        lease: Arc<LeaseWatch>,
        runtime: tokio::runtime::Handle,
        outstanding: Outstanding,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let scheduler = Arc::new(Self {
            policy: settings.policy,
            queue: Mutex::new(Batcher::new(settings.delay, settings.size_threshold)),
            timer: Arc::new(Notify::new()),
            throttle: Throttle::new(settings.max_in_flight),
            blocks: uploader.buffers.clone(),
            uploader,
            registries,
            lease,
            permits: Arc::new(Semaphore::new(settings.threads)),
            running: Mutex::new(HashMap::new()),
            next_batch: AtomicU64::new(0),
            runtime: runtime.clone(),
            outstanding,
            metrics,
            #[cfg(feature = "test-util")]
            panic_next_submit: AtomicBool::new(false),
            warned_failure: Mutex::new(None),
        });
        runtime.spawn(Self::run_timer(Arc::downgrade(&scheduler)));
        scheduler
    }

    /// Sends the queued batch when its delay has passed; ends with the scheduler.
    async fn run_timer(this: Weak<Self>) {
        loop {
            let Some(scheduler) = this.upgrade() else {
                return;
            };
            let deadline = {
                let queue = scheduler.queue.locked();
                if queue.is_closed() {
                    return;
                }
                queue.poll_timeout()
            };
            // A wake-up between here and the wait is kept as a permit, so none is lost.
            let timer = scheduler.timer.clone();
            drop(scheduler);
            let woken = timer.notified();
            match deadline {
                Some(deadline) => {
                    tokio::select! {
                        _ = woken => {}
                        _ = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {}
                    }
                }
                None => woken.await,
            }
            let Some(scheduler) = this.upgrade() else {
                return;
            };
            let batch = scheduler.queue.locked().handle_timeout(Instant::now());
            if let Some(batch) = batch {
                scheduler.start(batch);
            }
        }
    }

    /// Accepts a task of `writer`. Blocks while the in-flight limit is reached (Flink's
    /// back-pressure); never uploads on the caller's thread. A pre-emptive task (which no
    /// checkpoint waits for) waits for company in its batch whatever its size
    /// ([`Batcher::push_background`]).
    pub fn submit(
        self: &Arc<Self>,
        sink: Weak<dyn OutcomeSink>,
        writer: WriterId,
        cancel: &AtomicBool,
        task: Task,
    ) -> Result<(), Refusal> {
        let size = task
            .change_sets
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(c.size));
        self.throttle.admit(size, cancel)?;
        let mut queue = self.queue.locked();
        #[cfg(feature = "test-util")]
        if self.panic_next_submit.swap(false, Ordering::SeqCst) {
            panic!("a panic injected into the scheduler (dstl's tests)");
        }
        let queued = Queued {
            recipient: Recipient {
                sink,
                writer,
                task: task.id,
                size,
                _job: self.outstanding.start(),
            },
            task,
        };
        let had_deadline = queue.poll_timeout().is_some();
        let pushed = if queued.task.preemptive {
            queue.push_background(queued, size, Instant::now())
        } else {
            queue.push(queued, size, Instant::now())
        };
        let Ok(batch) = pushed else {
            // Closed: the batcher dropped the task.
            drop(queue);
            self.throttle.release(size);
            return Err(Refusal::StorageClosed);
        };
        self.metrics.upload_queue.increment(1.0);
        let new_deadline = !had_deadline && queue.poll_timeout().is_some();
        drop(queue);
        if let Some(batch) = batch {
            self.start(batch);
        } else if new_deadline {
            self.timer.notify_one();
        }
        Ok(())
    }

    /// Records a failed batch whose innermost cause is `cause`: `Some(repeats)` when it
    /// is to be a warning (`repeats`: failures for the same cause logged at debug level
    /// since the last warning), `None` when it repeats a recent warning.
    fn note_failure(&self, cause: String) -> Option<u64> {
        let mut warned = self.warned_failure.locked();
        if let Some(last) = warned.as_mut()
            && last.cause == cause
            && last.at.elapsed() < FAILURE_WARNING_INTERVAL
        {
            last.repeats += 1;
            return None;
        }
        let repeats = warned
            .take()
            .filter(|last| last.cause == cause)
            .map_or(0, |last| last.repeats);
        *warned = Some(WarnedFailure {
            cause,
            at: Instant::now(),
            repeats: 0,
        });
        Some(repeats)
    }

    /// Runs one batch as one file under the retry policy, off the caller's thread.
    fn start(self: &Arc<Self>, batch: Vec<Queued>) {
        if batch.is_empty() {
            return;
        }
        self.metrics.upload_queue.decrement(batch.len() as f64);
        self.metrics.upload_batch_sizes.record(batch.len() as f64);
        let number = self.next_batch.fetch_add(1, Ordering::Relaxed);
        let (recipients, tasks): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|q| (q.recipient, q.task)).unzip();
        // A root span: a batch holds the tasks of many writers, so it belongs to none of
        // the writer spans it may be started from.
        let span = tracing::debug_span!(
            parent: None,
            "upload",
            batch = number,
            tasks = recipients.len(),
            task_ids = %TaskIds(&recipients),
            bytes = recipients.iter().map(|r| r.size).sum::<u64>(),
            attempts = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        self.running.locked().insert(number, recipients);
        // Taken before any attempt writes: a lapse of the lease after this may have let
        // gc collect the file.
        let generation = self.lease.generation();
        let this = self.clone();
        // Taken now, not when the task first runs: the storage is not idle from here on.
        let job = self.outstanding.start();
        let batch_span = span.clone();
        let upload = async move {
            let tasks = Arc::new(tasks);
            let outcome = this.run_batch(tasks.clone(), batch_span, job).await;
            this.recycle(tasks);
            let Some(recipients) = this.running.locked().remove(&number) else {
                // Abandoned at close: the persists failed already, so the file is nobody's.
                tracing::Span::current().record("outcome", "abandoned");
                tracing::debug!("upload batch abandoned at close");
                if let Ok(success) = outcome {
                    this.uploader.discard(success.result);
                }
                return;
            };
            let outcomes = match outcome {
                Ok(success) => this.record_success(success, &recipients, generation),
                Err(error) => this.record_failure(error, &recipients),
            };
            let delivery = Delivery {
                scheduler: this.clone(),
                pending: recipients.into_iter().zip(outcomes).collect(),
            };
            // Delivery (on drop) calls into writers' sandboxes: keep it off the async
            // workers.
            let delivered = tokio::task::spawn_blocking(move || drop(delivery));
            if let Err(e) = delivered.await {
                tracing::error!(error = %e, "delivering upload outcomes panicked");
            }
        };
        self.runtime.spawn(upload.instrument(span));
    }

    /// Step 1: writes the batch's tasks as one file under the retry policy, each attempt
    /// in a span of its own below `batch_span`; `job` keeps the storage from reporting
    /// idle until the attempts that lost are discarded.
    async fn run_batch(
        &self,
        tasks: Arc<Vec<Task>>,
        batch_span: tracing::Span,
        job: Job,
    ) -> Result<retry::Success<UploadedFile>, UploadError> {
        let uploader = self.uploader.clone();
        let loser = self.uploader.clone();
        retry::execute(
            self.policy,
            self.permits.clone(),
            move |attempt| {
                let span = tracing::debug_span!(
                    parent: &batch_span,
                    "upload_attempt",
                    attempt,
                    outcome = tracing::field::Empty,
                );
                let _entered = span.enter();
                let result = uploader.upload(&tasks);
                span.record("outcome", if result.is_ok() { "ok" } else { "failed" });
                if let Err(error) = &result {
                    tracing::debug!(%error, "upload attempt failed");
                }
                result
            },
            move |file| loser.discard(file),
            job,
        )
        .await
    }

    /// Returns the tasks' block buffers to the pool (and lent blocks to their sandbox),
    /// unless attempts that lost a race still hold them (then they go when those end).
    fn recycle(&self, tasks: Arc<Vec<Task>>) {
        if let Ok(tasks) = Arc::try_unwrap(tasks) {
            for block in tasks.into_iter().flat_map(|t| t.change_sets) {
                if let Some(buffer) = block.block.into_buffer() {
                    self.blocks.put(buffer);
                }
            }
        }
    }

    /// Step 2 of a batch that was written: records it (span, log, metrics), tracks its
    /// file in the registries (stamped with the lease `generation`, with a claim of each
    /// writer on a local copy), and returns each task's outcome, in `recipients` order.
    fn record_success(
        &self,
        success: retry::Success<UploadedFile>,
        recipients: &[Recipient],
        generation: u64,
    ) -> Vec<UploadOutcome> {
        let span = tracing::Span::current();
        span.record("attempts", success.total_attempts);
        span.record("outcome", "ok");
        tracing::debug!(
            attempt = success.attempt,
            file = %success.result.remote,
            written = success.result.written,
            "upload batch finished"
        );
        let file = success.result;
        self.metrics.attempts_per_upload.record(success.attempt);
        self.metrics
            .total_attempts_per_upload
            .record(success.total_attempts);
        self.metrics.uploaded_files.increment(1);
        self.metrics.written_bytes.increment(file.written);
        self.registries
            .task
            .track(&file.remote, file.change_sets, generation);
        if let Some(local) = &file.local {
            // A local copy is claimed by each writer with change sets in it.
            for (recipient, results) in recipients.iter().zip(&file.per_task) {
                self.registries
                    .local
                    .hold(recipient.writer, local, results.len() as u64);
            }
        }
        recipients
            .iter()
            .zip(file.per_task)
            .map(|(recipient, results)| UploadOutcome::Succeeded {
                task: recipient.task,
                results,
            })
            .collect()
    }

    /// Step 2 of a batch that failed for good: records it (span, and a warning per new
    /// cause, repeats of the same cause at debug level) and returns each task's outcome.
    fn record_failure(&self, error: UploadError, recipients: &[Recipient]) -> Vec<UploadOutcome> {
        let tasks = recipients.len();
        let span = tracing::Span::current();
        if let UploadError::Failed { attempts, .. } | UploadError::TimedOut { attempts, .. } =
            &error
        {
            span.record("attempts", attempts);
        }
        span.record("outcome", "failed");
        match self.note_failure(root_cause(&error)) {
            None => tracing::debug!(
                tasks,
                %error,
                "upload batch failed for the same cause again"
            ),
            Some(0) => tracing::warn!(
                tasks,
                %error,
                "upload batch failed (failures for the same cause in the next minute are logged at debug level)"
            ),
            Some(repeats) => tracing::warn!(
                tasks,
                %error,
                repeats,
                "upload batch failed, as {repeats} more did for the same cause since the last warning (logged at debug level)"
            ),
        }
        recipients
            .iter()
            .map(|recipient| UploadOutcome::Failed {
                task: recipient.task,
                error: error.clone(),
            })
            .collect()
    }

    /// Returns the task's bytes to the throttle, then hands `outcome` to its writer; if
    /// the writer is gone, a success's files are released on its behalf.
    fn deliver(&self, recipient: &Recipient, outcome: UploadOutcome) {
        self.throttle.release(recipient.size);
        match recipient.sink.upgrade() {
            Some(sink) => sink.deliver(outcome),
            None => {
                if let UploadOutcome::Succeeded { results, .. } = outcome {
                    self.registries.release_results(recipient.writer, &results);
                }
            }
        }
    }

    /// Fails every task of `recipients` with `error`.
    fn fail(&self, recipients: impl IntoIterator<Item = Recipient>, error: UploadError) {
        for recipient in recipients {
            let task = recipient.task;
            let error = error.clone();
            self.deliver(&recipient, UploadOutcome::Failed { task, error });
        }
    }

    /// Tasks waiting to be batched.
    pub fn queue_size(&self) -> u64 {
        self.queue.locked().len() as u64
    }

    /// Fails queued tasks with a closed error and wakes writers waiting for capacity.
    /// Batches already running finish and deliver as usual.
    pub fn close(&self) {
        let batch = { self.queue.locked().close() };
        self.metrics.upload_queue.decrement(batch.len() as f64);
        self.timer.notify_one();
        self.throttle.close();
        let recipients = batch.into_iter().map(|queued| queued.recipient);
        self.fail(recipients, UploadError::ClosedBeforeStart);
    }

    /// Fails every task of the batches still running (the storage is closing and will not
    /// wait for them any longer); returns how many tasks were failed.
    pub fn abandon_running(&self) -> usize {
        let running: Vec<Recipient> = self
            .running
            .locked()
            .drain()
            .flat_map(|(_, recipients)| recipients)
            .collect();
        let count = running.len();
        self.fail(running, UploadError::Abandoned);
        count
    }
}

/// The innermost cause of `error` as text (`No space left on device (os error 28)`):
/// what repeated failures have in common, unlike the messages around it, which name
/// each attempt's file.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}
