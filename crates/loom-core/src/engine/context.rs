//! Phase 1 of a turn: the context. Counting, the warning at 80 %, structured
//! compression at the threshold (with a model-free fallback), and — once per
//! run — the system prompt assembled by priority from the base instructions,
//! project instructions, retrieved context and the tool list.

use crate::assembly::{load_project_instructions, ContextAssembler, ContextComponent, Priority};
use crate::event::{EventKind, TurnIds};
use crate::llm::ToolSpec;
use crate::memory::{compress_history, Memory};
use crate::message::Message;

use super::Run;

impl Run {
    /// Counts the request; warns near the limit; compresses past the
    /// threshold (or always when `force`). Returns whether it compressed.
    pub(crate) async fn prepare_context(
        &mut self,
        memory: &mut Memory,
        tools: &[ToolSpec],
        turn: &TurnIds,
        ctx: &crate::context::RunContext,
        force: bool,
    ) -> bool {
        let engine = self.engine.clone();
        let config = &engine.context.memory;
        // Far from the limits by the cheap bounds (bytes): nothing to count.
        let tools_bound = if tools.is_empty() {
            0
        } else {
            // The tools do not change during a run.
            *self.tools_bound.get_or_insert_with(|| {
                tools
                    .iter()
                    .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len() + 8)
                    .sum()
            })
        };
        // The provider's own count of the last request, when it gave one,
        // includes the tool definitions already.
        let bytes_bound = memory.upper_bound() + tools_bound;
        // A report of nothing, or of far fewer tokens than the bytes could
        // hold (a server that counts a silently truncated prompt), is not
        // trusted: then the bytes decide.
        let bound = memory
            .reported_bound()
            .filter(|reported| *reported > 0 && *reported >= bytes_bound / 8)
            .map_or(bytes_bound, |reported| reported.min(bytes_bound));
        if !force && bound < config.warn_at() {
            return false;
        }
        let tools_tokens = match self.tools_tokens {
            Some(tokens) if !tools.is_empty() => tokens,
            _ => {
                let tokens = memory.counter().count_tools(tools);
                if !tools.is_empty() {
                    self.tools_tokens = Some(tokens);
                }
                tokens
            }
        };
        let used = memory.total_tokens() + tools_tokens;
        if used >= config.warn_at() && !self.context_warned {
            self.context_warned = true;
            self.events.emit(
                turn,
                EventKind::ContextWarning {
                    tokens: used,
                    context_window: config.context_window,
                    ratio: used as f64 / config.context_window.max(1) as f64,
                },
            );
        }
        if !force && used < config.compress_at() {
            return false;
        }
        self.phase(turn, "compression", true);
        let budget = config.target().saturating_sub(tools_tokens);
        let before = memory.messages().len();
        let counter = memory.counter().clone();
        let (messages, method) = self.compress(memory.messages(), counter.as_ref(), budget, ctx).await;
        let tokens_before = used.saturating_sub(tools_tokens);
        memory.replace(messages);
        let tokens_after = memory.total_tokens();
        self.metrics.record_compression(tokens_before, tokens_after);
        // A later climb towards the window warns again.
        self.context_warned = memory.total_tokens() + tools_tokens >= config.warn_at();
        self.events.emit(
            turn,
            EventKind::CompressionApplied {
                messages_before: before,
                messages_after: memory.messages().len(),
                tokens_before,
                tokens_after,
                method: method.to_string(),
            },
        );
        self.phase(turn, "compression", false);
        true
    }

    /// The compressed history and how it was made (`summary` or `fallback`).
    async fn compress(
        &mut self,
        messages: &[Message],
        counter: &dyn crate::tokens::TokenCounter,
        budget: usize,
        ctx: &crate::context::RunContext,
    ) -> (Vec<Message>, &'static str) {
        let engine = self.engine.clone();
        let summarizer = engine.context.summarizer.as_ref().unwrap_or(&engine.llm);
        let started = std::time::Instant::now();
        let done = compress_history(
            messages,
            summarizer.as_ref(),
            counter,
            &engine.context.memory,
            budget,
            ctx.cancel_token(),
        )
        .await;
        if done.summarizer_called {
            self.metrics.llm_calls += 1;
            self.metrics.llm_ms += started.elapsed().as_millis() as u64;
        }
        if let Some(usage) = &done.usage {
            self.metrics.add_usage(usage);
        }
        if let Some(code) = &done.failure {
            self.metrics.record_error(code);
        }
        (done.messages, done.method)
    }

    /// The system prompt of this run.
    pub(crate) async fn system_prompt(&mut self, prompt: &str, turn: &TurnIds, memory: &Memory) -> String {
        let engine = self.engine.clone();
        let settings = &engine.context;
        let mut assembler = ContextAssembler::new(settings.system_budget, memory.counter().as_ref());
        assembler.add(ContextComponent::new(
            "base",
            engine.system_prompt.clone(),
            Priority::Critical,
            false,
        ));

        let dirs = settings.instruction_dirs.clone();
        let instructions = tokio::task::spawn_blocking(move || load_project_instructions(&dirs))
            .await
            .unwrap_or_default();
        for found in instructions {
            let name = found
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            assembler.add(ContextComponent::new(
                "project_instructions",
                format!("# Project instructions ({name})\n\n{}", found.content.trim()),
                Priority::High,
                true,
            ));
        }

        if let Some(retriever) = &settings.retriever {
            self.events.emit(
                turn,
                EventKind::RetrievalStart {
                    query: prompt.to_string(),
                },
            );
            let docs = match retriever.retrieve(prompt, settings.retrieval_limit).await {
                Ok(docs) => docs,
                Err(err) => {
                    self.metrics.record_error("RETRIEVAL");
                    self.events.emit(
                        turn,
                        EventKind::Error {
                            code: "RETRIEVAL".to_string(),
                            message: err.to_string(),
                            recoverable: true,
                        },
                    );
                    Vec::new()
                }
            };
            self.events.emit(
                turn,
                EventKind::RetrievalComplete {
                    doc_count: docs.len(),
                    sources: docs.iter().map(|d| d.source.clone()).collect(),
                },
            );
            if !docs.is_empty() {
                let mut text = String::from(
                    "# Retrieved context\n\nPassages that may help with the request, most relevant first:\n",
                );
                for (index, doc) in docs.iter().enumerate() {
                    text.push_str(&format!("\n[{}] {}\n{}\n", index + 1, doc.source, doc.content.trim()));
                }
                assembler.add(ContextComponent::new("retrieved_context", text, Priority::Medium, true));
            }
        }

        let specs = engine.pipeline.registry().specs();
        if !specs.is_empty() {
            let mut list = String::from("# Tools\n");
            for spec in specs {
                let first = spec.description.lines().next().unwrap_or_default();
                list.push_str(&format!("\n- {}: {first}", spec.name));
            }
            assembler.add(ContextComponent::new("tool_list", list, Priority::Low, true));
        }
        assembler.assemble().text
    }
}
