//! One claimed run executed by a worker: its agent (the model and tools
//! its request asked for) recording through the lease's fenced store,
//! started from its request or resumed from its last checkpoint.

use std::sync::Arc;

use loom_core::{Agent, Claim, RunHandle, RunRequest, Store};

use crate::agents::Agents;
use crate::protocol::StartRun;

/// A run started: its handle, and the client's trace context it was
/// started with (docs/telemetry.md).
pub(crate) type Started = (RunHandle, Option<loom_core::TraceParent>);

/// Why a claimed run did not start.
pub(crate) enum NotStarted {
    /// It never can (its request is unreadable): it is cancelled, with the reason.
    Never(String),
    /// Not now (its model or a tool cannot be set up here): its lease
    /// runs out, and a worker tries again.
    NotNow(String),
}

/// The agent for a run of `params`: its model (none for the default),
/// its tools and its mode, recording in `store`.
async fn agent_for(
    agents: &Agents,
    model: Option<&str>,
    tools: Option<&[String]>,
    mode: loom_core::Mode,
    store: Arc<dyn Store>,
) -> Result<Agent, NotStarted> {
    let model = model.filter(|model| *model != agents.default_model());
    let agent = agents.get(model, tools, mode).await.map_err(NotStarted::NotNow)?;
    Ok(agent.with_store(store))
}

/// Starts or resumes the claimed run, recording through `store` (the
/// lease's fenced store); `records` reads without the fence.
pub(crate) async fn start(
    agents: &Agents,
    claim: &Claim,
    store: Arc<dyn Store>,
    records: &dyn Store,
    allowed_modes: &[loom_core::Mode],
) -> Result<Started, NotStarted> {
    // A mode the cluster no longer allows (taken off `allowed_modes` since
    // the run was accepted): never executed.
    let allowed = |mode: loom_core::Mode| {
        if allowed_modes.contains(&mode) {
            Ok(())
        } else {
            Err(NotStarted::Never(format!("its mode {mode} is no longer allowed")))
        }
    };
    let run_id = &claim.lease().run_id;
    let record = records
        .load_run(run_id)
        .await
        .map_err(|err| NotStarted::NotNow(err.to_string()))?
        .run;
    match claim {
        Claim::Start { request, .. } => {
            let params: StartRun = serde_json::from_str(request)
                .map_err(|err| NotStarted::Never(format!("its stored request is unreadable: {err}")))?;
            allowed(params.mode.unwrap_or_default())?;
            let agent = agent_for(
                agents,
                params.model.as_deref(),
                params.tools.as_deref(),
                params.mode.unwrap_or_default(),
                store,
            )
            .await?;
            let trace_parent = params.traceparent;
            let handle = agent.run(RunRequest {
                prompt: params.prompt,
                run_id: Some(record.run_id),
                session_id: Some(record.session_id),
                // A run that begins its session has no conversation to read back.
                history: params.session_id.is_none().then(Vec::new),
                max_steps: params.max_steps,
                principal: record.principal,
                forked_from: None,
                trace_parent,
            });
            Ok((handle, trace_parent))
        }
        Claim::Resume { .. } => {
            // The tools and the mode its request was given, no more.
            let (tools, mode) = match records
                .run_request(run_id)
                .await
                .map_err(|err| NotStarted::NotNow(err.to_string()))?
            {
                Some(request) => {
                    let params = serde_json::from_str::<StartRun>(&request)
                        .map_err(|err| NotStarted::Never(format!("its stored request is unreadable: {err}")))?;
                    (params.tools, params.mode.unwrap_or_default())
                }
                None => (None, loom_core::Mode::Default),
            };
            allowed(mode)?;
            let agent = agent_for(agents, Some(&record.model), tools.as_deref(), mode, store).await?;
            let resuming = agent
                .prepare_resume(run_id)
                .await
                .map_err(|err| NotStarted::NotNow(err.to_string()))?;
            let trace_parent = resuming.trace_parent();
            let handle = resuming
                .start()
                .await
                .map_err(|err| NotStarted::NotNow(err.to_string()))?;
            Ok((handle, trace_parent))
        }
    }
}
