//! Exports `dstl_proto`'s upload policy through the WIT interface `policy`: the retry
//! machine, the batcher and the append buffer's hand-off rule, for hosts that cannot link
//! dstl-proto (the Node host). Each resource is the proto type behind a `RefCell` (a
//! resource's methods take `&self`), on [`Millis`]; conversions only.

use std::cell::RefCell;
use std::time::Duration;

use dstl_proto::batch::{Batcher, Closed};
use dstl_proto::handoff::{Budget, HandOff};
use dstl_proto::retry::{Action, AttemptResult, Outcome, Retry, RetryPolicy};
use dstl_proto::settings::RetryPolicyKind;
use dstl_proto::time::Millis;

use crate::component::dstl::changelog::types as types_wit;
use crate::component::exports::dstl::changelog::policy::{
    self as wit, GuestBatcher, GuestHandOff, GuestRetry,
};
use crate::component::from_wit_error;

/// `retry`: [`Retry`], with the last failure's cause kept for the message.
/// Its policy is kept for `restart`.
pub struct RetryResource(RefCell<(Retry<Millis>, String)>, RetryPolicy);

impl GuestRetry for RetryResource {
    fn new(policy: wit::RetryPolicy, now: u64) -> Self {
        let kind = match policy.kind {
            wit::RetryPolicyKind::Fixed => RetryPolicyKind::Fixed,
            wit::RetryPolicyKind::None => RetryPolicyKind::None,
        };
        let policy = RetryPolicy::from_settings(
            kind,
            policy.max_attempts,
            Duration::from_millis(policy.timeout_ms),
            Duration::from_millis(policy.delay_ms),
        );
        Self(
            RefCell::new((Retry::new(policy, Millis(now)), String::new())),
            policy,
        )
    }

    fn restart(&self, now: u64) -> wit::RetryStep {
        *self.0.borrow_mut() = (Retry::new(self.1, Millis(now)), String::new());
        self.step()
    }

    fn poll(&self) -> wit::RetryStep {
        self.step()
    }

    fn attempt_finished(
        &self,
        attempt: u32,
        ended: wit::AttemptResult,
        cause: String,
        now: u64,
    ) -> wit::RetryStep {
        {
            let (retry, last_cause) = &mut *self.0.borrow_mut();
            let result = match ended {
                wit::AttemptResult::Succeeded => AttemptResult::Succeeded,
                wit::AttemptResult::Retryable => AttemptResult::Retryable,
                wit::AttemptResult::Fatal => AttemptResult::Fatal,
            };
            let decided = retry.outcome().is_some();
            retry.attempt_finished(attempt, result, Millis(now));
            if !decided && retry.outcome().is_some() {
                *last_cause = cause;
            }
        }
        self.step()
    }

    fn handle_timeout(&self, now: u64) -> wit::RetryStep {
        self.0.borrow_mut().0.handle_timeout(Millis(now));
        self.step()
    }

    fn may_start(&self, attempt: u32) -> Result<(), String> {
        if self.0.borrow().0.may_start(attempt) {
            Ok(())
        } else {
            Err(dstl_proto::retry::not_started_message(attempt))
        }
    }
}

impl RetryResource {
    /// Drains the machine's outputs and reads its timer: `Retry`'s poll methods as one
    /// record.
    fn step(&self) -> wit::RetryStep {
        let (retry, cause) = &mut *self.0.borrow_mut();
        let start = std::iter::from_fn(|| retry.poll_action().map(|Action::Start(n)| n)).collect();
        let outcome = retry.outcome().map(|outcome| match outcome {
            Outcome::Succeeded { attempt, .. } => wit::RetryOutcome::Succeeded(attempt),
            failed => wit::RetryOutcome::Failed(failed.failure(cause).unwrap_or_default()),
        });
        wit::RetryStep {
            start,
            outcome,
            timeout: retry.poll_timeout().map(|t| t.0),
        }
    }
}

/// `batcher`: [`Batcher`] of the host's task numbers.
pub struct BatcherResource(RefCell<Batcher<u64, Millis>>);

impl GuestBatcher for BatcherResource {
    fn new(delay_ms: u64, size_threshold: u64) -> Self {
        Self(RefCell::new(Batcher::new(
            Duration::from_millis(delay_ms),
            size_threshold,
        )))
    }

    fn push(&self, item: u64, size: u64, now: u64) -> Result<wit::BatchStep, String> {
        self.queue(|batcher| batcher.push(item, size, Millis(now)))
    }

    fn push_background(&self, item: u64, size: u64, now: u64) -> Result<wit::BatchStep, String> {
        self.queue(|batcher| batcher.push_background(item, size, Millis(now)))
    }

    fn handle_timeout(&self, now: u64) -> wit::BatchStep {
        let mut batcher = self.0.borrow_mut();
        let leaving = batcher.handle_timeout(Millis(now));
        step(&batcher, leaving)
    }

    fn close(&self) -> wit::Closing {
        wit::Closing {
            queued: self.0.borrow_mut().close(),
            cause: Closed::BeforeUpload.to_string(),
        }
    }
}

impl BatcherResource {
    /// Queues a task (`push` or `push_background`): the step after it, or why the
    /// closed batcher refused it.
    fn queue(
        &self,
        input: impl FnOnce(&mut Batcher<u64, Millis>) -> Result<Option<Vec<u64>>, Closed>,
    ) -> Result<wit::BatchStep, String> {
        let mut batcher = self.0.borrow_mut();
        let leaving = input(&mut batcher).map_err(|closed| closed.to_string())?;
        Ok(step(&batcher, leaving))
    }
}

/// The batch that leaves after an input, and the batcher's timer, as one record.
fn step(batcher: &Batcher<u64, Millis>, leaving: Option<Vec<u64>>) -> wit::BatchStep {
    wit::BatchStep {
        leaving,
        timeout: batcher.poll_timeout().map(|t| t.0),
    }
}

/// `hand-off`: [`HandOff`].
pub struct HandOffResource(RefCell<HandOff>);

fn budget(b: Budget) -> wit::Budget {
    wit::Budget {
        bytes: b.bytes,
        changes: b.changes,
        alone_at: b.alone_at,
    }
}

impl GuestHandOff for HandOffResource {
    fn new(threshold: u64) -> Self {
        Self(RefCell::new(HandOff::new(threshold)))
    }

    fn handed_over(&self, answer: Result<u64, types_wit::WriterError>) -> wit::Budget {
        let answer = answer.map_err(from_wit_error);
        let mut rule = self.0.borrow_mut();
        rule.handed_over(answer.as_ref().copied());
        budget(rule.budget())
    }

    fn rolled_over(&self) -> wit::Budget {
        let mut rule = self.0.borrow_mut();
        rule.rolled_over();
        budget(rule.budget())
    }

    fn persisted(&self, error: Option<types_wit::WriterError>) -> wit::Budget {
        let mut rule = self.0.borrow_mut();
        rule.persisted(error.map(from_wit_error).as_ref());
        budget(rule.budget())
    }

    fn budget(&self) -> wit::Budget {
        budget(self.0.borrow().budget())
    }
}
