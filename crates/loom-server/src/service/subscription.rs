//! Following a run: a subscriber's events, stored ones first (read page by
//! page), then the feed's buffer, then live — no gap, no duplicate.

use super::*;

/// One subscriber's events: the stored ones (read page by page), the
/// buffered ones, then live.
pub struct Subscription {
    run_id: String,
    /// The last `seq` of the run's own events given (or the `afterSeq`
    /// asked for): a later one only. A client may ask after a `seq` it
    /// read in the run's view before the feed has published that far.
    given: u64,
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
    /// Whether the run was live when subscribed: its `lifecycle.end` is
    /// the last event to wait for. A stored run's log may go on past it
    /// (`run.rewound`, `run.forked`): it ends where the log does.
    pub fn follows_live(&self) -> bool {
        self.live.is_some()
    }

    /// The next event, or why there is none.
    pub async fn next(&mut self) -> Next {
        loop {
            let next = self.next_any().await;
            if let Next::Event(event) = &next {
                if *event.run_id == *self.run_id {
                    if event.seq <= self.given {
                        continue;
                    }
                    self.given = event.seq;
                }
            }
            return next;
        }
    }

    /// The next event from the store, the buffer or live.
    async fn next_any(&mut self) -> Next {
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
        self.adopt(principal, run_id).await?;
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
                run_id: run_id.to_string(),
                given: after,
                stored: joined.store_until.and_then(|until| pages(Some(until))),
                page: VecDeque::new(),
                buffered: joined.buffered.into(),
                live: Some(joined.live),
                lagged: joined.lagged,
            },
            // Ended: its whole log is in the store.
            None => Subscription {
                run_id: run_id.to_string(),
                given: after,
                stored: pages(None),
                page: VecDeque::new(),
                buffered: VecDeque::new(),
                live: None,
                lagged: Arc::new(AtomicBool::new(false)),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_core::event::TurnIds;

    fn event(run_id: &str, seq: u64) -> Arc<Event> {
        let turn = TurnIds {
            turn_id: "t".into(),
            parent_turn_id: None,
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let emitter = loom_core::emitter::EventEmitter::new(run_id.into(), 0, tx).continuing_after(seq - 1);
        emitter.emit(&turn, EventKind::IterationStart { iteration: 0 });
        Arc::new(*rx.try_recv().expect("emitted"))
    }

    #[tokio::test]
    async fn a_subscriber_never_gets_a_seq_of_its_run_twice_or_at_or_before_the_one_it_asked_after() {
        let (tx, live) = mpsc::channel(8);
        let mut subscription = Subscription {
            run_id: "r".into(),
            given: 4,
            stored: None,
            page: VecDeque::new(),
            // The feed had not published up to 4 when the client read it in the run's view.
            buffered: [event("r", 3), event("child", 1)].into(),
            live: Some(live),
            lagged: Arc::new(AtomicBool::new(false)),
        };
        for seq in [4, 5, 5, 6] {
            tx.send(event("r", seq)).await.unwrap_or_default();
        }
        drop(tx);
        let mut got = Vec::new();
        while let Next::Event(event) = subscription.next().await {
            got.push((event.run_id.to_string(), event.seq));
        }
        let expected = [("child", 1), ("r", 5), ("r", 6)].map(|(run, seq)| (run.to_string(), seq));
        assert_eq!(got, expected, "a sub-agent's own numbering is not the run's");
    }
}
