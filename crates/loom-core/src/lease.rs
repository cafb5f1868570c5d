//! Leases: which process executes a run when many share one store
//! (`loom worker` processes on Redis, docs/cluster.md).
//!
//! A worker takes a run with a lease that lasts a few seconds and renews
//! it while it executes the run. Every take-over raises the run's epoch,
//! and every write through the [`RunLeases::fenced`] store of a lease is
//! checked against that epoch in the same atomic step as the write: a
//! worker that was paused or cut off while another took its run over can
//! no longer change it. A worker that cannot renew stops the run before
//! its lease ends (it fences itself), so two workers never act on a run
//! at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::control::Control;
use crate::event::Event;
use crate::fence::LeaseGuard;
use crate::store::{Store, StoreError};

/// A worker's hold on a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run_id: String,
    /// Who holds it (an owner string, [`crate::owner::this_process`]).
    pub owner: String,
    /// Raised by every take-over: writes of an older epoch are refused.
    pub epoch: u64,
}

/// A run a worker took ([`RunLeases::claim_next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// A run accepted and never started: start it from its request.
    Start {
        /// The lease.
        lease: Lease,
        /// What starts it: the request as the gateway stored it (JSON).
        request: String,
    },
    /// A run another worker executed and stopped renewing (it died, or
    /// handed it back): resume it from its last checkpoint. It is
    /// `INTERRUPTED` until the resume takes it.
    Resume {
        /// The lease.
        lease: Lease,
    },
}

impl Claim {
    /// The lease of the run taken.
    pub fn lease(&self) -> &Lease {
        match self {
            Self::Start { lease, .. } | Self::Resume { lease } => lease,
        }
    }
}

/// What a renewal found.
#[derive(Debug, Clone, PartialEq)]
pub enum Renewal {
    /// The lease is held for another term; `controls` are those sent to
    /// the run (from any gateway) after the number the renewal named,
    /// oldest first, each with its number.
    Held {
        /// Controls to apply to the run.
        controls: Vec<(u64, Control)>,
    },
    /// Another worker took the run over (the epoch moved on): stop at once.
    Lost,
    /// The run has ended: there is nothing to hold.
    Ended,
}

/// How many runs of a cluster wait for a worker and how many execute
/// (leased, or parked for a person): what a cluster gateway's
/// `loom_runs_queued` and `loom_runs_active` show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterRunCounts {
    /// Runs stored `QUEUED`.
    pub queued: usize,
    /// Runs stored `RUNNING` or `WAITING_PERMISSION`.
    pub active: usize,
}

/// Leases on runs, kept by a store several processes share.
#[async_trait]
pub trait RunLeases: Send + Sync {
    /// Takes the next run to execute, for `ttl`: the oldest run whose
    /// lease expired (its worker died), else the oldest queued run whose
    /// session executes no other run and whose principal executes fewer
    /// than `per_principal` (0: no cap). `None` when there is none.
    async fn claim_next(&self, owner: &str, ttl: Duration, per_principal: usize) -> Result<Option<Claim>, StoreError>;

    /// Whether `run_id` (or the run a sub-agent belongs to) was queued for
    /// workers: they execute and resume it, and take its controls.
    async fn on_workers(&self, run_id: &str) -> Result<bool, StoreError>;

    /// How many of the cluster's runs are queued and how many execute.
    async fn run_counts(&self) -> Result<ClusterRunCounts, StoreError>;

    /// Where a queued run no worker took yet waits: 1 for the next to
    /// start; `None` when it does not wait.
    async fn queue_position(&self, run_id: &str) -> Result<Option<usize>, StoreError>;

    /// Renews a lease for another `ttl`, and collects the controls sent
    /// to its run after the one numbered `after`.
    async fn renew(&self, lease: &Lease, ttl: Duration, after: u64) -> Result<Renewal, StoreError>;

    /// Counts a start of the run that failed here (its model or a tool
    /// could not be set up); returns how many have, or `None` when the
    /// lease was lost meanwhile.
    async fn note_failed_start(&self, lease: &Lease) -> Result<Option<u32>, StoreError>;

    /// Hands a run back: its lease ends now, so another worker takes it
    /// at once (a worker stopping with SIGTERM, after it interrupted the run).
    async fn release(&self, lease: &Lease) -> Result<(), StoreError>;

    /// Parks a run its worker interrupted while it waited for a person
    /// (it holds no worker while nobody answers): no worker takes it until
    /// a control is sent to it ([`RunLeases::send_control`] — the answer,
    /// a cancel, a steer), which makes it claimable at once. Returns
    /// `false` when it was not parked: a control the worker had not heard
    /// (numbered after `heard`) had come meanwhile — it is claimable now —
    /// or the lease was lost.
    async fn park(&self, lease: &Lease, heard: u64) -> Result<bool, StoreError>;

    /// Cancels a run no worker has taken yet, in one step: when it is
    /// still `QUEUED` and unleased it becomes `CANCELED` with `log` (its
    /// cancel and end) appended, and this returns `true`; otherwise nothing
    /// changes (a worker has it: send it a cancel instead).
    async fn withdraw(&self, run_id: &str, log: &[Event]) -> Result<bool, StoreError>;

    /// Sends a control to whichever worker executes `run_id`: it is kept
    /// with the run and delivered at that worker's next renewal (a parked
    /// run is taken by a worker first, which hears it as it starts).
    async fn send_control(&self, run_id: &str, control: &Control) -> Result<(), StoreError>;

    /// Removes at most `limit` runs that ended before `before_ms` (ms
    /// since the Unix epoch), with everything stored of them; returns how
    /// many. The cluster keeps finished runs for a while (`[cluster]
    /// keep_finished_days`), and any worker may sweep.
    async fn forget_ended(&self, before_ms: u64, limit: usize) -> Result<usize, StoreError>;

    /// Nudges for the worker `owner`, as they happen, until the receiver
    /// is dropped. A nudge is a hint, never the news itself: the store
    /// stays the truth, and a worker that misses one (a reconnection, a
    /// store that cannot push: this default sends none) finds the same at
    /// its next renewal or claim.
    fn nudges(&self, owner: &str) -> tokio::sync::mpsc::Receiver<Nudge> {
        let _ = owner;
        tokio::sync::mpsc::channel(1).1
    }

    /// The store a leased run writes through: every write is refused with
    /// [`StoreError::Fenced`] once another worker took the run over, or
    /// once the guard is revoked (the worker fenced itself); its
    /// checkpoints acknowledge the controls the guard says were delivered.
    fn fenced(&self, lease: &Lease, guard: Arc<LeaseGuard>) -> Arc<dyn Store>;
}

/// What a worker is nudged about ([`RunLeases::nudges`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nudge {
    /// A control was sent to a run the worker leases: renew now, and
    /// hear it, rather than at the next renewal.
    Control,
    /// A run became claimable (queued, handed back, or woken by a
    /// control while parked): claim now rather than at the next poll.
    Work,
}

/// One entry of a run's stored log, as an [`EventTail`] read it.
#[derive(Debug, Clone, PartialEq)]
pub enum Tailed {
    /// An event.
    Event(Box<Event>),
    /// An entry that could not be read (written by a newer Loom, or
    /// damaged): passed over, so it stops nothing that follows it.
    Unreadable {
        /// Its run.
        run_id: String,
        /// Its `seq`.
        seq: u64,
        /// Why.
        error: String,
    },
}

/// New events of runs executed elsewhere, as they are stored: how a
/// gateway follows the runs its clients watch when workers execute them.
/// One reader serves every run a gateway follows.
#[async_trait]
pub trait EventTail: Send + Sync {
    /// The entries of `runs` after each one's `seq`, in order per run;
    /// waits up to `wait` for the first, and returns none if none came.
    async fn read(&self, runs: &[(String, u64)], wait: Duration) -> Result<Vec<Tailed>, StoreError>;
}
