//! The lease keeper: renews the lease of every run the worker executes,
//! on a thread of its own with its own runtime and its own connection, so
//! that no tool, model call or blocking work on the worker's runtime can
//! keep a renewal from going out (BullMQ loses its locks exactly so).
//!
//! It also fences the worker: a lease that another worker took over, or
//! that could not be renewed for so long that it may end, is revoked — its
//! store refuses every further write — and its run is interrupted (the
//! model stream and the tools stop) before the lease ends.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use loom_core::{Lease, LeaseGuard, Renewal, RunController, RunLeases, StoreError};

/// Opens the keeper's own connection to the leases' store; called on the
/// keeper's runtime, so the connection is driven there.
pub type ConnectLeases =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Arc<dyn RunLeases>, StoreError>> + Send>> + Send + Sync>;

/// How long leases last and how often they are renewed.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    /// A lease not renewed for this long may be taken over (default 3 s).
    pub ttl: Duration,
    /// How often leases are renewed (default 1 s).
    pub renew_every: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(3),
            renew_every: Duration::from_secs(1),
        }
    }
}

impl LeaseTiming {
    /// When a lease last renewed at `renewed` is given up: before it can
    /// end, with half a renewal's time (at least 250 ms) to spare for the
    /// stop to take hold.
    fn give_up_at(&self, renewed: Instant) -> Instant {
        let spare = (self.renew_every / 2).max(Duration::from_millis(250));
        renewed + self.ttl.saturating_sub(spare)
    }
}

/// One lease held.
struct Held {
    lease: Lease,
    /// Shared with the lease's store: revoked, controls delivered.
    guard: Arc<LeaseGuard>,
    /// When the last successful renewal (or the claim) was sent.
    renewed: Instant,
    /// The run's controls, once it started (controls wait in the store
    /// until then).
    controller: Option<RunController>,
    /// A renewal has brought the run its controls since it started.
    heard: bool,
}

impl Held {
    fn revoked(&self) -> bool {
        self.guard.revoked.load(Ordering::SeqCst)
    }
}

type HeldMap = Arc<Mutex<HashMap<String, Held>>>;

fn lock(held: &HeldMap) -> MutexGuard<'_, HashMap<String, Held>> {
    held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The keeper's handle. Dropping it stops the thread.
pub(crate) struct Keeper {
    held: HeldMap,
    stop: Arc<AtomicBool>,
    /// Asks for a renewal round now (a run just started: the controls
    /// waiting for it are brought at once, not at the next round).
    wake: Arc<tokio::sync::Notify>,
    timing: LeaseTiming,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Starts the keeper's thread.
    pub(crate) fn start(connect: ConnectLeases, timing: LeaseTiming) -> std::io::Result<Self> {
        let held: HeldMap = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let thread = {
            let (held, stop, wake) = (held.clone(), stop.clone(), wake.clone());
            std::thread::Builder::new()
                .name("loom-lease-keeper".into())
                .spawn(move || keep(connect, timing, held, stop, wake))?
        };
        Ok(Self {
            held,
            stop,
            wake,
            timing,
            thread: Some(thread),
        })
    }

    /// Holds `lease`, claimed at `claimed` (when the claim was sent).
    pub(crate) fn hold(&self, lease: Lease, guard: Arc<LeaseGuard>, claimed: Instant) {
        metrics::gauge!("loom_worker_runs_owned").increment(1.0);
        guard.valid_until(self.timing.give_up_at(claimed));
        lock(&self.held).insert(
            lease.run_id.clone(),
            Held {
                lease,
                guard,
                renewed: claimed,
                controller: None,
                heard: false,
            },
        );
    }

    /// The run started: controls go to it from the next renewal on (until
    /// then they wait in the store). Returns `false` when the lease was
    /// given up meanwhile (the run is interrupted at once then).
    pub(crate) fn attach(&self, run_id: &str, controller: RunController) -> bool {
        let mut held = lock(&self.held);
        let Some(entry) = held.get_mut(run_id) else {
            return false;
        };
        if entry.revoked() {
            controller.interrupt("this worker lost the run's lease");
        }
        entry.controller = Some(controller);
        // A resumed run may be waiting for an answer sent while it was
        // parked: it hears it now, before it could be parked again.
        self.wake.notify_one();
        !entry.revoked()
    }

    /// A renewal round now: a control was sent to one of the runs held
    /// (the round brings it), rather than at the next round.
    pub(crate) fn renew_now(&self) {
        self.wake.notify_one();
    }

    /// Whether the run has heard the controls sent to it before it started
    /// (a renewal since): until then it must not be parked, or an answer
    /// waiting for it would make it claimable, and parked, for ever.
    pub(crate) fn heard(&self, run_id: &str) -> bool {
        lock(&self.held).get(run_id).is_some_and(|entry| entry.heard)
    }

    /// The run ended here: its lease is no longer renewed.
    pub(crate) fn forget(&self, run_id: &str) {
        if lock(&self.held).remove(run_id).is_some() {
            metrics::gauge!("loom_worker_runs_owned").decrement(1.0);
        }
    }

    /// How many leases are held.
    pub(crate) fn count(&self) -> usize {
        lock(&self.held).len()
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The keeper's thread: its own runtime, its own connection, a renewal
/// round every `renew_every`.
fn keep(
    connect: ConnectLeases,
    timing: LeaseTiming,
    held: HeldMap,
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(error = %err, "the lease keeper cannot start; every lease will be given up");
            // Without renewals every lease ends: stop the runs before then.
            while !stop.load(Ordering::SeqCst) {
                give_up_overdue(&held, timing, Instant::now());
                std::thread::sleep(timing.renew_every);
            }
            return;
        }
    };
    runtime.block_on(async move {
        // Renewals go out on a task, so that a round waiting for a slow
        // store does not delay the checks below.
        let renewing = tokio::spawn(renew_rounds(connect, held.clone(), timing, stop.clone(), wake));
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(CHECK_EVERY).await;
            give_up_overdue(&held, timing, Instant::now());
        }
        renewing.abort();
    });
}

/// How often leases are checked for being overdue.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// A renewal round every `renew_every`, over a connection opened on the
/// keeper's runtime (until that succeeds, each round tries again; once
/// open, the connection reconnects by itself).
async fn renew_rounds(
    connect: ConnectLeases,
    held: HeldMap,
    timing: LeaseTiming,
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
) {
    let mut leases: Option<Arc<dyn RunLeases>> = None;
    let mut tick = tokio::time::interval(timing.renew_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::SeqCst) {
        tokio::select! {
            _ = tick.tick() => {}
            () = wake.notified() => {}
        }
        if leases.is_none() {
            match tokio::time::timeout(timing.renew_every, connect()).await {
                Ok(Ok(connected)) => leases = Some(connected),
                Ok(Err(err)) => tracing::warn!(error = %err, "the lease keeper cannot reach the store"),
                Err(_) => tracing::warn!("the lease keeper's connection timed out"),
            }
        }
        if let Some(leases) = &leases {
            renew_all(leases.as_ref(), &held, timing).await;
        }
    }
}

/// One round: every held lease renewed at once, each waiting at most one
/// renewal period.
async fn renew_all(leases: &dyn RunLeases, held: &HeldMap, timing: LeaseTiming) {
    let round: Vec<(Lease, u64)> = lock(held)
        .values()
        .filter(|entry| !entry.revoked())
        .map(|entry| (entry.lease.clone(), entry.guard.delivered.load(Ordering::SeqCst)))
        .collect();
    let sent = Instant::now();
    let answers = futures_util::future::join_all(
        round
            .iter()
            .map(|(lease, heard)| tokio::time::timeout(timing.renew_every, leases.renew(lease, timing.ttl, *heard))),
    )
    .await;
    let mut held = lock(held);
    for ((lease, _), answer) in round.iter().zip(answers) {
        let Some(entry) = held.get_mut(&lease.run_id).filter(|entry| entry.lease == *lease) else {
            continue;
        };
        match answer {
            // Answered after the time the last renewal bought: the run's
            // writes have been refused meanwhile (its run stops), so the
            // lease is not taken up again.
            Ok(Ok(Renewal::Held { .. })) if Instant::now() >= timing.give_up_at(entry.renewed) => {
                give_up(entry, "its lease could not be renewed in time");
            }
            Ok(Ok(Renewal::Held { controls })) => {
                metrics::counter!("loom_worker_leases_renewed_total").increment(1);
                entry.renewed = sent;
                // Its writes go out until the keeper would give it up.
                entry.guard.valid_until(timing.give_up_at(sent));
                // In order, each once: the store keeps them until a
                // checkpoint acknowledges the number delivered.
                let Some(controller) = &entry.controller else { continue };
                entry.heard = true;
                for (number, control) in controls {
                    if number <= entry.guard.delivered.load(Ordering::SeqCst) {
                        continue;
                    }
                    // One the run cannot take (an ask already answered) is done with too.
                    if let Err(err) = controller.send(control) {
                        tracing::debug!(run_id = %lease.run_id, number, error = %err, "a control the run could not take");
                    }
                    entry.guard.delivered.store(number, Ordering::SeqCst);
                }
            }
            Ok(Ok(Renewal::Lost)) => give_up(entry, "another worker took the run over"),
            // It ended; the run's task forgets it.
            Ok(Ok(Renewal::Ended)) => {}
            Ok(Err(err)) => tracing::warn!(run_id = %lease.run_id, error = %err, "a lease could not be renewed"),
            Err(_) => tracing::warn!(run_id = %lease.run_id, "a lease renewal timed out"),
        }
    }
}

/// Gives up every lease not renewed for so long that it may end soon.
fn give_up_overdue(held: &HeldMap, timing: LeaseTiming, now: Instant) {
    for entry in lock(held).values_mut() {
        if !entry.revoked() && now >= timing.give_up_at(entry.renewed) {
            give_up(entry, "its lease could not be renewed in time");
        }
    }
}

/// Fences the worker off a run: its store writes nothing more, and the
/// run stops at once (an interrupt: another worker resumes it).
fn give_up(entry: &mut Held, why: &str) {
    if entry.guard.revoked.swap(true, Ordering::SeqCst) {
        return;
    }
    metrics::counter!("loom_worker_leases_lost_total").increment(1);
    tracing::warn!(run_id = %entry.lease.run_id, epoch = entry.lease.epoch, "giving the run up: {why}");
    if let Some(controller) = &entry.controller {
        controller.interrupt(format!("this worker gave the run up: {why}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_given_up_before_it_can_end() {
        let timing = LeaseTiming::default();
        let renewed = Instant::now();
        let at = timing.give_up_at(renewed);
        assert!(
            at > renewed + timing.renew_every * 2,
            "two missed renewals are tolerated"
        );
        assert!(at < renewed + timing.ttl, "given up before another worker may take it");
    }
}
