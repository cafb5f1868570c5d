//! The fence of a leased run's writes (docs/cluster.md): what a worker
//! shares with the stores it writes through, so that once it has given its
//! lease up, or another worker took the run over, nothing it sends lands.

use std::sync::Arc;

/// What a worker shares with the store of a lease it holds
/// ([`crate::lease::RunLeases::fenced`]).
#[derive(Debug, Default)]
pub struct LeaseGuard {
    /// Set when the worker gave the run up: its store sends nothing more.
    pub revoked: std::sync::atomic::AtomicBool,
    /// The number of the last control handed to the run: its next
    /// checkpoint acknowledges it and those before, which then leave the
    /// store (until then a worker that takes the run over gets them again).
    pub delivered: std::sync::atomic::AtomicU64,
    /// Set when the worker interrupts the run (to park it, or to stop):
    /// its last checkpoint acknowledges nothing, since a control handed
    /// to it may not have taken effect yet — the worker that resumes it
    /// hears those controls again (an answer to an ask already settled
    /// is ignored).
    pub acks_frozen: std::sync::atomic::AtomicBool,
    /// Writes refused as stale: by the store (another worker took the run
    /// over), or before they were sent (the lease was given up).
    pub refused: std::sync::atomic::AtomicU64,
    /// Of those, the ones the store refused: the worker had sent them
    /// before it knew the lease was gone.
    pub refused_by_store: std::sync::atomic::AtomicU64,
    /// Until when writes may go out without another renewal, in
    /// milliseconds of the process's monotonic clock; 0 for no limit. A worker frozen
    /// past it (SIGSTOP, a stall) refuses every write the moment it
    /// thaws, before its lease keeper has run to give the run up. (The
    /// monotonic clock stops while the machine sleeps: a suspended or
    /// paused machine is left to the store's epoch check.)
    pub valid_until_ms: std::sync::atomic::AtomicU64,
}

impl LeaseGuard {
    /// Whether writes must not go out: the lease was given up, or the
    /// time it was last renewed for has passed.
    pub fn refuses_writes(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if self.revoked.load(SeqCst) {
            return true;
        }
        let until = self.valid_until_ms.load(SeqCst);
        until != 0 && lease_clock_ms(std::time::Instant::now()) >= until
    }

    /// Writes may go out until `deadline` (a renewal's worth of time).
    pub fn valid_until(&self, deadline: std::time::Instant) {
        self.valid_until_ms
            .store(lease_clock_ms(deadline), std::sync::atomic::Ordering::SeqCst);
    }

    /// Counts a write refused before it was sent, or (`by_store`) by the store.
    pub fn count_refused(&self, by_store: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        self.refused.fetch_add(1, SeqCst);
        if by_store {
            self.refused_by_store.fetch_add(1, SeqCst);
        }
    }
}

/// `at` as milliseconds of this process's monotonic clock (never 0, so
/// that 0 can mean "no limit"). The monotonic clock goes on while the
/// process is stopped, which is what the deadline is for.
fn lease_clock_ms(at: std::time::Instant) -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    u64::try_from(at.saturating_duration_since(origin).as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// The lease a store's writes are fenced by ([`crate::RunLog::write_fence`]):
/// what is kept beside the store for the run (its workspace snapshots)
/// carries the same fence, so a worker that lost its lease writes nothing
/// there either.
#[derive(Debug, Clone)]
pub struct WriteFence {
    /// The leased run (a sub-agent's writes carry its root's).
    pub run_id: String,
    /// The epoch the writes must still be of.
    pub epoch: u64,
    /// The worker's side of the lease: once revoked, nothing is sent.
    pub guard: Arc<LeaseGuard>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};

    #[test]
    fn writes_stop_once_given_up_or_once_the_renewed_time_has_passed() {
        let guard = LeaseGuard::default();
        assert!(!guard.refuses_writes(), "no limit until a lease sets one");
        guard.valid_until(Instant::now() + Duration::from_secs(60));
        assert!(!guard.refuses_writes());
        // A process stopped past its deadline finds it passed on waking.
        guard.valid_until(Instant::now() - Duration::from_millis(1));
        assert!(guard.refuses_writes());
        guard.valid_until(Instant::now() + Duration::from_secs(60));
        guard.revoked.store(true, SeqCst);
        assert!(guard.refuses_writes());
        guard.count_refused(false);
        guard.count_refused(true);
        assert_eq!(
            (guard.refused.load(SeqCst), guard.refused_by_store.load(SeqCst)),
            (2, 1)
        );
    }
}
