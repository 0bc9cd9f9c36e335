//! The upload scheduler shared by all writers of a storage (spec §3.2): tasks of every
//! writer queue together and leave as one batch, one file, when the persist delay has
//! passed since the batch's first task or the queued bytes reach the size threshold.
//! Admission waits on the in-flight limit; the batch runs under the retry policy on the
//! upload pool; each task's outcome goes to its own writer's mailbox, after its bytes
//! were returned to the throttle, so a writer blocked on capacity is always woken.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dstl_guest::types::UploadTask;
use tokio::sync::Semaphore;

use crate::background::{Job, Outstanding};
use crate::metrics::Metrics;
use crate::registry::TaskRegistry;
use crate::retry::{self, RetryPolicy};
use crate::throttle::Throttle;
use crate::uploader::{Uploader, release_results};
use crate::writer::{Letter, WriterShared};

struct Queued {
    writer: Weak<WriterShared>,
    task: UploadTask,
    size: u64,
    /// Keeps [`Outstanding::wait_idle`] waiting until the outcome is delivered.
    _job: Job,
}

#[derive(Default)]
struct Queue {
    tasks: Vec<Queued>,
    bytes: u64,
    /// Identifies the pending delayed drain; a drain for an older generation does nothing.
    generation: u64,
    drain_pending: bool,
    closed: bool,
}

/// Batches, throttles and runs uploads.
pub(crate) struct Scheduler {
    delay: Duration,
    size_threshold: u64,
    policy: RetryPolicy,
    queue: Mutex<Queue>,
    pub throttle: Throttle,
    uploader: Arc<Uploader>,
    registry: TaskRegistry,
    permits: Arc<Semaphore>,
    runtime: tokio::runtime::Handle,
    outstanding: Outstanding,
    metrics: Arc<Metrics>,
}

impl Scheduler {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        delay: Duration,
        size_threshold: u64,
        max_in_flight: u64,
        policy: RetryPolicy,
        threads: usize,
        uploader: Arc<Uploader>,
        registry: TaskRegistry,
        runtime: tokio::runtime::Handle,
        outstanding: Outstanding,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            delay,
            size_threshold,
            policy,
            queue: Mutex::new(Queue::default()),
            throttle: Throttle::new(max_in_flight),
            uploader,
            registry,
            permits: Arc::new(Semaphore::new(threads)),
            runtime,
            outstanding,
            metrics,
        })
    }

    /// Accepts a task of `writer`. Blocks while the in-flight limit is reached (Flink's
    /// back-pressure); never uploads on the caller's thread.
    pub fn submit(
        self: &Arc<Self>,
        writer: Weak<WriterShared>,
        task: UploadTask,
    ) -> Result<(), String> {
        let size: u64 = task.change_sets.iter().map(|c| c.size).sum();
        self.throttle.seize(size)?;
        let mut queue = self.queue.lock().unwrap();
        if queue.closed {
            drop(queue);
            self.throttle.release(size);
            return Err("the changelog storage is closed".into());
        }
        queue.tasks.push(Queued {
            writer,
            task,
            size,
            _job: self.outstanding.start(),
        });
        queue.bytes += size;
        if self.delay.is_zero() || queue.bytes >= self.size_threshold {
            let batch = Self::take(&mut queue);
            drop(queue);
            self.start(batch);
        } else if !queue.drain_pending {
            queue.drain_pending = true;
            let generation = queue.generation;
            let this = Arc::downgrade(self);
            let delay = self.delay;
            self.runtime.spawn(async move {
                tokio::time::sleep(delay).await;
                if let Some(this) = this.upgrade() {
                    this.drain_delayed(generation);
                }
            });
        }
        Ok(())
    }

    fn take(queue: &mut Queue) -> Vec<Queued> {
        queue.bytes = 0;
        queue.generation += 1;
        queue.drain_pending = false;
        std::mem::take(&mut queue.tasks)
    }

    fn drain_delayed(self: &Arc<Self>, generation: u64) {
        let mut queue = self.queue.lock().unwrap();
        if queue.generation != generation || queue.closed {
            return;
        }
        let batch = Self::take(&mut queue);
        drop(queue);
        self.start(batch);
    }

    /// Runs one batch as one file under the retry policy, off the caller's thread.
    fn start(self: &Arc<Self>, batch: Vec<Queued>) {
        if batch.is_empty() {
            return;
        }
        self.metrics.upload_batch_sizes.record(batch.len() as u64);
        let this = self.clone();
        let job = self.outstanding.start();
        self.runtime.spawn(async move {
            let (writers, tasks): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .map(|q| ((q.writer, q.size, q._job), q.task))
                .unzip();
            let tasks = Arc::new(tasks);
            let uploader = this.uploader.clone();
            let loser = this.uploader.clone();
            let attempt_tasks = tasks.clone();
            let outcome = retry::execute(
                this.policy,
                this.permits.clone(),
                move |_| uploader.upload(&attempt_tasks),
                move |file| loser.discard(file),
                job,
            )
            .await;
            let letters: Vec<Letter> = match outcome {
                Ok(won) => {
                    let file = won.result;
                    this.metrics.attempts_per_upload.record(won.attempt as u64);
                    this.metrics
                        .total_attempts_per_upload
                        .record(won.total_attempts as u64);
                    Metrics::add(&this.metrics.uploaded_files, 1);
                    Metrics::add(&this.metrics.written_bytes, file.written);
                    this.registry.start_tracking(&file.remote, file.change_sets);
                    if let Some(local) = &file.local {
                        this.registry.start_tracking(local, file.change_sets);
                    }
                    tasks
                        .iter()
                        .zip(file.per_task)
                        .map(|(task, results)| Letter::Succeeded {
                            task: task.id,
                            results,
                        })
                        .collect()
                }
                Err(cause) => {
                    tracing::warn!(tasks = tasks.len(), %cause, "upload batch failed");
                    tasks
                        .iter()
                        .map(|task| Letter::Failed {
                            task: task.id,
                            cause: cause.clone(),
                        })
                        .collect()
                }
            };
            // Delivery calls into writers' sandboxes: keep it off the async workers.
            let delivered = tokio::task::spawn_blocking(move || {
                for ((writer, size, job), letter) in writers.into_iter().zip(letters) {
                    this.throttle.release(size);
                    this.deliver(&writer, letter);
                    drop(job);
                }
            });
            if let Err(e) = delivered.await {
                tracing::error!(error = %e, "delivering upload outcomes panicked");
            }
        });
    }

    fn deliver(&self, writer: &Weak<WriterShared>, letter: Letter) {
        match writer.upgrade() {
            Some(writer) => writer.post(letter),
            None => {
                if let Letter::Succeeded { results, .. } = letter {
                    release_results(&self.registry, &results);
                }
            }
        }
    }

    /// Tasks waiting to be batched.
    pub fn queue_size(&self) -> u64 {
        self.queue.lock().unwrap().tasks.len() as u64
    }

    /// Fails queued tasks with a closed error and wakes writers waiting for capacity.
    /// Batches already running finish and deliver as usual.
    pub fn close(&self) {
        let batch = {
            let mut queue = self.queue.lock().unwrap();
            queue.closed = true;
            Self::take(&mut queue)
        };
        self.throttle.close();
        for queued in batch {
            self.throttle.release(queued.size);
            let letter = Letter::Failed {
                task: queued.task.id,
                cause: "the changelog storage was closed before the upload started".into(),
            };
            self.deliver(&queued.writer, letter);
        }
    }
}
