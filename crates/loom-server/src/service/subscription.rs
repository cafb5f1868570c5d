//! Following a run: a subscriber's events, stored ones first (read page by
//! page), then the feed's buffer, then live — no gap, no duplicate.

use super::*;

/// One subscriber's events: the stored ones (read page by page), the
/// buffered ones, then live.
pub struct Subscription {
    stored: Option<StoredPages>,
    page: VecDeque<Arc<Event>>,
    buffered: VecDeque<Arc<Event>>,
    live: Option<mpsc::Receiver<Arc<Event>>>,
    lagged: Arc<AtomicBool>,
}

/// The part of a run's log still to be read from the store.
struct StoredPages {
    store: Arc<dyn Store>,
    run_id: String,
    after: u64,
    /// The last seq to read there (`None`: to the end of the log).
    until: Option<u64>,
}

/// Events read from the store at once: a long log never sits in memory whole.
const PAGE: usize = 256;

/// What a subscription gives next.
#[derive(Debug)]
pub enum Next {
    /// An event.
    Event(Arc<Event>),
    /// The run has ended and every event was given.
    End,
    /// The subscriber fell too far behind and was dropped: resubscribe
    /// after the last `seq` received.
    Lagged,
}

impl Subscription {
    /// The next event, or why there is none.
    pub async fn next(&mut self) -> Next {
        loop {
            if let Some(event) = self.page.pop_front() {
                return Next::Event(event);
            }
            let Some(stored) = &mut self.stored else { break };
            match stored.store.events_page(&stored.run_id, stored.after, PAGE).await {
                Ok(events) => {
                    let full = events.len() == PAGE;
                    let until = stored.until.unwrap_or(u64::MAX);
                    let mut reached = !full;
                    for event in events {
                        if event.seq > until {
                            reached = true;
                            break;
                        }
                        stored.after = event.seq;
                        self.page.push_back(Arc::new(event));
                    }
                    if reached || stored.after >= until {
                        self.stored = None;
                    }
                }
                Err(err) => {
                    tracing::error!(run_id = %stored.run_id, error = %err, "reading the run's events failed");
                    return Next::End;
                }
            }
        }
        if let Some(event) = self.buffered.pop_front() {
            return Next::Event(event);
        }
        let Some(live) = &mut self.live else { return Next::End };
        match live.recv().await {
            Some(event) => Next::Event(event),
            None if self.lagged.load(Ordering::SeqCst) => Next::Lagged,
            None => Next::End,
        }
    }
}

impl Service {
    /// `run.subscribe`: the events after `after`, then live ones.
    pub async fn subscribe(&self, principal: &Principal, run_id: &str, after: u64) -> Result<Subscription, ApiError> {
        // Whose it is (NOT_FOUND for another token's).
        let live = self.registry().run(principal, run_id).is_some();
        if !live {
            self.get(principal, run_id).await?;
        }
        let pages = |until: Option<u64>| {
            self.inner.store.clone().map(|store| StoredPages {
                store,
                run_id: run_id.to_string(),
                after,
                until,
            })
        };
        Ok(match self.inner.feed.join(run_id, after) {
            Some(joined) => Subscription {
                stored: joined.store_until.and_then(|until| pages(Some(until))),
                page: VecDeque::new(),
                buffered: joined.buffered.into(),
                live: Some(joined.live),
                lagged: joined.lagged,
            },
            // Ended: its whole log is in the store.
            None => Subscription {
                stored: pages(None),
                page: VecDeque::new(),
                buffered: VecDeque::new(),
                live: None,
                lagged: Arc::new(AtomicBool::new(false)),
            },
        })
    }
}
