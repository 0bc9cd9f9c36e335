//! Retries with per-attempt timeouts, without Flink's holes (ARCHITECTURE.md, "Where
//! dstl differs from Flink"): the decisions are `dstl_proto::retry::Retry`'s (when an
//! attempt starts, when a speculative one starts beside an attempt that runs too long,
//! the delay after a failure, which attempt wins); this is its tokio driver.
//!
//! - `fixed`: every attempt gets the same timeout; a timed-out attempt is *not* cancelled
//!   (a blocking write cannot be), the next attempt starts at once, and whichever attempt
//!   succeeds first wins; every other attempt's result is discarded when it arrives.
//! - An I/O failure is retried after `next-attempt-delay` (Flink fails the tasks on the
//!   first I/O error, so its retries only ever help timeouts).
//! - The last allowed attempt failing or timing out fails the action, naming the number
//!   of attempts and the last cause; results of older attempts still running are
//!   discarded when they arrive.
//! - Attempts wait for one of `num-threads` permits, so hung attempts occupy threads
//!   exactly as in Flink; but an attempt's timeout runs from when it is scheduled,
//!   waiting for a permit included, so a store that hangs fails an upload within
//!   `max-attempts × timeout` (plus delays) even when hung attempts hold every thread
//!   (Flink's deadline starts on the thread, so there it never fires). An attempt that
//!   has timed out before it got a thread does not start at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) use dstl_proto::retry::RetryPolicy;
use dstl_proto::retry::{Action, AttemptResult, Outcome, Retry};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::UploadError;
use crate::background::Job;
use crate::config::Config;

/// Why one attempt failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AttemptError {
    /// The store failed to write the file (or the file could not be encoded): retried
    /// after `dstl.dfs.upload.next-attempt-delay` while attempts remain.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The failure.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// An attempt that panicked, or the upload executor shut down with the storage:
    /// fails the upload at once, without further attempts.
    #[error("{0}")]
    Fatal(String),
}

impl AttemptError {
    /// The store's I/O error, if this is one.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            AttemptError::Io { source, .. } => Some(source),
            AttemptError::Fatal(_) => None,
        }
    }

    /// An I/O failure while doing `context`.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        AttemptError::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }
}

/// The policy `config` names (`dstl.dfs.upload.retry-policy` and its keys).
pub(crate) fn policy_from_config(config: &Config) -> RetryPolicy {
    RetryPolicy::from_settings(
        config.retry_policy,
        config.max_attempts,
        config.upload_timeout,
        config.next_attempt_delay,
    )
}

/// The winning result with the number of the attempt that produced it and how many
/// attempts had started by then.
pub(crate) struct Success<R> {
    pub result: R,
    pub attempt: u32,
    pub total_attempts: u32,
}

/// Runs `attempt(n)` (a blocking function) under `policy` until one attempt succeeds or
/// the policy gives up. Results that lose are passed to `discard`, also after this
/// returns; `job` keeps the storage from reporting idle until they have been.
pub(crate) async fn execute<R, A, D>(
    policy: RetryPolicy,
    permits: Arc<Semaphore>,
    attempt: A,
    discard: D,
    job: Job,
) -> Result<Success<R>, UploadError>
where
    R: Send + 'static,
    A: Fn(u32) -> Result<R, AttemptError> + Send + Sync + 'static,
    D: Fn(R) + Send + 'static,
{
    let attempt = Arc::new(attempt);
    // The number of the one attempt that may still start (`Retry::startable`), for the
    // attempt tasks to read when they get their permit: an attempt finalized while it
    // waited, or after the upload was decided, releases the permit without running.
    let live = Arc::new(AtomicU32::new(0));
    let mut running: JoinSet<(u32, Result<R, AttemptError>)> = JoinSet::new();
    let mut retry = Retry::new(policy, Instant::now().into_std());
    // Why each failed attempt failed, for the error that names the last one.
    let mut errors: HashMap<u32, AttemptError> = HashMap::new();
    let outcome = loop {
        // Before any attempt task can look at it: the attempt that may start now.
        live.store(retry.startable().unwrap_or(0), Ordering::SeqCst);
        while let Some(Action::Start(n)) = retry.poll_action() {
            let attempt = attempt.clone();
            let permits = permits.clone();
            let live = live.clone();
            running.spawn(async move {
                let result = match permits.acquire_owned().await {
                    Err(_) => Err(AttemptError::Fatal(
                        "the upload executor was shut down".into(),
                    )),
                    Ok(_) if live.load(Ordering::SeqCst) != n => Err(AttemptError::Fatal(
                        dstl_proto::retry::not_started_message(n),
                    )),
                    Ok(_permit) => tokio::task::spawn_blocking(move || attempt(n))
                        .await
                        .unwrap_or_else(|e| {
                            Err(AttemptError::Fatal(format!("attempt {n} panicked: {e}")))
                        }),
                };
                (n, result)
            });
        }
        match retry.outcome() {
            Some(Outcome::Failed { attempt, attempts }) => {
                let cause = errors
                    .remove(&attempt)
                    .unwrap_or_else(|| AttemptError::Fatal(format!("attempt {attempt} failed")));
                break Err(UploadError::Failed {
                    attempts,
                    attempt,
                    cause,
                });
            }
            Some(Outcome::TimedOut {
                attempt,
                attempts,
                timeout,
            }) => {
                break Err(UploadError::TimedOut {
                    attempts,
                    attempt,
                    timeout,
                });
            }
            // A success is taken where its result arrives, below.
            Some(Outcome::Succeeded { .. }) | None => {}
        }
        let timer = retry.poll_timeout().map(Instant::from_std);
        tokio::select! {
            Some(joined) = running.join_next() => {
                let (n, result) = joined.expect("attempt tasks catch their panics");
                let now = Instant::now().into_std();
                match result {
                    Ok(result) => {
                        retry.attempt_finished(n, AttemptResult::Succeeded, now);
                        match retry.outcome() {
                            Some(Outcome::Succeeded { attempt, attempts }) if attempt == n => {
                                break Ok(Success { result, attempt, total_attempts: attempts });
                            }
                            // Decided before: this one lost.
                            _ => discard(result),
                        }
                    }
                    Err(error) => {
                        let class = match error {
                            AttemptError::Io { .. } => AttemptResult::Retryable,
                            AttemptError::Fatal(_) => AttemptResult::Fatal,
                        };
                        errors.insert(n, error);
                        retry.attempt_finished(n, class, now);
                    }
                }
            }
            _ = tokio::time::sleep_until(timer.unwrap_or_else(Instant::now)), if timer.is_some() => {
                retry.handle_timeout(Instant::now().into_std());
            }
        }
    };
    // Attempts still waiting for a permit do not start any more.
    live.store(0, Ordering::SeqCst);
    if !running.is_empty() {
        // Attempts still running lose; their results are discarded when they finish.
        tokio::spawn(async move {
            let _job = job;
            while let Some(joined) = running.join_next().await {
                if let Ok((_, Ok(result))) = joined {
                    discard(result);
                }
            }
        });
    }
    outcome
}

#[cfg(test)]
mod tests {
    //! The driver on simulated time: a current-thread runtime whose clock is paused. An
    //! attempt runs on a blocking thread, and tokio does not move a paused clock by itself
    //! while one runs, so a test with attempts that hang moves it itself, once the attempts
    //! it expects have started (they report through a channel); with none running, tokio
    //! moves it to the next timer at once. Every duration below is simulated.

    use super::*;
    use crate::background::Outstanding;
    use crate::sync::{CondvarExt, LockExt};
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;
    use tokio::sync::mpsc;

    fn io(message: &str) -> AttemptError {
        AttemptError::io("writing", std::io::Error::other(message.to_string()))
    }

    fn policy(max_attempts: u32, timeout: Option<Duration>, delay: Duration) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            timeout,
            delay,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Holds hanging attempts until opened.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<bool>, Condvar)>);

    impl Gate {
        fn wait(&self) {
            let (open, cv) = &*self.0;
            let mut open = open.locked();
            while !*open {
                open = cv.wait_locked(open);
            }
        }

        fn open(&self) {
            *self.0.0.locked() = true;
            self.0.1.notify_all();
        }
    }

    /// What a test sees of one upload: the attempts as they start (number, simulated
    /// instant), and the discarded results.
    struct Upload<R> {
        started: mpsc::UnboundedReceiver<(u32, Instant)>,
        discarded: Arc<Mutex<Vec<R>>>,
        outstanding: Outstanding,
    }

    impl<R> Upload<R> {
        /// The next attempt to start, and when.
        async fn next_start(&mut self) -> (u32, Instant) {
            self.started.recv().await.expect("an attempt starts")
        }

        /// Waits (off the runtime's thread) until late results were discarded.
        async fn idle(&self) -> Vec<R>
        where
            R: Clone + Send + 'static,
        {
            let outstanding = self.outstanding.clone();
            tokio::task::spawn_blocking(move || outstanding.wait_idle())
                .await
                .unwrap();
            self.discarded.locked().clone()
        }
    }

    /// Runs `test` on a paused clock with an upload under `policy` on `threads` threads,
    /// whose attempt `n` is `attempt(n)`; the test gets the upload's handle (a task) and
    /// what it sees of it.
    fn simulate<R, T>(
        policy: RetryPolicy,
        threads: usize,
        attempt: impl Fn(u32) -> Result<R, AttemptError> + Send + Sync + 'static,
        test: impl AsyncFnOnce(tokio::task::JoinHandle<Result<Success<R>, UploadError>>, Upload<R>) -> T,
    ) -> T
    where
        R: Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async move {
            let (tx, started) = mpsc::unbounded_channel();
            let discarded = Arc::new(Mutex::new(Vec::new()));
            let outstanding = Outstanding::default();
            let sink = discarded.clone();
            let upload = tokio::spawn(execute(
                policy,
                Arc::new(Semaphore::new(threads)),
                move |n| {
                    let _ = tx.send((n, Instant::now()));
                    attempt(n)
                },
                move |r| sink.locked().push(r),
                outstanding.start(),
            ));
            let seen = Upload {
                started,
                discarded,
                outstanding,
            };
            test(upload, seen).await
        })
    }

    #[test]
    fn none_policy_makes_one_attempt() {
        let e = simulate(
            policy_from_config(
                &Config::new()
                    .with("dstl.dfs.upload.retry-policy", "none")
                    .unwrap(),
            ),
            1,
            |_| -> Result<(), _> { Err(io("disk on fire")) },
            async |upload, mut seen| {
                let e = upload.await.unwrap().err().unwrap();
                assert_eq!(seen.next_start().await.0, 1);
                assert!(seen.started.try_recv().is_err(), "one attempt only");
                e
            },
        );
        assert!(
            matches!(
                e,
                UploadError::Failed {
                    attempts: 1,
                    attempt: 1,
                    cause: AttemptError::Io { .. }
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "upload failed after 1 attempts; last: attempt 1: writing: disk on fire"
        );
    }

    #[test]
    fn fixed_policy_retries_io_failures_up_to_the_limit() {
        let e = simulate(
            policy(5, None, Duration::ZERO),
            1,
            |n| -> Result<(), _> { Err(io(&format!("failure {n}"))) },
            async |upload, mut seen| {
                let e = upload.await.unwrap().err().unwrap();
                for n in 1..=5 {
                    assert_eq!(seen.next_start().await.0, n);
                }
                e
            },
        );
        assert!(matches!(
            e,
            UploadError::Failed {
                attempts: 5,
                attempt: 5,
                ..
            }
        ));
        assert!(
            e.to_string().ends_with("attempt 5: writing: failure 5"),
            "{e}"
        );
    }

    #[test]
    fn success_after_failures_reports_the_winning_attempt() {
        let won = simulate(
            policy(6, None, Duration::ZERO),
            1,
            |n| if n <= 2 { Err(io("no")) } else { Ok(n) },
            async |upload, _| upload.await.unwrap().ok().unwrap(),
        );
        assert_eq!((won.result, won.attempt, won.total_attempts), (3, 3, 3));
    }

    #[test]
    fn fatal_errors_are_not_retried() {
        let e = simulate(
            policy(u32::MAX, None, Duration::ZERO),
            1,
            |_| -> Result<(), _> { Err(AttemptError::Fatal("bug".into())) },
            async |upload, mut seen| {
                let e = upload.await.unwrap().err().unwrap();
                assert_eq!(seen.next_start().await.0, 1);
                assert!(seen.started.try_recv().is_err(), "no retry");
                e
            },
        );
        assert!(matches!(
            e,
            UploadError::Failed {
                cause: AttemptError::Fatal(_),
                ..
            }
        ));
    }

    #[test]
    fn retry_waits_the_configured_delay() {
        simulate(
            policy(3, None, ms(123)),
            1,
            |n| if n == 1 { Err(io("once")) } else { Ok(()) },
            async |upload, mut seen| {
                assert_eq!(upload.await.unwrap().ok().unwrap().attempt, 2);
                let (_, first) = seen.next_start().await;
                let (n, second) = seen.next_start().await;
                assert_eq!(n, 2);
                assert_eq!(second - first, ms(123));
            },
        );
    }

    #[test]
    fn timed_out_attempts_lose_and_are_discarded() {
        // Attempts 1..=6 hang until attempt 7 has won; 7 returns at once.
        let gate = Gate::default();
        let g = gate.clone();
        let (won, discarded) = simulate(
            policy(7, Some(ms(5)), Duration::ZERO),
            8,
            move |n| {
                if n < 7 {
                    g.wait();
                }
                Ok(n)
            },
            async |upload, mut seen| {
                for n in 1..=6 {
                    assert_eq!(seen.next_start().await.0, n);
                    tokio::time::advance(ms(5)).await;
                }
                let won = upload.await.unwrap().ok().unwrap();
                gate.open();
                (won, seen.idle().await)
            },
        );
        assert_eq!((won.result, won.attempt, won.total_attempts), (7, 7, 7));
        let mut discarded = discarded;
        discarded.sort();
        assert_eq!(discarded, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn last_attempt_timing_out_fails_and_late_success_is_discarded() {
        let gate = Gate::default();
        let g = gate.clone();
        let (e, discarded) = simulate(
            policy(1, Some(ms(5)), Duration::ZERO),
            1,
            move |n| {
                g.wait();
                Ok(n)
            },
            async |upload, mut seen| {
                seen.next_start().await;
                tokio::time::advance(ms(5)).await;
                let e = upload.await.unwrap().err().unwrap();
                gate.open();
                (e, seen.idle().await)
            },
        );
        assert!(
            matches!(
                e,
                UploadError::TimedOut {
                    attempts: 1,
                    attempt: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "upload failed after 1 attempts; last: attempt 1 timed out after 5 ms"
        );
        assert_eq!(discarded, vec![1]);
    }

    #[test]
    fn a_hung_attempt_is_overtaken_by_the_next_after_the_timeout() {
        let gate = Gate::default();
        let g = gate.clone();
        simulate(
            policy(u32::MAX, Some(ms(300)), Duration::ZERO),
            2,
            move |n| {
                if n == 1 {
                    g.wait();
                }
                Ok(n)
            },
            async |upload, mut seen| {
                let (_, first) = seen.next_start().await;
                tokio::time::advance(ms(299)).await;
                tokio::task::yield_now().await;
                assert!(seen.started.try_recv().is_err(), "not before the timeout");
                tokio::time::advance(ms(1)).await;
                let (n, second) = seen.next_start().await;
                assert_eq!((n, second - first), (2, ms(300)));
                assert_eq!(upload.await.unwrap().ok().unwrap().attempt, 2);
                gate.open();
                assert_eq!(seen.idle().await, vec![1], "the late winner lost");
            },
        );
    }

    #[test]
    fn hung_attempts_holding_every_thread_still_fail_within_the_policy() {
        // One thread, held by attempt 1 for good: attempt 2 waits for the permit, and its
        // timeout runs while it waits, so the upload fails after two timeouts.
        let gate = Gate::default();
        let g = gate.clone();
        simulate(
            policy(2, Some(ms(100)), Duration::ZERO),
            1,
            move |n| {
                g.wait();
                Ok(n)
            },
            async |upload, mut seen| {
                let (_, started) = seen.next_start().await;
                // Attempt 2 reports nothing (it never runs), so the clock moves in steps
                // of a millisecond, each followed by turns of the runtime for the driver.
                while !upload.is_finished() {
                    tokio::time::advance(ms(1)).await;
                    for _ in 0..4 {
                        tokio::task::yield_now().await;
                    }
                }
                let elapsed = Instant::now() - started;
                let e = upload.await.unwrap().err().unwrap();
                assert!(
                    matches!(
                        e,
                        UploadError::TimedOut {
                            attempts: 2,
                            attempt: 2,
                            ..
                        }
                    ),
                    "{e:?}"
                );
                assert!(
                    (ms(200)..ms(205)).contains(&elapsed),
                    "two timeouts, not {elapsed:?}"
                );
                gate.open();
                assert_eq!(seen.idle().await, vec![1]);
                assert!(
                    seen.started.try_recv().is_err(),
                    "attempt 2 timed out before it got the thread, so it never ran"
                );
            },
        );
    }
}
