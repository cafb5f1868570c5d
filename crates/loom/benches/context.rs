//! Context costs: token counting throughput (MB/s) with the built-in
//! tiktoken encodings, and the time to compress a history of 1000 messages
//! of about 1 KB each with a scripted summarizer (docs/context.md asks for under
//! 5 s) — the same `compress_history` call the engine makes.
//!
//!     cargo bench -p loom --bench context

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;
use std::time::{Duration, Instant};

use loom::memory::{compress_history, MemoryConfig};
use loom::models::{ScriptTurn, ScriptedModel};
use loom::tokens::{Encoding, TiktokenCounter, TokenCounter};
use loom::{validate_history, Message, ToolCall};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// About 1 KB of mixed prose and code.
fn kilobyte(seed: usize) -> String {
    let prose =
        "The scheduler runs concurrency-safe calls together and serial ones alone; results keep the model's order. ";
    let code = "fn handle(req: Request) -> Result<Response, Error> { let id = req.id(); store.get(id)?.into() }\n";
    let mut text = format!("[{seed}] ");
    while text.len() < 1000 {
        text.push_str(if text.len() % 3 == 0 { code } else { prose });
    }
    text
}

fn history(messages: usize) -> Vec<Message> {
    let mut out = vec![
        Message::system("You are Loom."),
        Message::user("Refactor the scheduler."),
    ];
    let mut turn = 0;
    while out.len() < messages {
        let id = format!("call_{turn}");
        out.push(Message::Assistant {
            content: kilobyte(turn),
            tool_calls: vec![ToolCall {
                id: id.clone(),
                name: "read_file".into(),
                arguments: json!({"path": format!("src/file_{turn}.rs")}),
            }],
        });
        out.push(Message::tool(id, "read_file", kilobyte(turn + 1)));
        turn += 1;
    }
    out
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("context benchmark: run with `cargo bench -p loom --bench context`");
        return;
    }

    // Token counting.
    let text: String = (0..4096).map(kilobyte).collect();
    let megabytes = text.len() as f64 / 1e6;
    for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let counter = TiktokenCounter::new(encoding, true);
        counter.count_text("warm up the encoding tables");
        let mut best = Duration::MAX;
        let mut tokens = 0;
        for _ in 0..5 {
            let started = Instant::now();
            tokens = counter.count_text(&text);
            best = best.min(started.elapsed());
        }
        println!(
            "token counting {encoding:?}: {:.1} MB/s ({tokens} tokens in {megabytes:.1} MB, best of 5)",
            megabytes / best.as_secs_f64()
        );
    }

    // Compressing 1000 messages of about 1 KB.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let messages = history(1000);
    let counter = TiktokenCounter::for_model("gpt-4o");
    let tokens = counter.count_messages(&messages);
    let config = MemoryConfig {
        context_window: 400_000,
        keep_recent_messages: 8,
        ..MemoryConfig::default()
    };
    let summary = "## 1. Background context\n- refactoring the scheduler\n## 3. Tool usage log\n- read 499 files\n## 5. Execution results\n- none yet";
    let mut times = Vec::new();
    for _ in 0..10 {
        let model = ScriptedModel::new(vec![ScriptTurn {
            content: Some(summary.into()),
            ..ScriptTurn::default()
        }])
        .check_history(false);
        let model = Arc::new(model);
        let started = Instant::now();
        let done = runtime.block_on(compress_history(
            &messages,
            model.as_ref(),
            &counter,
            &config,
            config.compress_at(),
            &CancellationToken::new(),
        ));
        let after = counter.count_messages(&done.messages);
        times.push(started.elapsed());
        assert_eq!(done.method.as_str(), "summary");
        assert!(validate_history(&done.messages, false).is_ok());
        assert!(after < tokens / 10);
    }
    times.sort();
    println!(
        "compressing 1000 messages (~1 KB each, {tokens} tokens) with a scripted summarizer: {:.1} ms median, {:.1} ms best (10 runs; the bound is 5000 ms)",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3
    );
}
