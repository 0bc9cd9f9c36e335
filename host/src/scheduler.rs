//! The upload scheduler shared by all writers of a storage (spec §3.2): tasks of every
//! writer queue together and leave as one batch, one file, when the persist delay has
//! passed since the batch's first task or the queued bytes reach the size threshold.
//! Admission waits on the in-flight limit; the batch runs under the retry policy on the
//! upload pool; each task's outcome goes to its own writer's mailbox, after its bytes
//! were returned to the throttle, so a writer blocked on capacity is always woken.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dstl_guest::types::UploadTask;
use tokio::sync::Semaphore;

use crate::background::{Job, Outstanding};
use crate::metrics::Metrics;
use crate::registry::{LocalRegistry, TaskRegistry, WriterId};
use crate::retry::{self, RetryPolicy};
use crate::throttle::Throttle;
use crate::uploader::{Uploader, release_results};
use crate::writer::{Letter, WriterShared};

struct Queued {
    writer: Weak<WriterShared>,
    writer_id: WriterId,
    task: UploadTask,
    size: u64,
    /// Keeps [`Outstanding::wait_idle`] waiting until the outcome is delivered.
    _job: Job,
}

/// Whose task is in a running batch, to deliver its outcome.
struct Recipient {
    writer: Weak<WriterShared>,
    writer_id: WriterId,
    task: u64,
    size: u64,
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
    local_registry: LocalRegistry,
    permits: Arc<Semaphore>,
    /// Batches running, by number: whoever takes a batch's recipients out delivers its
    /// outcome (the batch when it ends, or [`Scheduler::abandon_running`] at close).
    running: Mutex<HashMap<u64, Vec<Recipient>>>,
    next_batch: std::sync::atomic::AtomicU64,
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
        local_registry: LocalRegistry,
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
            local_registry,
            permits: Arc::new(Semaphore::new(threads)),
            running: Mutex::new(HashMap::new()),
            next_batch: std::sync::atomic::AtomicU64::new(0),
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
        writer_id: WriterId,
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
            writer_id,
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
        let number = self
            .next_batch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (recipients, tasks): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|q| {
                let recipient = Recipient {
                    writer: q.writer,
                    writer_id: q.writer_id,
                    task: q.task.id,
                    size: q.size,
                    _job: q._job,
                };
                (recipient, q.task)
            })
            .unzip();
        self.running.lock().unwrap().insert(number, recipients);
        let this = self.clone();
        let job = self.outstanding.start();
        self.runtime.spawn(async move {
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
            let Some(recipients) = this.running.lock().unwrap().remove(&number) else {
                // Abandoned at close: the persists failed already, so the file is nobody's.
                if let Ok(won) = outcome {
                    this.uploader.discard(won.result);
                }
                return;
            };
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
                        // A local copy is claimed by each writer with change sets in it.
                        for (recipient, results) in recipients.iter().zip(&file.per_task) {
                            this.local_registry.hold(
                                recipient.writer_id,
                                local,
                                results.len() as u64,
                            );
                        }
                    }
                    recipients
                        .iter()
                        .zip(file.per_task)
                        .map(|(recipient, results)| Letter::Succeeded {
                            task: recipient.task,
                            results,
                        })
                        .collect()
                }
                Err(cause) => {
                    tracing::warn!(tasks = tasks.len(), %cause, "upload batch failed");
                    recipients
                        .iter()
                        .map(|recipient| Letter::Failed {
                            task: recipient.task,
                            cause: cause.clone(),
                        })
                        .collect()
                }
            };
            // Delivery calls into writers' sandboxes: keep it off the async workers.
            let delivered = tokio::task::spawn_blocking(move || {
                for (recipient, letter) in recipients.into_iter().zip(letters) {
                    this.throttle.release(recipient.size);
                    this.deliver(&recipient.writer, recipient.writer_id, letter);
                }
            });
            if let Err(e) = delivered.await {
                tracing::error!(error = %e, "delivering upload outcomes panicked");
            }
        });
    }

    fn deliver(&self, writer: &Weak<WriterShared>, writer_id: WriterId, letter: Letter) {
        match writer.upgrade() {
            Some(writer) => writer.post(letter),
            None => {
                if let Letter::Succeeded { results, .. } = letter {
                    release_results(&self.registry, &self.local_registry, writer_id, &results);
                }
            }
        }
    }

    /// Fails every task of the batches still running (the storage is closing and will not
    /// wait for them any longer); returns how many tasks were failed.
    pub fn abandon_running(&self) -> usize {
        let running: Vec<Recipient> = self
            .running
            .lock()
            .unwrap()
            .drain()
            .flat_map(|(_, recipients)| recipients)
            .collect();
        let count = running.len();
        for recipient in running {
            self.throttle.release(recipient.size);
            let letter = Letter::Failed {
                task: recipient.task,
                cause: "the changelog storage was closed while the upload was still running; it was abandoned".into(),
            };
            self.deliver(&recipient.writer, recipient.writer_id, letter);
        }
        count
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
            self.deliver(&queued.writer, queued.writer_id, letter);
        }
    }
}
