//! The retry policy of one upload (Flink's `fixed` and `none`) as a sans-IO state machine:
//! which attempt starts when, when an attempt has run too long and a speculative one
//! starts beside it, how long to wait after a failure, and which attempt wins. A host
//! drives it with the outcomes of the attempts it runs and with the time; the machine
//! never reads a clock, sleeps or runs anything.
//!
//! The kinds of methods, as in quinn-proto's `Connection`:
//!
//! - **inputs**: [`Retry::attempt_finished`] (an attempt ended), [`Retry::handle_timeout`]
//!   (the time [`Retry::poll_timeout`] named has come);
//! - **outputs**: [`Retry::poll_action`] (start an attempt) and [`Retry::outcome`] (the
//!   decision, once there is one);
//! - **timers**: [`Retry::poll_timeout`], the next instant the machine must be told of;
//! - **queries**: [`Retry::may_start`], [`Retry::startable`], [`Retry::attempts`].
//!
//! Rules (ARCHITECTURE.md, "Where dstl differs from Flink", F8):
//!
//! - Attempt 1 starts at once. An attempt that runs past the per-attempt timeout is
//!   *finalized*: the next attempt starts beside it at once (a speculative attempt), or,
//!   after the last allowed attempt, the upload fails as timed out.
//! - A failed attempt that is not finalized is retried after the policy's delay when the
//!   failure is retryable and attempts remain; otherwise the upload fails.
//! - The first attempt to succeed wins, a finalized one too; every later result loses
//!   (the host deletes what a losing attempt wrote).
//! - An attempt's deadline runs from when it is started (scheduled), not from when the
//!   host found a thread for it: a host that waited too long for one must not run it
//!   ([`Retry::may_start`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::settings::RetryPolicyKind;
use crate::time::Time;

/// When to give up, and how long to wait in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts including the first; 1 for Flink's `none`.
    pub max_attempts: u32,
    /// Per-attempt timeout; `None` waits forever (Flink's `none`).
    pub timeout: Option<Duration>,
    /// Pause after a failed attempt before the next one.
    pub delay: Duration,
}

impl RetryPolicy {
    /// Flink's policies from their settings (`dstl.dfs.upload.retry-policy`,
    /// `max-attempts`, `timeout`, `next-attempt-delay`): `fixed` makes `max_attempts`
    /// attempts, each with `timeout` (zero waits forever) and `delay` after a failure;
    /// `none` makes one attempt and waits for it forever, whatever the others say.
    pub fn from_settings(
        kind: RetryPolicyKind,
        max_attempts: u32,
        timeout: Duration,
        delay: Duration,
    ) -> Self {
        match kind {
            RetryPolicyKind::None => Self {
                max_attempts: 1,
                timeout: None,
                delay: Duration::ZERO,
            },
            RetryPolicyKind::Fixed => Self {
                max_attempts,
                timeout: Some(timeout).filter(|t| !t.is_zero()),
                delay,
            },
        }
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptResult {
    /// The file is written.
    Succeeded,
    /// It failed in a way another attempt may not (an I/O error of the store).
    Retryable,
    /// It failed in a way no retry helps (it panicked, the host is shutting down).
    Fatal,
}

/// What the host must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Start attempt `n` (numbered from 1).
    Start(u32),
}

/// The decision about an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Attempt `attempt` won; `attempts` had been started by then.
    Succeeded {
        /// The winning attempt.
        attempt: u32,
        /// Attempts started.
        attempts: u32,
    },
    /// Attempt `attempt`, the last one the policy allowed (or one that failed fatally),
    /// failed.
    Failed {
        /// The attempt that failed last.
        attempt: u32,
        /// Attempts started.
        attempts: u32,
    },
    /// Attempt `attempt`, the last one the policy allowed, ran past the timeout.
    TimedOut {
        /// The attempt that timed out last.
        attempt: u32,
        /// Attempts started.
        attempts: u32,
        /// The per-attempt timeout.
        timeout: Duration,
    },
}

/// The retry state of one upload, on instants of type `T` (see [`crate::time`]).
#[derive(Debug)]
pub struct Retry<T: Time = Instant> {
    policy: RetryPolicy,
    /// The one attempt not yet finalized (by its failure or its timeout), if one runs.
    current: Option<u32>,
    /// When `current` times out.
    deadline: Option<T>,
    /// The attempt to start after a failure's delay, and when.
    retry_at: Option<(u32, T)>,
    /// Attempts started.
    started: u32,
    actions: VecDeque<Action>,
    outcome: Option<Outcome>,
}

impl Outcome {
    /// The message of a failed upload, in one wording for every host: attempts started,
    /// the last attempt, and why it failed (`cause`: the host's words for that attempt's
    /// error; a timeout names the timeout instead). `None` for a success.
    pub fn failure(&self, cause: &dyn std::fmt::Display) -> Option<String> {
        match *self {
            Outcome::Succeeded { .. } => None,
            Outcome::Failed { attempt, attempts } => Some(failed_message(attempts, attempt, cause)),
            Outcome::TimedOut {
                attempt,
                attempts,
                timeout,
            } => Some(timed_out_message(attempts, attempt, timeout)),
        }
    }
}

/// The cause an attempt is reported with when it may no longer start
/// ([`Retry::may_start`]: it waited for a thread past its deadline, or the upload was
/// decided meanwhile).
pub fn not_started_message(attempt: u32) -> String {
    format!("attempt {attempt} timed out before it started")
}

/// An upload whose last attempt, `attempt` of `attempts` started, failed with `cause`.
pub fn failed_message(attempts: u32, attempt: u32, cause: &dyn std::fmt::Display) -> String {
    format!("upload failed after {attempts} attempts; last: attempt {attempt}: {cause}")
}

/// An upload whose last attempt, `attempt` of `attempts` started, ran past `timeout`.
pub fn timed_out_message(attempts: u32, attempt: u32, timeout: Duration) -> String {
    format!(
        "upload failed after {attempts} attempts; last: attempt {attempt} timed out after {} ms",
        timeout.as_millis()
    )
}

impl<T: Time> Retry<T> {
    /// The retry state of an upload that begins at `now`: attempt 1 is to start.
    pub fn new(policy: RetryPolicy, now: T) -> Self {
        let mut retry = Self {
            policy: RetryPolicy {
                max_attempts: policy.max_attempts.max(1),
                ..policy
            },
            current: None,
            deadline: None,
            retry_at: None,
            started: 0,
            actions: VecDeque::new(),
            outcome: None,
        };
        retry.start(1, now);
        retry
    }

    fn start(&mut self, n: u32, now: T) {
        self.started = self.started.max(n);
        self.current = Some(n);
        self.deadline = self.policy.timeout.map(|t| now + t);
        self.actions.push_back(Action::Start(n));
    }

    /// Input: attempt `n` ended with `result` at `now`. Results after the decision (of
    /// attempts that lost) change nothing.
    pub fn attempt_finished(&mut self, n: u32, result: AttemptResult, now: T) {
        if self.outcome.is_some() {
            return;
        }
        let retryable = match result {
            AttemptResult::Succeeded => {
                self.decide(Outcome::Succeeded {
                    attempt: n,
                    attempts: self.started,
                });
                return;
            }
            // A finalized attempt (it timed out before) has no say any more.
            _ if self.current != Some(n) => return,
            AttemptResult::Retryable => true,
            AttemptResult::Fatal => false,
        };
        self.current = None;
        self.deadline = None;
        if !retryable || n >= self.policy.max_attempts {
            self.decide(Outcome::Failed {
                attempt: n,
                attempts: self.started,
            });
        } else if self.policy.delay.is_zero() {
            self.start(n + 1, now);
        } else {
            self.retry_at = Some((n + 1, now + self.policy.delay));
        }
    }

    /// Input: the time is `now` (at least the instant [`Retry::poll_timeout`] named).
    pub fn handle_timeout(&mut self, now: T) {
        if self.outcome.is_some() {
            return;
        }
        if let (Some(n), Some(deadline)) = (self.current, self.deadline)
            && now >= deadline
        {
            self.current = None;
            self.deadline = None;
            if n >= self.policy.max_attempts {
                self.decide(Outcome::TimedOut {
                    attempt: n,
                    attempts: self.started,
                    timeout: self.policy.timeout.unwrap_or_default(),
                });
                return;
            }
            self.start(n + 1, now);
        }
        if let Some((n, at)) = self.retry_at
            && now >= at
        {
            self.retry_at = None;
            self.start(n, now);
        }
    }

    fn decide(&mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
        self.current = None;
        self.deadline = None;
        self.retry_at = None;
        self.actions.clear();
    }

    /// Output: the next thing to do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Output: the decision, once made.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// Timer: when [`Retry::handle_timeout`] must be called next; `None` when nothing
    /// waits on the time.
    pub fn poll_timeout(&self) -> Option<T> {
        if self.outcome.is_some() {
            return None;
        }
        match (self.deadline, self.retry_at.map(|(_, at)| at)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Query: whether attempt `n` may still start. An attempt the host could not start
    /// before it was finalized (it waited for a thread past its deadline), or before the
    /// upload was decided, must not run.
    pub fn may_start(&self, n: u32) -> bool {
        self.startable() == Some(n)
    }

    /// Query: the one attempt that may still start (see [`Retry::may_start`]), if any.
    pub fn startable(&self) -> Option<u32> {
        self.current.filter(|_| self.outcome.is_none())
    }

    /// Query: attempts started so far.
    pub fn attempts(&self) -> u32 {
        self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Millis;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy(max_attempts: u32, timeout: Option<u64>, delay: u64) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            timeout: timeout.map(ms),
            delay: ms(delay),
        }
    }

    /// Drains the actions.
    fn started(retry: &mut Retry<Millis>) -> Vec<u32> {
        std::iter::from_fn(|| retry.poll_action())
            .map(|Action::Start(n)| n)
            .collect()
    }

    #[test]
    fn the_first_attempt_starts_at_once_and_a_success_wins() {
        let t0 = Millis(0);
        let mut retry = Retry::new(policy(3, Some(1000), 500), t0);
        assert_eq!(started(&mut retry), [1]);
        assert_eq!(retry.poll_timeout(), Some(t0 + ms(1000)));
        retry.attempt_finished(1, AttemptResult::Succeeded, t0 + ms(10));
        assert_eq!(
            retry.outcome(),
            Some(Outcome::Succeeded {
                attempt: 1,
                attempts: 1
            })
        );
        assert_eq!(retry.poll_timeout(), None);
    }

    #[test]
    fn a_retryable_failure_waits_the_delay_then_retries_until_the_last_attempt() {
        let t0 = Millis(0);
        let mut retry = Retry::new(policy(3, Some(1000), 500), t0);
        started(&mut retry);
        retry.attempt_finished(1, AttemptResult::Retryable, t0 + ms(20));
        assert_eq!(started(&mut retry), Vec::<u32>::new(), "waits the delay");
        assert_eq!(retry.poll_timeout(), Some(t0 + ms(520)));
        retry.handle_timeout(t0 + ms(519));
        assert!(started(&mut retry).is_empty(), "not yet");
        retry.handle_timeout(t0 + ms(520));
        assert_eq!(started(&mut retry), [2]);
        assert_eq!(
            retry.poll_timeout(),
            Some(t0 + ms(1520)),
            "its own deadline"
        );
        retry.attempt_finished(2, AttemptResult::Retryable, t0 + ms(600));
        retry.handle_timeout(t0 + ms(1100));
        assert_eq!(started(&mut retry), [3]);
        retry.attempt_finished(3, AttemptResult::Retryable, t0 + ms(1200));
        assert_eq!(
            retry.outcome(),
            Some(Outcome::Failed {
                attempt: 3,
                attempts: 3
            })
        );
        assert!(started(&mut retry).is_empty());
    }

    #[test]
    fn without_a_delay_the_next_attempt_starts_at_once() {
        let t0 = Millis(0);
        let mut retry = Retry::new(policy(2, None, 0), t0);
        started(&mut retry);
        assert_eq!(retry.poll_timeout(), None, "no timeout, no delay: no timer");
        retry.attempt_finished(1, AttemptResult::Retryable, t0);
        assert_eq!(started(&mut retry), [2]);
    }

    #[test]
    fn a_fatal_failure_ends_the_upload_at_once() {
        let t0 = Millis(0);
        let mut retry = Retry::new(policy(5, Some(1000), 10), t0);
        started(&mut retry);
        retry.attempt_finished(1, AttemptResult::Fatal, t0);
        assert_eq!(
            retry.outcome(),
            Some(Outcome::Failed {
                attempt: 1,
                attempts: 1
            })
        );
    }

    #[test]
    fn an_attempt_past_its_timeout_gets_a_speculative_successor_and_may_still_win() {
        let t0 = Millis(0);
        let mut retry = Retry::new(policy(3, Some(100), 500), t0);
        started(&mut retry);
        retry.handle_timeout(t0 + ms(100));
        assert_eq!(
            started(&mut retry),
            [2],
            "started at once, beside attempt 1"
        );
        assert!(!retry.may_start(1) && retry.may_start(2));
        // The finalized attempt's failure has no say...
        retry.attempt_finished(1, AttemptResult::Retryable, t0 + ms(150));
        assert_eq!(retry.outcome(), None);
        assert!(started(&mut retry).is_empty());
        // ... but a late success of it still wins.
        retry.attempt_finished(1, AttemptResult::Succeeded, t0 + ms(160));
        assert_eq!(
            retry.outcome(),
            Some(Outcome::Succeeded {
                attempt: 1,
                attempts: 2
            })
        );
        // Later results lose.
        retry.attempt_finished(2, AttemptResult::Succeeded, t0 + ms(170));
        assert_eq!(
            retry.outcome(),
            Some(Outcome::Succeeded {
                attempt: 1,
                attempts: 2
            })
        );
        assert!(!retry.may_start(2));
    }

    #[test]
    fn the_last_attempt_timing_out_fails_the_upload_as_timed_out() {
        let t0 = Millis(0);
        let mut retry = Retry::new(policy(2, Some(100), 500), t0);
        started(&mut retry);
        retry.handle_timeout(t0 + ms(100));
        assert_eq!(started(&mut retry), [2]);
        retry.handle_timeout(t0 + ms(199));
        assert_eq!(retry.outcome(), None);
        retry.handle_timeout(t0 + ms(200));
        assert_eq!(
            retry.outcome(),
            Some(Outcome::TimedOut {
                attempt: 2,
                attempts: 2,
                timeout: ms(100)
            })
        );
    }

    #[test]
    fn a_deadline_counts_from_the_start_not_from_when_a_thread_was_found() {
        // The host could not run attempt 1 before its deadline: it must not run it.
        let t0 = Millis(0);
        let mut retry = Retry::new(policy(2, Some(100), 0), t0);
        started(&mut retry);
        retry.handle_timeout(t0 + ms(100));
        assert!(!retry.may_start(1));
        assert_eq!(started(&mut retry), [2]);
    }

    #[test]
    fn the_settings_make_flinks_policies() {
        let (timeout, delay) = (ms(1000), ms(500));
        assert_eq!(
            RetryPolicy::from_settings(RetryPolicyKind::Fixed, 3, timeout, delay),
            policy(3, Some(1000), 500)
        );
        assert_eq!(
            RetryPolicy::from_settings(RetryPolicyKind::Fixed, 3, Duration::ZERO, delay).timeout,
            None,
            "a zero timeout waits forever"
        );
        assert_eq!(
            RetryPolicy::from_settings(RetryPolicyKind::None, 3, timeout, delay),
            policy(1, None, 0)
        );
    }

    #[test]
    fn flinks_none_policy_makes_one_attempt_and_waits_forever() {
        let t0 = Millis(0);
        let mut retry = Retry::new(policy(1, None, 0), t0);
        assert_eq!(started(&mut retry), [1]);
        assert_eq!(retry.poll_timeout(), None);
        retry.handle_timeout(t0 + ms(1_000_000));
        assert_eq!(retry.outcome(), None);
        retry.attempt_finished(1, AttemptResult::Retryable, t0 + ms(1_000_001));
        assert_eq!(
            retry.outcome(),
            Some(Outcome::Failed {
                attempt: 1,
                attempts: 1
            })
        );
    }
}
