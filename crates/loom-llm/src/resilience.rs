//! What keeps a provider usable when the service misbehaves: retries with
//! exponential backoff and jitter, a circuit breaker (docs/library.md), and a
//! client-side requests-per-minute limit.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often and how patiently to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first one included (at least 1).
    pub max_attempts: u32,
    /// Wait before the first retry; doubled each time.
    pub base_delay: Duration,
    /// Longest wait between attempts (a longer `Retry-After` is capped to it).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Eight attempts: waits of 0.5, 1, 2, 4, 8, 16 and 30 s (each at least
    /// half that, by jitter), so a call outlasts a model server that
    /// restarts (refused connections, then `503 Loading model` for about
    /// 20 s) or a provider's overload of half a minute, as Claude Code's
    /// ten retries do; the official SDKs' two retries (under 10 s) do not.
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1 for the first retry): the
    /// server's `Retry-After` when it gave one, else exponential backoff with
    /// "full jitter" (a random wait between half and all of the step).
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.max_delay);
        }
        let step = self
            .base_delay
            .saturating_mul(1u32 << retry.saturating_sub(1).min(16))
            .min(self.max_delay);
        let half = step / 2;
        half + step.saturating_sub(half).mul_f64(fastrand::f64())
    }
}

/// Settings of a circuit breaker.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerSettings {
    /// Consecutive failed calls that open the circuit; a call fails once,
    /// when it gives up after its retries (its attempts are not counted
    /// one by one, or a call's own retries would open the circuit on it).
    pub failure_threshold: u32,
    /// How long an open circuit refuses calls before letting one through.
    pub open_for: Duration,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_for: Duration::from_secs(30),
        }
    }
}

/// The state of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls are refused until the moment passes.
    Open {
        /// When one trial call will be let through.
        until: Instant,
    },
    /// One trial call is in flight; its outcome closes or reopens the circuit.
    HalfOpen,
}

/// How a circuit breaker let a call through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The circuit is closed: the call may retry as its policy says.
    Closed,
    /// The one trial call of a circuit that was open: its first failure
    /// opens the circuit again, its success closes it.
    Trial,
}

/// Stops calling a provider that keeps failing, so a run fails fast instead
/// of waiting through every retry of every call.
#[derive(Debug)]
pub struct CircuitBreaker {
    provider: String,
    settings: BreakerSettings,
    inner: Mutex<(BreakerState, u32)>,
}

impl CircuitBreaker {
    /// A closed breaker for `provider`.
    pub fn new(provider: impl Into<String>, settings: BreakerSettings) -> Self {
        Self {
            provider: provider.into(),
            settings,
            inner: Mutex::new((BreakerState::Closed, 0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (BreakerState, u32)> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        self.lock().0
    }

    /// `Ok` when a call may go out (saying whether it is the one trial of a
    /// circuit that was open); `Err(wait)` while the circuit is open.
    pub fn admit(&self) -> Result<Admission, Duration> {
        let mut inner = self.lock();
        match inner.0 {
            BreakerState::Closed => Ok(Admission::Closed),
            BreakerState::HalfOpen => Err(self.settings.open_for.min(Duration::from_secs(1))),
            BreakerState::Open { until } => {
                let now = Instant::now();
                if now >= until {
                    inner.0 = BreakerState::HalfOpen;
                    self.publish(BreakerState::HalfOpen);
                    tracing::info!(provider = %self.provider, "circuit half-open: letting one trial call through");
                    Ok(Admission::Trial)
                } else {
                    Err(until - now)
                }
            }
        }
    }

    /// Publishes the state as the `loom_circuit_breaker_state` gauge (0
    /// closed, 1 half-open, 2 open) to whatever metrics recorder the
    /// process installed (`loom serve` does; otherwise it costs nothing).
    fn publish(&self, state: BreakerState) {
        let value = match state {
            BreakerState::Closed => 0.0,
            BreakerState::HalfOpen => 1.0,
            BreakerState::Open { .. } => 2.0,
        };
        metrics::gauge!("loom_circuit_breaker_state", "provider" => self.provider.clone()).set(value);
    }

    /// Records a call that worked: the circuit closes.
    pub fn record_success(&self) {
        let mut inner = self.lock();
        if inner.0 != BreakerState::Closed {
            tracing::info!(provider = %self.provider, "circuit closed: the provider answers again");
            self.publish(BreakerState::Closed);
        }
        *inner = (BreakerState::Closed, 0);
    }

    /// Records a call that failed (after its retries) in a way that says
    /// the provider is unwell.
    pub fn record_failure(&self) {
        let mut inner = self.lock();
        inner.1 += 1;
        let trip = inner.0 == BreakerState::HalfOpen || inner.1 >= self.settings.failure_threshold;
        if trip {
            let now = Instant::now();
            inner.0 = BreakerState::Open {
                // A setting too large for the clock means "open for good".
                until: now
                    .checked_add(self.settings.open_for)
                    .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600)),
            };
            self.publish(inner.0);
            tracing::warn!(
                provider = %self.provider,
                failures = inner.1,
                open_for_secs = self.settings.open_for.as_secs_f64(),
                "circuit open: refusing calls to the provider for a while"
            );
        }
    }
}

/// One call as a circuit breaker counts it: settled once, as a success or
/// a failure — also when the call is dropped before it ends (a cancelled
/// run, a step time-out), which counts as a failed call once an attempt
/// of it had failed or it was the one trial. Without that, a trial dropped
/// mid-way left the circuit half-open for good, and a provider whose calls
/// always ran out of time was never counted.
pub(crate) struct BreakerCall<'a> {
    breaker: &'a CircuitBreaker,
    trial: bool,
    failed: bool,
    settled: bool,
}

impl<'a> BreakerCall<'a> {
    pub(crate) fn new(breaker: &'a CircuitBreaker) -> Self {
        Self {
            breaker,
            trial: false,
            failed: false,
            settled: false,
        }
    }

    /// An attempt went out as the breaker let it.
    pub(crate) fn admitted(&mut self, admission: Admission) {
        self.trial |= admission == Admission::Trial;
    }

    /// Whether the call is the one trial of a circuit that was open.
    pub(crate) fn is_trial(&self) -> bool {
        self.trial
    }

    /// An attempt failed in a way that says the provider is unwell.
    pub(crate) fn attempt_failed(&mut self) {
        self.failed = true;
    }

    /// The provider answered.
    pub(crate) fn succeeded(mut self) {
        self.settled = true;
        self.breaker.record_success();
    }

    /// The call gave up.
    pub(crate) fn failed(mut self) {
        self.settled = true;
        self.breaker.record_failure();
    }
}

impl Drop for BreakerCall<'_> {
    fn drop(&mut self) {
        if !self.settled && (self.trial || self.failed) {
            self.breaker.record_failure();
        }
    }
}

/// A client-side limit of requests per minute (a sliding window).
#[derive(Debug)]
pub struct RateLimiter {
    per_minute: u32,
    sent: tokio::sync::Mutex<VecDeque<Instant>>,
}

impl RateLimiter {
    /// At most `per_minute` requests in any 60 s.
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute: per_minute.max(1),
            sent: tokio::sync::Mutex::new(VecDeque::new()),
        }
    }

    /// Waits until one more request fits in the window, then counts it.
    pub async fn acquire(&self) {
        const WINDOW: Duration = Duration::from_secs(60);
        let mut sent = self.sent.lock().await;
        loop {
            let now = Instant::now();
            while sent.front().is_some_and(|at| now.duration_since(*at) >= WINDOW) {
                sent.pop_front();
            }
            if sent.len() < self.per_minute as usize {
                sent.push_back(now);
                return;
            }
            let oldest = sent.front().copied().unwrap_or(now);
            tokio::time::sleep(WINDOW.saturating_sub(now.duration_since(oldest))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_honours_retry_after() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let first = policy.delay(1, None);
            assert!(
                first >= Duration::from_millis(50) && first <= Duration::from_millis(100),
                "{first:?}"
            );
            let third = policy.delay(3, None);
            assert!(
                third >= Duration::from_millis(200) && third <= Duration::from_millis(400),
                "{third:?}"
            );
            assert!(policy.delay(20, None) <= Duration::from_secs(1));
        }
        assert_eq!(
            policy.delay(1, Some(Duration::from_millis(300))),
            Duration::from_millis(300)
        );
        assert_eq!(policy.delay(1, Some(Duration::from_secs(90))), Duration::from_secs(1));
    }

    #[test]
    fn the_default_policy_waits_out_a_restarting_server() {
        let policy = RetryPolicy::default();
        let retries = policy.max_attempts - 1;
        for _ in 0..20 {
            let waited: Duration = (1..=retries).map(|retry| policy.delay(retry, None)).sum();
            // A llama.cpp server restarts in about 20 s; every draw of the
            // jitter waits longer than that, and no more than about a minute.
            assert!(waited >= Duration::from_secs(30), "{waited:?}");
            assert!(waited <= Duration::from_millis(61_500), "{waited:?}");
        }
    }

    #[test]
    fn breaker_opens_after_failures_and_refuses_while_open() {
        // Open for an hour: no pause of the test's thread outlasts it.
        let breaker = CircuitBreaker::new(
            "p",
            BreakerSettings {
                failure_threshold: 2,
                open_for: Duration::from_secs(3600),
            },
        );
        assert_eq!(breaker.admit(), Ok(Admission::Closed));
        breaker.record_failure();
        assert!(breaker.admit().is_ok());
        breaker.record_failure();
        assert!(matches!(breaker.state(), BreakerState::Open { .. }));
        assert!(breaker.admit().is_err());
    }

    #[test]
    fn breaker_lets_one_trial_through_once_open_and_its_outcome_decides() {
        // Open for 30 ms, and the test waits longer: only a lower bound,
        // which a slower machine keeps all the more.
        let breaker = CircuitBreaker::new(
            "p",
            BreakerSettings {
                failure_threshold: 2,
                open_for: Duration::from_millis(30),
            },
        );
        breaker.record_failure();
        breaker.record_failure();
        assert!(matches!(breaker.state(), BreakerState::Open { .. }));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(breaker.admit(), Ok(Admission::Trial));
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert!(breaker.admit().is_err(), "one trial at a time");
        breaker.record_failure();
        assert!(
            matches!(breaker.state(), BreakerState::Open { .. }),
            "a failed trial reopens"
        );
        std::thread::sleep(Duration::from_millis(40));
        assert!(breaker.admit().is_ok());
        breaker.record_success();
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn a_call_dropped_mid_way_is_counted_once_it_failed_or_was_the_trial() {
        let breaker = CircuitBreaker::new(
            "p",
            BreakerSettings {
                failure_threshold: 1,
                open_for: Duration::from_millis(30),
            },
        );
        // Dropped before anything failed (a cancel during the first
        // attempt): nothing is said of the provider.
        let mut call = BreakerCall::new(&breaker);
        call.admitted(breaker.admit().unwrap());
        drop(call);
        assert_eq!(breaker.state(), BreakerState::Closed);
        // Dropped between retries: a failed call.
        let mut call = BreakerCall::new(&breaker);
        call.admitted(breaker.admit().unwrap());
        call.attempt_failed();
        drop(call);
        assert!(matches!(breaker.state(), BreakerState::Open { .. }));
        // The trial, dropped before its answer: the circuit opens again
        // rather than staying half-open.
        std::thread::sleep(Duration::from_millis(40));
        let mut call = BreakerCall::new(&breaker);
        call.admitted(breaker.admit().unwrap());
        assert!(call.is_trial());
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        drop(call);
        assert!(matches!(breaker.state(), BreakerState::Open { .. }));
        // A settled call is counted once, as settled.
        std::thread::sleep(Duration::from_millis(40));
        let mut call = BreakerCall::new(&breaker);
        call.admitted(breaker.admit().unwrap());
        call.succeeded();
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[tokio::test]
    async fn rate_limiter_admits_up_to_the_limit_at_once() {
        let limiter = RateLimiter::new(3);
        // At once: each is admitted the first time it is asked, without
        // waiting at all (not "within a second", which a stalled machine
        // could miss).
        for _ in 0..3 {
            assert!(limiter.acquire().now_or_never().is_some());
        }
        let fourth = tokio::time::timeout(Duration::from_millis(100), limiter.acquire()).await;
        assert!(fourth.is_err(), "the fourth request in a minute waits");
    }
}
