//! The conversation as the engine keeps it: messages with their token
//! counts (counted once, when added), and the configuration of compression.

mod compress;
mod summarize;

use std::sync::Arc;

use crate::message::Message;
use crate::tokens::TokenCounter;

pub use compress::{
    fallback, format_summary, plan, splice, summarizer_request, CompressionPlan, SECTIONS, SUMMARY_MARKER,
};
pub use summarize::{compress_history, Compressed, CompressionMethod};

/// When and how history is compressed.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryConfig {
    /// The model's context window in tokens (default 200 000).
    pub context_window: usize,
    /// Compress when the request would use this share of the window (default 0.92).
    pub compression_threshold: f64,
    /// Warn (a `context.warning` event) at this share (default 0.80).
    pub warning_threshold: f64,
    /// Messages at the end of the history kept as they are (default 8; the
    /// cut moves back so a tool call is never split from its results).
    pub keep_recent_messages: usize,
    /// Compression aims below this share of the window (default 0.75), so
    /// the next turns do not compress again at once.
    pub target_ratio: f64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            context_window: 200_000,
            compression_threshold: 0.92,
            warning_threshold: 0.80,
            keep_recent_messages: 8,
            target_ratio: 0.75,
        }
    }
}

impl MemoryConfig {
    /// The token count at which compression starts.
    pub fn compress_at(&self) -> usize {
        (self.context_window as f64 * self.compression_threshold) as usize
    }

    /// The token count compression aims below.
    pub fn target(&self) -> usize {
        (self.context_window as f64 * self.target_ratio.min(self.compression_threshold)) as usize
    }

    /// The token count at which the warning is given.
    pub fn warn_at(&self) -> usize {
        (self.context_window as f64 * self.warning_threshold) as usize
    }
}

/// The run's history with its token count. Tokens are counted lazily: a
/// cheap upper bound (every token covers at least one byte) answers "far
/// from the window?", and exact counting — once per message — happens only
/// when the bound gets near a limit, so short runs never pay for it.
#[derive(Debug, Clone)]
pub struct Memory {
    messages: Vec<Message>,
    /// Exact tokens of `messages[..counted]`.
    counted_tokens: usize,
    counted: usize,
    /// Upper bound of the tokens of `messages[counted..]`.
    pending_bound: usize,
    counter: Arc<dyn TokenCounter>,
    /// Messages already written to a store, and whether the history was
    /// replaced since (compression), for checkpoints.
    saved: usize,
    replaced: bool,
    /// What the provider reported for the last request: how many messages
    /// it held, and its prompt plus answer tokens.
    reported: Option<(usize, usize)>,
}

/// What a checkpoint must write.
#[derive(Debug, Clone, Copy)]
pub enum Unsaved<'a> {
    /// Messages added since the last checkpoint.
    Tail(&'a [Message]),
    /// The history was replaced: all of it.
    Whole(&'a [Message]),
}

/// A message's upper bound: its bytes plus the per-message overhead.
fn bound(message: &Message) -> usize {
    let calls: usize = message
        .tool_calls()
        .iter()
        .map(|c| c.name.len() + c.arguments.to_string().len() + 3)
        .sum();
    message.content().len() + calls + 4
}

impl Memory {
    /// Empty memory counting with `counter`.
    pub fn new(counter: Arc<dyn TokenCounter>) -> Self {
        Self {
            messages: Vec::new(),
            counted_tokens: 0,
            counted: 0,
            pending_bound: 0,
            counter,
            saved: 0,
            replaced: false,
            reported: None,
        }
    }

    /// What is not in the store yet.
    pub fn unsaved(&self) -> Unsaved<'_> {
        if self.replaced {
            Unsaved::Whole(&self.messages)
        } else {
            Unsaved::Tail(&self.messages[self.saved.min(self.messages.len())..])
        }
    }

    /// Records that everything is in the store.
    pub fn mark_saved(&mut self) {
        self.saved = self.messages.len();
        self.replaced = false;
    }

    /// Adds one message.
    pub fn push(&mut self, message: Message) {
        self.pending_bound += bound(&message);
        self.messages.push(message);
    }

    /// Takes the last message off (not yet saved, or the next checkpoint
    /// rewrites the history).
    pub fn pop(&mut self) -> Option<Message> {
        let message = self.messages.pop()?;
        let index = self.messages.len();
        if index < self.counted {
            self.counted = index;
            self.counted_tokens = self.counted_tokens.saturating_sub(self.counter.count_message(&message));
        } else {
            self.pending_bound = self.pending_bound.saturating_sub(bound(&message));
        }
        if index < self.saved {
            self.saved = index;
            self.replaced = true;
        }
        if self.reported.is_some_and(|(messages, _)| messages > index) {
            self.reported = None;
        }
        Some(message)
    }

    /// Adds messages.
    pub fn extend(&mut self, messages: impl IntoIterator<Item = Message>) {
        for message in messages {
            self.push(message);
        }
    }

    /// Records the provider's count for a request of the first `messages`
    /// messages: `tokens` is its prompt (tool definitions included) plus its
    /// answer.
    pub fn record_reported(&mut self, messages: usize, tokens: usize) {
        self.reported = (messages <= self.messages.len()).then_some((messages, tokens));
    }

    /// An upper bound of the next request's tokens from the provider's own
    /// count of the last one plus the bytes added since: far tighter than
    /// [`Memory::upper_bound`] on a long history, so the tokenizer is only
    /// needed near the window. `None` when the provider reported nothing
    /// (or the history was rewritten since).
    pub fn reported_bound(&self) -> Option<usize> {
        let (messages, tokens) = self.reported?;
        let added: usize = self.messages.get(messages..)?.iter().map(bound).sum();
        Some(tokens.saturating_add(added))
    }

    /// Replaces the whole history (after compression).
    pub fn replace(&mut self, messages: Vec<Message>) {
        self.reported = None;
        self.messages.clear();
        self.counted_tokens = 0;
        self.counted = 0;
        self.pending_bound = 0;
        self.replaced = true;
        self.extend(messages);
    }

    /// The messages, system prompt first.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// A cheap upper bound of the tokens of every message.
    pub fn upper_bound(&self) -> usize {
        self.counted_tokens + self.pending_bound
    }

    /// The exact tokens of every message (counting what was not counted yet).
    pub fn total_tokens(&mut self) -> usize {
        for message in &self.messages[self.counted..] {
            self.counted_tokens += self.counter.count_message(message);
        }
        self.counted = self.messages.len();
        self.pending_bound = 0;
        self.counted_tokens + 3
    }

    /// The counter.
    pub fn counter(&self) -> &Arc<dyn TokenCounter> {
        &self.counter
    }

    /// Takes the messages out.
    pub fn into_messages(self) -> Vec<Message> {
        self.messages
    }
}
