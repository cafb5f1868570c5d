//! Answering a request, whichever way it came (a WebSocket frame or an
//! HTTP route): one typed [`Request`] in, one typed [`Answer`] out; every
//! request that changes something is written to the audit trail, with its
//! outcome, before it is answered.

use std::net::SocketAddr;

use serde_json::json;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::protocol::{Answer, Asks, Request, Responded, Steered, Subscribed, Unsubscribed};
use crate::service::{Audited, Service, Subscription};

/// Who sent a request, and from where.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The token's principal.
    pub(crate) principal: Principal,
    /// The client's socket address (none for a request made in process).
    pub(crate) address: Option<SocketAddr>,
}

/// The answer to `request`, and for `run.subscribe` the subscription whose
/// events follow it. The request is carried out, and recorded, on a task of
/// its own: a client that hangs up while a change waits (a cancel waits for
/// its run to stop) drops only its wait for the answer, never the record
/// of a change that then happens.
pub(crate) async fn answer(
    service: &Service,
    caller: &Caller,
    request: Request,
) -> Result<(Answer, Option<Subscription>), ApiError> {
    let (service, caller) = (service.clone(), caller.clone());
    tokio::spawn(async move { carry_out(&service, &caller, request).await })
        .await
        .unwrap_or_else(|failed| Err(ApiError::internal("a request failed", failed)))
}

async fn carry_out(
    service: &Service,
    caller: &Caller,
    request: Request,
) -> Result<(Answer, Option<Subscription>), ApiError> {
    let audited = audited(caller, &request);
    let answered = dispatch(service, &caller.principal, request).await;
    if let Some(mut audited) = audited {
        match &answered {
            Ok((Answer::Accepted(accepted), _)) => {
                audited.target = Some(accepted.run_id.clone());
                if let Some(detail) = audited.detail.as_object_mut() {
                    detail.insert("sessionId".into(), accepted.session_id.clone().into());
                    detail.insert("steered".into(), accepted.steered.into());
                }
            }
            Ok(_) => {}
            Err(err) => audited.outcome = Err(err.code),
        }
        service.audit(audited).await;
    }
    answered
}

/// The audit record of `request`, if it changes something: its method,
/// the run, and what else tells what it did (never a prompt, a message or
/// a token).
fn audited(caller: &Caller, request: &Request) -> Option<Audited> {
    let (action, target, detail) = match request {
        Request::Run(params) => (
            "agent.run",
            None,
            json!({ "sessionId": params.session_id, "model": params.model, "mode": params.mode }),
        ),
        Request::Cancel(params) => ("agent.cancel", Some(params.run_id.clone()), serde_json::Value::Null),
        Request::Steer(params) => ("agent.steer", Some(params.run_id.clone()), serde_json::Value::Null),
        Request::Respond(params) => (
            "permission.respond",
            Some(params.run_id.clone()),
            json!({
                "requestId": params.request_id,
                "decision": if params.decision == loom_core::PermissionDecision::Deny { "deny" } else { "allow" },
                "always": params.decision == loom_core::PermissionDecision::Always,
            }),
        ),
        Request::Rewind(params) => (
            "run.rewind",
            Some(params.run_id.clone()),
            json!({
                "step": params.step,
                "files": params.files,
                "conversation": params.conversation,
                "dryRun": params.dry_run,
                "force": params.force,
            }),
        ),
        Request::Fork(params) => (
            "run.fork",
            Some(params.run_id.clone()),
            json!({ "step": params.step, "force": params.force, "prompt": params.prompt.is_some() }),
        ),
        Request::Asks(_)
        | Request::Get(_)
        | Request::List(_)
        | Request::Subscribe(_)
        | Request::Unsubscribe(_)
        | Request::File(_) => return None,
    };
    let mut audited = Audited::by(action, &caller.principal, caller.address);
    audited.target = target;
    audited.detail = detail;
    Some(audited)
}

async fn dispatch(
    service: &Service,
    who: &Principal,
    request: Request,
) -> Result<(Answer, Option<Subscription>), ApiError> {
    let answer = match request {
        Request::Run(params) => Answer::Accepted(service.start(who, params).await?),
        Request::Cancel(params) => Answer::Cancelled(service.cancel(who, &params.run_id).await?),
        Request::Steer(params) => {
            service.steer(who, &params.run_id, params.message).await?;
            Answer::Steered(Steered {
                run_id: params.run_id,
                accepted: true,
            })
        }
        Request::Respond(params) => {
            service
                .respond(who, &params.run_id, &params.request_id, params.decision)
                .await?;
            Answer::Responded(Responded {
                run_id: params.run_id,
                request_id: params.request_id,
                decision: params.decision,
            })
        }
        Request::Asks(params) => Answer::Asks(Asks {
            asks: service.pending(who, params.run_id.as_deref()).await?,
        }),
        Request::Get(params) => Answer::Run(Box::new(service.get(who, &params.run_id).await?)),
        Request::List(params) => Answer::Page(service.list(who, params).await?),
        Request::Subscribe(params) => {
            let subscription = service.subscribe(who, &params.run_id, params.after_seq).await?;
            let answer = Answer::Subscribed(Subscribed {
                run_id: params.run_id,
                after_seq: params.after_seq,
            });
            return Ok((answer, Some(subscription)));
        }
        Request::Unsubscribe(params) => Answer::Unsubscribed(Unsubscribed {
            run_id: params.run_id,
            unsubscribed: true,
        }),
        Request::Rewind(params) => Answer::Rewound(service.rewind(who, params).await?),
        Request::Fork(params) => Answer::Forked(Box::new(service.fork(who, params).await?)),
        Request::File(params) => Answer::File(service.snapshot_file(who, params).await?),
    };
    Ok((answer, None))
}
