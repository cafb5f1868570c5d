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
pub use summarize::{compress_history, Compressed};

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
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            context_window: 200_000,
            compression_threshold: 0.92,
            warning_threshold: 0.80,
            keep_recent_messages: 8,
        }
    }
}

impl MemoryConfig {
    /// The token count at which compression starts.
    pub fn compress_at(&self) -> usize {
        (self.context_window as f64 * self.compression_threshold) as usize
    }

    /// The token count at which the warning is given.
    pub fn warn_at(&self) -> usize {
        (self.context_window as f64 * self.warning_threshold) as usize
    }
}

/// The run's history with a running token count.
#[derive(Debug, Clone)]
pub struct Memory {
    messages: Vec<Message>,
    tokens: Vec<usize>,
    total: usize,
    counter: Arc<dyn TokenCounter>,
}

impl Memory {
    /// Empty memory counting with `counter`.
    pub fn new(counter: Arc<dyn TokenCounter>) -> Self {
        Self {
            messages: Vec::new(),
            tokens: Vec::new(),
            total: 0,
            counter,
        }
    }

    /// Adds one message.
    pub fn push(&mut self, message: Message) {
        let tokens = self.counter.count_message(&message);
        self.total += tokens;
        self.tokens.push(tokens);
        self.messages.push(message);
    }

    /// Adds messages.
    pub fn extend(&mut self, messages: impl IntoIterator<Item = Message>) {
        for message in messages {
            self.push(message);
        }
    }

    /// Replaces the whole history (after compression).
    pub fn replace(&mut self, messages: Vec<Message>) {
        self.messages.clear();
        self.tokens.clear();
        self.total = 0;
        self.extend(messages);
    }

    /// The messages, system prompt first.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Tokens of every message.
    pub fn total_tokens(&self) -> usize {
        self.total
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
