//! Token counting with `tiktoken-rs` (its BPE files are built in).
//!
//! OpenAI models get their own encoding (`o200k_base` for the GPT-4o, 4.1,
//! 4.5, 5 and o-series families; `cl100k_base` for GPT-4 and GPT-3.5).
//! Other models (Claude, Llama, Qwen, Mistral, DeepSeek…) have tokenizers
//! that are not public or not built in: for them Loom counts with
//! `o200k_base` as an estimate, which lands within about 10–20 % of their
//! real counts on English text and code — close enough to decide when to
//! compress, with the threshold's margin absorbing the difference.

use tiktoken_rs::CoreBPE;

use crate::llm::ToolSpec;
use crate::message::Message;

/// Tokens every message costs besides its text (role and separators), as
/// OpenAI documents for its chat format.
const PER_MESSAGE_OVERHEAD: usize = 4;

/// Counts tokens of text, messages and tool definitions.
pub trait TokenCounter: Send + Sync + std::fmt::Debug {
    /// Tokens of `text`.
    fn count_text(&self, text: &str) -> usize;

    /// Whether the count is exact for the model (`false` for an estimate).
    fn is_exact(&self) -> bool;

    /// Tokens of one message, its overhead and tool calls included.
    fn count_message(&self, message: &Message) -> usize {
        let calls: usize = message
            .tool_calls()
            .iter()
            .map(|call| self.count_text(&call.name) + self.count_text(&call.arguments.to_string()) + 3)
            .sum();
        PER_MESSAGE_OVERHEAD + self.count_text(message.content()) + calls
    }

    /// Tokens of a list of messages.
    fn count_messages(&self, messages: &[Message]) -> usize {
        messages.iter().map(|m| self.count_message(m)).sum::<usize>() + 3
    }

    /// Tokens the tool definitions take in a request.
    fn count_tools(&self, tools: &[ToolSpec]) -> usize {
        tools
            .iter()
            .map(|t| {
                self.count_text(&t.name)
                    + self.count_text(&t.description)
                    + self.count_text(&t.parameters.to_string())
                    + 8
            })
            .sum()
    }
}

/// The tiktoken encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// GPT-4o, 4.1, 4.5, 5, o1/o3/o4.
    O200kBase,
    /// GPT-4, GPT-3.5, embeddings v3.
    Cl100kBase,
}

/// Counts with a tiktoken encoding.
#[derive(Debug, Clone, Copy)]
pub struct TiktokenCounter {
    encoding: Encoding,
    exact: bool,
}

impl TiktokenCounter {
    /// The counter for `model` (with or without a `provider:` prefix).
    pub fn for_model(model: &str) -> Self {
        let name = model
            .split_once(':')
            .map_or(model, |(_, name)| name)
            .to_ascii_lowercase();
        let name = name.as_str();
        let o200k = ["gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o", "o1", "o3", "o4"];
        let cl100k = ["gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada"];
        if o200k.iter().any(|prefix| name.starts_with(prefix)) {
            Self::new(Encoding::O200kBase, true)
        } else if cl100k.iter().any(|prefix| name.starts_with(prefix)) {
            Self::new(Encoding::Cl100kBase, true)
        } else {
            Self::new(Encoding::O200kBase, false)
        }
    }

    /// A counter with `encoding`; `exact` says whether it is the model's own.
    pub fn new(encoding: Encoding, exact: bool) -> Self {
        Self { encoding, exact }
    }

    /// The encoding used.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    fn bpe(&self) -> &'static CoreBPE {
        match self.encoding {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }
}

impl TokenCounter for TiktokenCounter {
    fn count_text(&self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        self.bpe().encode_ordinary(text).len()
    }

    fn is_exact(&self) -> bool {
        self.exact
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_model_encoding() {
        assert_eq!(
            TiktokenCounter::for_model("openai:gpt-4o-mini").encoding(),
            Encoding::O200kBase
        );
        assert!(TiktokenCounter::for_model("gpt-4o").is_exact());
        assert_eq!(
            TiktokenCounter::for_model("gpt-4-turbo").encoding(),
            Encoding::Cl100kBase
        );
        assert_eq!(
            TiktokenCounter::for_model("gpt-3.5-turbo").encoding(),
            Encoding::Cl100kBase
        );
        let claude = TiktokenCounter::for_model("anthropic:claude-sonnet-4");
        assert!(!claude.is_exact());
    }

    #[test]
    fn counts_known_strings() {
        let counter = TiktokenCounter::for_model("gpt-4o");
        assert_eq!(counter.count_text("hello world"), 2);
        assert_eq!(counter.count_text(""), 0);
        let messages = [Message::system("You are helpful."), Message::user("hello world")];
        let total = counter.count_messages(&messages);
        assert!(total > 2 + 4 && total < 30, "{total}");
    }
}

#[cfg(test)]
mod encoding_tests {
    use super::*;

    #[test]
    fn the_two_encodings_differ_where_they_should() {
        let text = "Привет, мир! こんにちは世界 — 🚀 sphinx of black quartz, judge my vow";
        let o200k = TiktokenCounter::new(Encoding::O200kBase, true).count_text(text);
        let cl100k = TiktokenCounter::new(Encoding::Cl100kBase, true).count_text(text);
        assert_ne!(o200k, cl100k, "{o200k} vs {cl100k}");
        assert!(o200k < cl100k, "o200k packs non-English text tighter");
    }
}
