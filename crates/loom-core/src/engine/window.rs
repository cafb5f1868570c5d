//! Phase 1 of a turn: the context window. Counting, the warning at 80 %, structured
//! compression at the threshold (with a model-free fallback), and — once per
//! run — the system prompt assembled by priority from the base instructions,
//! project instructions, retrieved context and the tool list.

use crate::assembly::{load_project_instructions, ContextAssembler, ContextComponent, Priority};
use crate::event::{EventKind, Phase};
use crate::llm::ToolSpec;
use crate::machine::TurnMachine;
use crate::memory::{compress_history, CompressionMethod};
use crate::message::Message;
use crate::outcome::ErrorCode;

use super::Driver;

impl Driver {
    /// Counts the request; warns near the limit; compresses past the
    /// threshold (or always when `force`), telling the machine.
    pub(super) async fn prepare_context(&mut self, machine: &mut TurnMachine, tools: &[ToolSpec], force: bool) {
        let engine = self.engine.clone();
        let config = &engine.context.memory;
        let turn = machine.ids().clone();
        // Far from the limits by the cheap bounds (bytes): nothing to count.
        let tools_bound = if tools.is_empty() {
            0
        } else {
            // The tools do not change during a run.
            *self.caches.tools_bound.get_or_insert_with(|| {
                tools
                    .iter()
                    .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len() + 8)
                    .sum()
            })
        };
        // The provider's own count of the last request, when it gave one,
        // includes the tool definitions already.
        let memory = machine.memory();
        let bytes_bound = memory.upper_bound() + tools_bound;
        // A report of nothing, or of far fewer tokens than the bytes could
        // hold (a server that counts a silently truncated prompt), is not
        // trusted: then the bytes decide.
        let bound = memory
            .reported_bound()
            .filter(|reported| *reported > 0 && *reported >= bytes_bound / 8)
            .map_or(bytes_bound, |reported| reported.min(bytes_bound));
        if !force && bound < config.warn_at() {
            return;
        }
        let tools_tokens = match self.caches.tools_tokens {
            Some(tokens) if !tools.is_empty() => tokens,
            _ => {
                let tokens = memory.counter().count_tools(tools);
                if !tools.is_empty() {
                    self.caches.tools_tokens = Some(tokens);
                }
                tokens
            }
        };
        let used = machine.memory_mut().total_tokens() + tools_tokens;
        let warned = machine.context_warned_mut();
        if used >= config.warn_at() && !*warned {
            *warned = true;
            self.events.emit(
                &turn,
                EventKind::ContextWarning {
                    tokens: used,
                    context_window: config.context_window,
                    ratio: used as f64 / config.context_window.max(1) as f64,
                },
            );
        }
        if !force && used < config.compress_at() {
            return;
        }
        self.phase(&turn, Phase::Compression, true);
        let budget = config.target().saturating_sub(tools_tokens);
        let before = machine.memory().messages().len();
        let (messages, method) = self.compress(machine, budget).await;
        let tokens_before = used.saturating_sub(tools_tokens);
        let memory = machine.memory_mut();
        memory.replace(messages);
        let tokens_after = memory.total_tokens();
        let messages_after = memory.messages().len();
        // A later climb towards the window warns again.
        *machine.context_warned_mut() = tokens_after + tools_tokens >= config.warn_at();
        machine.metrics_mut().record_compression(tokens_before, tokens_after);
        machine.compressed();
        self.events.emit(
            &turn,
            EventKind::CompressionApplied {
                messages_before: before,
                messages_after,
                tokens_before,
                tokens_after,
                method,
            },
        );
        self.phase(&turn, Phase::Compression, false);
    }

    /// The compressed history and how it was made.
    async fn compress(&mut self, machine: &mut TurnMachine, budget: usize) -> (Vec<Message>, CompressionMethod) {
        let engine = self.engine.clone();
        let summarizer = engine.context.summarizer.as_ref().unwrap_or(&engine.llm);
        let started = std::time::Instant::now();
        let memory = machine.memory();
        let done = compress_history(
            memory.messages(),
            summarizer.as_ref(),
            memory.counter().as_ref(),
            &engine.context.memory,
            budget,
            self.ctx.cancel_token(),
        )
        .await;
        let metrics = machine.metrics_mut();
        if done.summarizer_called {
            metrics.llm_calls += 1;
            metrics.llm_ms += started.elapsed().as_millis() as u64;
        }
        if let Some(usage) = &done.usage {
            metrics.add_usage(usage);
            self.budget.charge(usage.input_tokens, usage.output_tokens, 0.0);
        }
        if let Some(code) = &done.failure {
            metrics.record_error(code);
        }
        (done.messages, done.method)
    }

    /// The system prompt of this run.
    pub(super) async fn system_prompt(&mut self, machine: &mut TurnMachine, prompt: &str) -> String {
        let engine = self.engine.clone();
        let settings = &engine.context;
        let turn = machine.ids().clone();
        let counter = settings.counter.clone();
        let mut assembler = ContextAssembler::new(settings.system_budget, counter.as_ref());
        assembler.add(ContextComponent::new(
            "base",
            engine.system_prompt.clone(),
            Priority::Critical,
            false,
        ));
        if let Some(instructions) = &self.instructions {
            assembler.add(ContextComponent::new(
                "agent_instructions",
                format!("# Your role\n\n{}", instructions.trim()),
                Priority::Critical,
                false,
            ));
        }

        let registry = self.tools.registry();
        for section in &settings.sections {
            if section.tool.as_ref().is_none_or(|tool| registry.get(tool).is_some()) {
                let (priority, cut) = if section.critical {
                    (Priority::Critical, false)
                } else {
                    (Priority::High, true)
                };
                assembler.add(ContextComponent::new(
                    &section.name,
                    section.text.clone(),
                    priority,
                    cut,
                ));
            }
        }

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
                &turn,
                EventKind::RetrievalStart {
                    query: prompt.to_string(),
                },
            );
            let docs = match retriever.retrieve(prompt, settings.retrieval_limit).await {
                Ok(docs) => docs,
                Err(err) => {
                    machine.metrics_mut().record_error(ErrorCode::Retrieval.as_str());
                    self.events.emit(
                        &turn,
                        EventKind::Error {
                            code: ErrorCode::Retrieval,
                            message: err.to_string(),
                            recoverable: true,
                        },
                    );
                    Vec::new()
                }
            };
            self.events.emit(
                &turn,
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

        // The tools are not listed here: every request carries them (as
        // `tools`, or in the instructions of a text-only model), and a list
        // in the prompt too only costs a small model prompt time.
        assembler.assemble().text
    }
}
