//! Answering a request, whichever way it came (a WebSocket frame or an
//! HTTP route): one typed [`Request`] in, one typed [`Answer`] out.

use crate::auth::Principal;
use crate::error::ApiError;
use crate::protocol::{Answer, Asks, Request, Responded, Steered, Subscribed, Unsubscribed};
use crate::service::{Service, Subscription};

/// The answer to `request`, and for `run.subscribe` the subscription whose
/// events follow it.
pub(crate) async fn answer(
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
    };
    Ok((answer, None))
}
