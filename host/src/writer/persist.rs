//! Persists as futures: [`PersistFuture`] for the caller, and the tickets the writer keeps
//! to complete them when the guest reports a pending persist finished.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use dstl_proto::types::{PersistCompletion, SnapshotResult, WriterError};
use tokio::sync::oneshot;

use crate::error::Error;
use crate::telemetry::WriterMetrics;
use crate::upload::UploadError;

/// What a persist ends with.
pub(crate) type Outcome = Result<SnapshotResult, Error>;

/// Pending persists of one writer, by the guest's ticket, with when they were made.
#[derive(Default)]
pub(crate) struct Tickets {
    pending: HashMap<u64, (oneshot::Sender<Outcome>, Instant)>,
    metrics: WriterMetrics,
}

impl Tickets {
    /// Tickets whose outcomes are counted in `metrics`.
    pub fn new(metrics: WriterMetrics) -> Self {
        Self {
            pending: HashMap::new(),
            metrics,
        }
    }

    /// A future for the persist the guest answered with `ticket`.
    pub fn wait_for(&mut self, writer: &str, ticket: u64) -> PersistFuture {
        let (tx, rx) = oneshot::channel();
        self.pending.insert(ticket, (tx, Instant::now()));
        PersistFuture::waiting(writer.to_string(), rx)
    }

    /// Completes the persists the guest finished; those that failed because an upload
    /// failed fail with its typed cause (from `failures`), and a snapshot that
    /// `acknowledge` refuses fails with its error.
    pub fn resolve(
        &mut self,
        writer: &str,
        completions: Vec<PersistCompletion>,
        failures: &UploadFailures,
        acknowledge: &dyn Fn(&SnapshotResult) -> Result<(), Error>,
    ) {
        for completion in completions {
            let Some((tx, started)) = self.pending.remove(&completion.ticket) else {
                tracing::warn!(
                    writer,
                    ticket = completion.ticket,
                    "completion for an unknown persist"
                );
                continue;
            };
            let outcome = completion
                .outcome
                .map_err(|source| {
                    let upload = failures.cause_of(&source);
                    Error::from_guest(writer, source, upload)
                })
                .and_then(|snapshot| acknowledge(&snapshot).map(|()| snapshot));
            match &outcome {
                Ok(_) => self.metrics.persist_succeeded(started),
                Err(_) => self.metrics.persist_failed(),
            }
            // The caller may have dropped the future; that is fine.
            let _ = tx.send(outcome);
        }
    }

    /// Fails every pending persist with `error`.
    pub fn fail_all(&mut self, error: &Error) {
        for (_, (tx, _)) in self.pending.drain() {
            self.metrics.persist_failed();
            let _ = tx.send(Err(error.clone()));
        }
    }

    /// Forgets every pending persist: their futures see the writer dropped.
    pub fn clear(&mut self) {
        self.pending.clear();
    }
}

/// Why this writer's upload tasks failed, by task: the guest's errors name a failed task
/// (`UploadFailure::Failed`), and the uploader's typed error is the host's. The most
/// recent [`UploadFailures::KEPT`] are kept: failures are rare, and an error naming an
/// older one still names its task.
#[derive(Default)]
pub(crate) struct UploadFailures(VecDeque<(u64, UploadError)>);

impl UploadFailures {
    /// Failures kept.
    const KEPT: usize = 64;

    /// Task `task` failed with `error`.
    pub fn record(&mut self, task: u64, error: UploadError) {
        if self.0.len() == Self::KEPT {
            self.0.pop_front();
        }
        self.0.push_back((task, error));
    }

    /// Why the failed task `error` names failed, if it is among those kept.
    pub fn cause_of(&self, error: &WriterError) -> Option<UploadError> {
        let task = error.failed_task()?;
        let (_, cause) = self.0.iter().rev().find(|(t, _)| *t == task)?;
        Some(cause.clone())
    }
}

/// The outcome of a persist: ready at once, or completed by the writer's mailbox.
/// `.await` it, block on it with [`PersistFuture::wait`], or poll it with
/// [`PersistFuture::try_wait`]; once known, the outcome stays available to all three.
pub struct PersistFuture {
    state: FutureState,
    /// The outcome was known when `persist` returned.
    immediate: bool,
}

enum FutureState {
    Ready(Outcome),
    Waiting {
        writer: String,
        rx: oneshot::Receiver<Outcome>,
    },
}

impl PersistFuture {
    pub(crate) fn ready(outcome: Outcome) -> Self {
        Self {
            state: FutureState::Ready(outcome),
            immediate: true,
        }
    }

    fn waiting(writer: String, rx: oneshot::Receiver<Outcome>) -> Self {
        Self {
            state: FutureState::Waiting { writer, rx },
            immediate: false,
        }
    }

    /// The outcome if the persist has completed, without waiting; `None` while it runs.
    /// The outcome is kept: a later `try_wait`, `wait` or `.await` returns it again.
    pub fn try_wait(&mut self) -> Option<Outcome> {
        if let FutureState::Waiting { writer, rx } = &mut self.state {
            let outcome = match rx.try_recv() {
                Ok(outcome) => outcome,
                Err(oneshot::error::TryRecvError::Empty) => return None,
                Err(oneshot::error::TryRecvError::Closed) => Err(Error::dropped(writer)),
            };
            self.state = FutureState::Ready(outcome);
        }
        match &self.state {
            FutureState::Ready(outcome) => Some(outcome.clone()),
            FutureState::Waiting { .. } => None,
        }
    }

    /// True if the result was available when `persist` returned (nothing to upload).
    pub fn is_immediate(&self) -> bool {
        self.immediate
    }

    /// Blocks the calling thread until the persist completes. In async code, `.await`
    /// the future instead (blocking inside a runtime is refused by tokio).
    pub fn wait(self) -> Outcome {
        match self.state {
            FutureState::Ready(outcome) => outcome,
            FutureState::Waiting { writer, rx } => rx
                .blocking_recv()
                .unwrap_or_else(|_| Err(Error::dropped(&writer))),
        }
    }
}

impl std::fmt::Debug for PersistFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            FutureState::Ready(outcome) => f
                .debug_tuple("PersistFuture::Ready")
                .field(outcome)
                .finish(),
            FutureState::Waiting { writer, .. } => f
                .debug_struct("PersistFuture::Waiting")
                .field("writer", writer)
                .finish(),
        }
    }
}

impl Future for PersistFuture {
    type Output = Outcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let this = &mut *self;
        if let FutureState::Waiting { writer, rx } = &mut this.state {
            let outcome = match Pin::new(rx).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(received) => received.unwrap_or_else(|_| Err(Error::dropped(writer))),
            };
            this.state = FutureState::Ready(outcome);
        }
        match &this.state {
            FutureState::Ready(outcome) => Poll::Ready(outcome.clone()),
            FutureState::Waiting { .. } => Poll::Pending,
        }
    }
}
