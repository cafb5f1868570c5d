//! [`RunLeases::nudges`] on Redis: the scripts that make a run claimable
//! publish its id on `{p}work`, and `send_control` publishes on
//! `{p}nudge:OWNER` for the worker that leases the run. A worker listens
//! on a connection of its own (Redis's pub/sub takes it over), made again
//! with a backoff when it drops. A message lost meanwhile costs only
//! time: the worker's renewals and claims find the same in the store.
//!
//! [`RunLeases::nudges`]: loom_core::RunLeases::nudges

use std::time::Duration;

use futures_util::StreamExt;
use loom_core::Nudge;
use tokio::sync::mpsc;

use crate::store::RedisStore;

/// The longest wait between two attempts to listen again.
const MOST_BACKOFF: Duration = Duration::from_secs(2);

/// How long connecting and subscribing may take.
const SUBSCRIBE_PATIENCE: Duration = Duration::from_secs(2);

impl RedisStore {
    /// Starts listening for `owner`'s nudges on a task of its own (call
    /// within a Tokio runtime); it stops once the receiver is dropped.
    pub(crate) fn listen_for_nudges(&self, owner: &str) -> mpsc::Receiver<Nudge> {
        // Nudges say "look now": past a few dozen waiting, more say nothing
        // new (a control dropped here is brought by the next renewal).
        let (tx, rx) = mpsc::channel(64);
        let channels = Channels {
            work: format!("{}work", self.prefix()),
            control: format!("{}nudge:{owner}", self.prefix()),
        };
        tokio::spawn(listen(self.client().clone(), channels, tx));
        rx
    }
}

struct Channels {
    work: String,
    control: String,
}

async fn listen(client: redis::Client, channels: Channels, tx: mpsc::Sender<Nudge>) {
    let mut backoff = Duration::from_millis(100);
    while !tx.is_closed() {
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&[&channels.work, &channels.control]).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(SUBSCRIBE_PATIENCE, subscribed).await {
            Ok(Ok(pubsub)) => {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.into_on_message();
                loop {
                    tokio::select! {
                        () = tx.closed() => return,
                        message = messages.next() => match message {
                            Some(message) => {
                                let nudge = if message.get_channel_name() == channels.work {
                                    Nudge::Work
                                } else {
                                    Nudge::Control
                                };
                                let _ = tx.try_send(nudge);
                            }
                            // The connection dropped (Redis restarted, say).
                            None => break,
                        }
                    }
                }
                tracing::warn!("the connection for nudges dropped; listening again");
            }
            // The worker polls meanwhile: no need to say so every time.
            Ok(Err(err)) => tracing::debug!(error = %err, "cannot listen for nudges"),
            Err(_) => tracing::debug!("listening for nudges timed out"),
        }
        tokio::select! {
            () = tx.closed() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MOST_BACKOFF);
    }
}
