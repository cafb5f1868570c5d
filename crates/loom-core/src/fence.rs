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
}

/// The lease a store's writes are fenced by ([`crate::Store::write_fence`]):
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
