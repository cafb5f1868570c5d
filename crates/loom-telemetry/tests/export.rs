//! The exporter against a real OTLP receiver (loom-testkit's): spans
//! arrive as sent; a collector that never answers costs a run nothing —
//! spans past the line's bound are dropped and counted, never waited for.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, UNIX_EPOCH};

use loom_telemetry::assemble::{FinishedSpan, Kind, Value};
use loom_telemetry::{ExportConfig, Exporter};
use loom_testkit::otlp_receiver::OtlpReceiver;

fn span(n: u8) -> FinishedSpan {
    FinishedSpan {
        name: format!("span {n}"),
        trace_id: [7; 16],
        span_id: [n + 1; 8],
        parent: None,
        parent_is_remote: false,
        sampled_by_client: None,
        kind: Kind::Internal,
        start: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        end: UNIX_EPOCH + Duration::from_secs(1_800_000_001),
        attributes: vec![("loom.n", Value::Int(i64::from(n)))],
        error: None,
    }
}

fn exporter(receiver: &OtlpReceiver, queue: usize) -> Exporter {
    Exporter::start(&ExportConfig {
        endpoint: Some(receiver.url()),
        queue,
        ..ExportConfig::default()
    })
    .unwrap()
}

#[test]
fn spans_arrive_as_sent_when_flushed() {
    let receiver = OtlpReceiver::start();
    let exporter = exporter(&receiver, 64);
    for n in 0..3 {
        exporter.send(span(n));
    }
    assert!(exporter.flush(Duration::from_secs(10)));
    let spans = receiver.spans();
    assert_eq!(spans.len(), 3);
    assert_eq!(spans[0].trace_id, "07".repeat(16));
    assert_eq!(spans[2].attributes["loom.n"], 2);
    assert_eq!(spans[0].service.as_deref(), Some("loom"));
    assert_eq!(exporter.dropped(), 0);
}

#[test]
fn a_collector_that_never_answers_drops_and_counts_spans_and_never_blocks_a_sender() {
    let receiver = OtlpReceiver::start();
    receiver.hang();
    let exporter = exporter(&receiver, 4);
    // The first batch goes out (and hangs): a flush asks for it, and is not
    // done. Behind the flush, the line holds 4 spans whatever the timing
    // (without it, how many spans the thread took from the line into its
    // batch while they were sent was a race with the sender).
    exporter.send(span(0));
    assert!(!exporter.flush(Duration::from_millis(200)));
    // The line fills; the rest drop.
    for n in 1..=200u8 {
        exporter.send(span(n));
    }
    assert!(exporter.dropped() >= 196, "dropped {}", exporter.dropped());
    assert!(receiver.spans().is_empty());
}
