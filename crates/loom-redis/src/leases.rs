//! [`RunLeases`] on Redis: the lease of each executing run is an entry of
//! the sorted set `{p}leases` scored by when it ends (on Redis's clock),
//! with the run's `epoch` and `lease_owner` in its hash; controls sent to
//! a run wait in the list `{p}controls:{id}` until its worker's next
//! renewal takes them. Each step is one script (`scripts.rs`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use loom_core::{
    Claim, ClusterRunCounts, Control, Event, EventKind, Lease, LeaseGuard, Nudge, Renewal, RunLeases, RunStatus, Store,
    StoreError,
};

use crate::errors::backend;
use crate::store::{event_args, event_rows, json, now_ms, Fence, RedisStore};

/// When a parked run with controls it heard, and no checkpoint
/// acknowledged, is tried again (`scripts::park`).
const RETRY_HEARD: Duration = Duration::from_secs(5);

/// How long a control waits for a worker to take it.
const CONTROL_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn unexpected(reply: &[String]) -> StoreError {
    StoreError::Backend(format!("unexpected answer from Redis: {reply:?}"))
}

#[async_trait]
impl RunLeases for RedisStore {
    async fn claim_next(&self, owner: &str, ttl: Duration, per_principal: usize) -> Result<Option<Claim>, StoreError> {
        let (claim, ..) = self.lease_scripts();
        let reply: Vec<String> = claim
            .arg(self.prefix())
            .arg(owner)
            .arg(millis(ttl))
            .arg(per_principal)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let lease = |id: &String, epoch: &String| -> Result<Lease, StoreError> {
            Ok(Lease {
                run_id: id.clone(),
                owner: owner.to_string(),
                epoch: epoch.parse().map_err(|_| unexpected(&reply))?,
            })
        };
        match reply.as_slice() {
            [] => Ok(None),
            [kind, id, epoch, request] if kind == "start" => Ok(Some(Claim::Start {
                lease: lease(id, epoch)?,
                request: request.clone(),
            })),
            [kind, id, epoch] if kind == "resume" => Ok(Some(Claim::Resume {
                lease: lease(id, epoch)?,
            })),
            _ => Err(unexpected(&reply)),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration, after: u64) -> Result<Renewal, StoreError> {
        let (_, renew, ..) = self.lease_scripts();
        let reply: Vec<String> = renew
            .key(self.run_key_of(&lease.run_id))
            .key(self.controls_key(&lease.run_id))
            .arg(self.prefix())
            .arg(&lease.run_id)
            .arg(lease.epoch)
            .arg(millis(ttl))
            .arg(after)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        match reply.split_first() {
            Some((kind, controls)) if kind == "held" => Ok(Renewal::Held {
                controls: controls
                    .iter()
                    // A control this Loom cannot read (a newer one sent
                    // it) is dropped rather than stopping the renewals.
                    .filter_map(|control| {
                        let (number, body) = control.split_once(' ')?;
                        Some((number.parse().ok()?, serde_json::from_str(body).ok()?))
                    })
                    .collect(),
            }),
            Some((kind, _)) if kind == "lost" => Ok(Renewal::Lost),
            Some((kind, _)) if kind == "ended" => Ok(Renewal::Ended),
            _ => Err(unexpected(&reply)),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let (_, _, release, _) = self.lease_scripts();
        let _: String = release
            .key(self.run_key_of(&lease.run_id))
            .arg(self.prefix())
            .arg(&lease.run_id)
            .arg(lease.epoch)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn park(&self, lease: &Lease, heard: u64) -> Result<bool, StoreError> {
        let reply: String = self
            .park_script()
            .key(self.run_key_of(&lease.run_id))
            .key(self.controls_key(&lease.run_id))
            .arg(self.prefix())
            .arg(&lease.run_id)
            .arg(lease.epoch)
            .arg(heard)
            .arg(millis(RETRY_HEARD))
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(reply == "parked")
    }

    async fn note_failed_start(&self, lease: &Lease) -> Result<Option<u32>, StoreError> {
        let count: i64 = self
            .failed_start_script()
            .key(self.run_key_of(&lease.run_id))
            .arg(lease.epoch)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(u32::try_from(count).ok())
    }

    async fn on_workers(&self, run_id: &str) -> Result<bool, StoreError> {
        let marked: Option<String> = redis::cmd("HGET")
            .arg(self.run_key_of(run_id))
            .arg("for_workers")
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(marked.as_deref() == Some("1"))
    }

    async fn run_counts(&self) -> Result<ClusterRunCounts, StoreError> {
        let index = |status: RunStatus| self.index(&format!("status:{}", status.as_str()));
        let (queued, running, waiting): (usize, usize, usize) = redis::pipe()
            .zcard(index(RunStatus::Queued))
            .zcard(index(RunStatus::Running))
            .zcard(index(RunStatus::WaitingPermission))
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(ClusterRunCounts {
            queued,
            active: running + waiting,
        })
    }

    async fn queue_position(&self, run_id: &str) -> Result<Option<usize>, StoreError> {
        self.queue_position_script()
            .arg(self.prefix())
            .arg(run_id)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)
    }

    async fn forget_ended(&self, before_ms: u64, limit: usize) -> Result<usize, StoreError> {
        let removed: usize = self
            .forget_ended_script()
            .arg(self.prefix())
            .arg(before_ms)
            .arg(limit.max(1))
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        // Their workspace snapshots go with them (docs/rewind.md); those
        // not forgotten now (Redis failed) are the next sweep's.
        self.forget_snapshots(limit.max(1)).await;
        Ok(removed)
    }

    async fn withdraw(&self, run_id: &str, log: &[Event]) -> Result<bool, StoreError> {
        let metrics = log
            .iter()
            .rev()
            .find_map(|event| match &event.kind {
                EventKind::LifecycleEnd { metrics, .. } => Some(metrics.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let mut invocation = self.withdraw_script().key(self.run_key_of(run_id));
        invocation
            .key(self.events_key(run_id))
            .arg(self.prefix())
            .arg(run_id)
            .arg(now_ms())
            .arg(json(&metrics)?);
        event_args(&mut invocation, &event_rows(log)?);
        let reply: String = invocation.invoke_async(&mut self.conn()).await.map_err(backend)?;
        Ok(reply == "ok")
    }

    async fn send_control(&self, run_id: &str, control: &Control) -> Result<(), StoreError> {
        let (.., send) = self.lease_scripts();
        let body = serde_json::to_string(control)
            .map_err(|err| StoreError::Backend(format!("cannot encode a control: {err}")))?;
        let reply: String = send
            .key(self.run_key_of(run_id))
            .key(self.controls_key(run_id))
            .arg(body)
            .arg(millis(CONTROL_RETENTION))
            .arg(self.prefix())
            .arg(run_id)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        match reply.as_str() {
            // An ended run has nothing to hear.
            "ok" | "ended" => Ok(()),
            _ => Err(StoreError::NotFound(run_id.to_string())),
        }
    }

    fn nudges(&self, owner: &str) -> tokio::sync::mpsc::Receiver<Nudge> {
        self.listen_for_nudges(owner)
    }

    fn fenced(&self, lease: &Lease, guard: Arc<LeaseGuard>) -> Arc<dyn Store> {
        let mut store = self.clone();
        store.fence = Some(Arc::new(Fence {
            run_id: lease.run_id.clone(),
            epoch: lease.epoch,
            arg: format!("{} {}", lease.epoch, self.run_key_of(&lease.run_id)),
            guard,
            controls_key: self.controls_key(&lease.run_id),
        }));
        Arc::new(store)
    }
}
