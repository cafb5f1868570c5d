//! Streaming overhead of the OpenAI-compatible provider and the engine,
//! against a local fake server that streams a long answer (2000 chunks):
//! time to the first piece of text and time per chunk, for the raw HTTP
//! stream (reqwest reading the bytes), the provider (SSE parsed into
//! chunks), and a whole run (the first `llm.delta` event and the end).
//!
//!     cargo bench -p loom-llm --bench stream

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use loom_core::{Agent, EventKind, Llm, LlmChunk, LlmRequest, Message};
use loom_llm::{OpenAiConfig, OpenAiModel};
use loom_testkit::{openai_text, FakeServer, Reply};

const CHUNKS: usize = 2000;
const SAMPLES: usize = 30;

fn answer() -> Vec<u8> {
    let text: String = (0..CHUNKS).map(|i| format!("w{:03} ", i % 1000)).collect();
    // Five characters per chunk: one SSE event per word.
    openai_text(&text, 5)
}

fn model(server: &FakeServer) -> OpenAiModel {
    let mut config = OpenAiConfig::new("bench");
    config.base_url = server.url();
    OpenAiModel::new(config).expect("model")
}

/// (time to first body bytes, total) of reading the stream with reqwest.
async fn raw(client: &reqwest::Client, url: &str) -> (Duration, Duration) {
    let started = Instant::now();
    let response = client
        .post(format!("{url}/chat/completions"))
        .body("{}")
        .send()
        .await
        .expect("send");
    let mut body = response.bytes_stream();
    let mut first = None;
    while let Some(piece) = body.next().await {
        piece.expect("bytes");
        first.get_or_insert_with(|| started.elapsed());
    }
    (first.unwrap_or_default(), started.elapsed())
}

/// (time to first text chunk, total, chunks) through the provider.
async fn provider(model: &OpenAiModel) -> (Duration, Duration, usize) {
    let messages = [Message::user("go")];
    let started = Instant::now();
    let mut stream = model.stream(LlmRequest::new(&messages, &[])).await.expect("stream");
    let mut first = None;
    let mut count = 0;
    while let Some(chunk) = stream.next().await {
        if let LlmChunk::Text(_) = chunk.expect("chunk") {
            first.get_or_insert_with(|| started.elapsed());
            count += 1;
        }
    }
    (first.unwrap_or_default(), started.elapsed(), count)
}

/// (time to first `llm.delta`, total) of a whole run.
async fn run(agent: &Agent) -> (Duration, Duration) {
    let started = Instant::now();
    let mut handle = agent.run("go");
    let mut first = None;
    while let Some(event) = handle.next_event().await {
        if let EventKind::LlmDelta { .. } = event.kind {
            first.get_or_insert_with(|| started.elapsed());
        }
    }
    (first.unwrap_or_default(), started.elapsed())
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("stream benchmark: run with `cargo bench -p loom-llm --bench stream`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let body = answer();
    let total_runs = 3 * (SAMPLES + 1);
    let server = FakeServer::start((0..total_runs).map(|_| Reply::Sse(body.clone())).collect());
    let client = reqwest::Client::new();
    let url = server.url();

    let (mut raw_first, mut raw_total) = (Vec::new(), Vec::new());
    let (mut llm_first, mut llm_total) = (Vec::new(), Vec::new());
    let (mut run_first, mut run_total) = (Vec::new(), Vec::new());
    let model = model(&server);
    let agent = Agent::builder().model(self::model(&server)).build().expect("agent");
    runtime.block_on(async {
        raw(&client, &url).await;
        provider(&model).await;
        run(&agent).await;
        for _ in 0..SAMPLES {
            let (first, total) = raw(&client, &url).await;
            raw_first.push(first);
            raw_total.push(total);
            let (first, total, count) = provider(&model).await;
            assert_eq!(count, CHUNKS);
            llm_first.push(first);
            llm_total.push(total);
            let (first, total) = run(&agent).await;
            run_first.push(first);
            run_total.push(total);
        }
    });
    let per_chunk = |total: Duration| total.as_secs_f64() * 1e6 / CHUNKS as f64;
    let (raw_first, raw_total) = (median(raw_first), median(raw_total));
    let (llm_first, llm_total) = (median(llm_first), median(llm_total));
    let (run_first, run_total) = (median(run_first), median(run_total));
    println!("{CHUNKS} chunks, median of {SAMPLES} runs, 127.0.0.1");
    println!(
        "raw HTTP stream (reqwest bytes): first bytes {:>8.1} µs, total {:>8.2} ms, {:.2} µs/chunk",
        raw_first.as_secs_f64() * 1e6,
        raw_total.as_secs_f64() * 1e3,
        per_chunk(raw_total)
    );
    println!(
        "provider (SSE → chunks):         first text  {:>8.1} µs, total {:>8.2} ms, {:.2} µs/chunk",
        llm_first.as_secs_f64() * 1e6,
        llm_total.as_secs_f64() * 1e3,
        per_chunk(llm_total)
    );
    println!(
        "whole run (llm.delta events):    first delta {:>8.1} µs, total {:>8.2} ms, {:.2} µs/chunk",
        run_first.as_secs_f64() * 1e6,
        run_total.as_secs_f64() * 1e3,
        per_chunk(run_total)
    );
    println!(
        "Loom's overhead over the raw stream: {:.2} µs/chunk in the provider, {:.2} µs/chunk for the whole run",
        per_chunk(llm_total.saturating_sub(raw_total)),
        per_chunk(run_total.saturating_sub(raw_total))
    );
}
