//! `loom runs resume | cancel`: acting on recorded runs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use loom::owner::{liveness, owner_pid, Liveness};
use loom::{ResumeError, RunStatus, Store, StoreError};

use crate::cli::{AgentArgs, PlaceArgs};
use crate::exit::Failure;
use crate::run::{build_agent, follow};

/// How long `cancel` waits for a live run's process to record the end.
const CANCEL_WAIT: Duration = Duration::from_secs(15);

/// Where `loom runs` found the run, for the resumed agent to record it there.
pub(crate) enum RecordedIn {
    Sqlite(PathBuf),
    Redis(String),
}

/// Continues a run whose process died, here, streaming it like `loom run`.
pub(crate) async fn resume(
    store: &dyn Store,
    recorded_in: RecordedIn,
    workspace: Option<PathBuf>,
    id: &str,
    agent_args: &AgentArgs,
    json: bool,
) -> Result<ExitCode, Failure> {
    let record = store.load_run(id).await.map_err(not_found_is_usage)?.run;
    // A gateway's run goes on with what its client's request allowed (its
    // tools, the gateway's permissions), which this command does not
    // know: the gateway takes it back when it starts on this store.
    if let Some(token) = &record.principal {
        return Err(Failure::Usage(anyhow!(
            "run {id} belongs to a gateway (token '{token}'); `loom serve` on this store resumes it when it starts"
        )));
    }
    // The tools work where the run started, unless told otherwise.
    let recorded = record
        .workspace
        .as_deref()
        .map(PathBuf::from)
        .filter(|dir| dir.is_dir());
    let (db, redis) = match recorded_in {
        RecordedIn::Sqlite(db) => (Some(db), None),
        RecordedIn::Redis(url) => (None, Some(url)),
    };
    let place = PlaceArgs {
        workspace: workspace.or(recorded),
        db,
        redis,
    };
    let agent = build_agent(agent_args, &place, Some(&record.model))
        .await
        .map_err(Failure::Usage)?;
    let handle = agent.resume(id).await.map_err(|err| match err {
        ResumeError::Store(err) => not_found_is_usage(err),
        other => Failure::Usage(anyhow!("{other}")),
    })?;
    if !json {
        say!("loom: resuming run {id} from its last checkpoint");
    }
    follow(handle, json, agent_args).await
}

/// Cancels a run: a live local process is asked to stop it (as Ctrl-C
/// would), a run nobody executes any more is closed in the store.
pub(crate) async fn cancel(store: &dyn Store, id: &str, json: bool) -> Result<ExitCode, Failure> {
    let record = store.load_run(id).await.map_err(not_found_is_usage)?.run;
    let status = match record.status {
        status if status.is_terminal() => {
            return Err(Failure::Usage(anyhow!(
                "run {id} already ended ({}); nothing to cancel",
                status.as_str()
            )))
        }
        RunStatus::Running | RunStatus::WaitingPermission => match liveness(&record.owner) {
            Liveness::Alive => signal_owner(store, id, &record.owner).await?,
            Liveness::Dead => {
                store.mark_interrupted(id, &record.owner).await.map_err(runtime)?;
                close(store, id).await?
            }
            Liveness::Unknown => {
                return Err(Failure::Runtime(anyhow!(
                    "run {id} is {} under {}, which this machine cannot reach; cancel it where it runs",
                    record.status.as_str(),
                    record.owner
                )))
            }
        },
        RunStatus::Queued | RunStatus::Interrupted => close(store, id).await?,
        other => other,
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"runId": id, "status": status, "cancelled": status == RunStatus::Canceled})
        );
    } else {
        println!("run {id}: {}", status.as_str());
    }
    Ok(ExitCode::SUCCESS)
}

/// `loom runs cancel` of a run the cluster's workers execute: the run is
/// withdrawn from the line if no worker took it, else the cancel is
/// stored for its worker; answers once the run has stopped (at most a
/// minute).
pub(crate) async fn cancel_on_workers(
    store: &dyn Store,
    leases: &dyn loom::RunLeases,
    id: &str,
    json: bool,
) -> Result<ExitCode, Failure> {
    let snapshot = store.load_run(id).await.map_err(not_found_is_usage)?;
    if snapshot.run.status.is_terminal() {
        return Err(Failure::Usage(anyhow!(
            "run {id} already ended ({}); nothing to cancel",
            snapshot.run.status.as_str()
        )));
    }
    let reason = "cancelled with `loom runs cancel`";
    let turn = loom::event::TurnIds {
        turn_id: id.into(),
        parent_turn_id: None,
    };
    let log = loom::recovery::cancelled_log(id, snapshot.last_seq, &turn, reason, &snapshot.run.metrics);
    if !leases.withdraw(id, &log).await.map_err(runtime)? {
        let cancel = loom::Control::Cancel { reason: reason.into() };
        leases.send_control(id, &cancel).await.map_err(runtime)?;
    }
    let started = std::time::Instant::now();
    let status = loop {
        let status = store.load_run(id).await.map_err(runtime)?.run.status;
        if status.is_terminal() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            return Err(Failure::Runtime(anyhow!(
                "run {id} is still {} a minute after its cancel was sent to its worker",
                status.as_str()
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"runId": id, "status": status, "cancelled": status == RunStatus::Canceled})
        );
    } else {
        println!("run {id}: {}", status.as_str());
    }
    Ok(ExitCode::SUCCESS)
}

async fn close(store: &dyn Store, id: &str) -> Result<RunStatus, Failure> {
    loom::recovery::close_cancelled(store, id, "cancelled with `loom runs cancel`")
        .await
        .map_err(runtime)?;
    Ok(RunStatus::Canceled)
}

/// Interrupts the owning process (its Ctrl-C handling cancels the run and
/// records the end), then waits for the recorded end.
async fn signal_owner(store: &dyn Store, id: &str, owner: &str) -> Result<RunStatus, Failure> {
    let pid = owner_pid(owner).ok_or_else(|| Failure::Runtime(anyhow!("cannot tell the process of {owner}")))?;
    interrupt(pid).map_err(|err| Failure::Runtime(anyhow!("cannot signal process {pid}: {err}")))?;
    let started = Instant::now();
    loop {
        let status = store.load_run(id).await.map_err(runtime)?.run.status;
        if status.is_terminal() {
            return Ok(status);
        }
        if started.elapsed() > CANCEL_WAIT {
            return Err(Failure::Runtime(anyhow!(
                "process {pid} was asked to cancel run {id}, but the run is still {} after {} s",
                status.as_str(),
                CANCEL_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(unix)]
fn interrupt(pid: u32) -> std::io::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
    // SAFETY: kill(2) has no memory effects; it only sends a signal.
    if unsafe { libc::kill(pid, libc::SIGINT) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn interrupt(_pid: u32) -> std::io::Result<()> {
    Err(std::io::Error::other("signalling another process needs a Unix system"))
}

fn not_found_is_usage(err: StoreError) -> Failure {
    match err {
        StoreError::NotFound(_) => Failure::Usage(anyhow!("{err}")),
        other => runtime(other),
    }
}

fn runtime(err: StoreError) -> Failure {
    Failure::Runtime(anyhow!("{err}"))
}
