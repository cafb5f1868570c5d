//! Requests per minute per token: a token bucket each, with bursts of a
//! quarter of the rate (docs/server.md).

use super::*;

/// A token bucket: `requests_per_minute`, with bursts of a quarter of it.
pub(super) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket for `per_minute`.
    pub(super) fn full(per_minute: u32, now: Instant) -> Self {
        Self {
            tokens: capacity(per_minute),
            at: now,
        }
    }

    /// Takes one request at `now`, or says how long until one may come.
    pub(super) fn take(&mut self, per_minute: u32, now: Instant) -> Result<(), Duration> {
        let per_second = f64::from(per_minute) / 60.0;
        let refilled = now.saturating_duration_since(self.at).as_secs_f64() * per_second;
        self.tokens = (self.tokens + refilled).min(capacity(per_minute));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / per_second))
        }
    }
}

/// The burst: a quarter of a minute's requests, at least one.
fn capacity(per_minute: u32) -> f64 {
    (f64::from(per_minute) / 4.0).max(1.0)
}

impl Service {
    /// Counts one request of `principal` against its rate.
    pub fn admit_request(&self, principal: &Principal) -> Result<(), ApiError> {
        let per_minute = self.inner.config.requests_per_minute;
        let mut buckets = self
            .inner
            .limiter
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        buckets
            .entry(principal.clone())
            .or_insert_with(|| Bucket::full(per_minute, now))
            .take(per_minute, now)
            .map_err(|wait| ApiError::new(Code::RateLimited, "too many requests for this token").retry_after(wait))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_a_quarter_then_the_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::full(60, start);
        for _ in 0..15 {
            assert!(bucket.take(60, start).is_ok());
        }
        let wait = bucket.take(60, start).unwrap_err();
        assert!((0.9..=1.0).contains(&wait.as_secs_f64()), "{wait:?}");
        // One a second comes back, and no more than the burst ever.
        assert!(bucket.take(60, start + Duration::from_secs(1)).is_ok());
        assert!(bucket.take(60, start + Duration::from_secs(1)).is_err());
        let later = start + Duration::from_secs(3600);
        for _ in 0..15 {
            assert!(bucket.take(60, later).is_ok());
        }
        assert!(bucket.take(60, later).is_err());
    }

    #[test]
    fn a_tiny_rate_still_allows_one() {
        let start = Instant::now();
        let mut bucket = Bucket::full(1, start);
        assert!(bucket.take(1, start).is_ok());
        let wait = bucket.take(1, start).unwrap_err();
        assert!((59.0..=60.0).contains(&wait.as_secs_f64()), "{wait:?}");
    }
}
