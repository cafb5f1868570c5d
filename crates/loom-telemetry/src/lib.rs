//! Loom's runs as OpenTelemetry traces in the GenAI semantic conventions
//! (docs/telemetry.md): [`Telemetry`] is an [`EventObserver`] that makes
//! spans of the events of an agent's runs ([`assemble`]) and exports them
//! over OTLP ([`export`]), never making a run wait.

#![warn(missing_docs)]

pub mod assemble;
pub mod content;
pub mod conventions;
pub mod export;

use std::sync::Mutex;
use std::time::Duration;

use loom_core::{Event, EventObserver};

pub use assemble::{trace_id_of, FinishedSpan, SpanAssembler};
pub use content::{Content, Kept};
pub use export::{ExportConfig, ExportError, Exporter, Transport, UnknownTransport, GRPC_BUILT};

/// Records the ids of run `run_id`'s trace and `invoke_agent` span in
/// `span` (a gateway's or worker's `tracing` span of the run, declared
/// with empty `trace_id` and `span_id` fields), so that its log lines lead
/// to its spans. `trace_parent`: the client's trace context, if any.
pub fn record_ids(span: &tracing::Span, run_id: &str, trace_parent: Option<&loom_core::TraceParent>) {
    let trace_id = trace_parent.map_or_else(|| trace_id_of(run_id), |given| given.trace_id);
    span.record("trace_id", tracing::field::display(hex(&trace_id)));
    span.record("span_id", tracing::field::display(hex(&assemble::run_span_id(run_id))));
}

/// Bytes as lowercase hexadecimal, as OpenTelemetry writes ids.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// What to export and where.
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    /// Where spans go.
    pub export: ExportConfig,
    /// Share of run trees exported, 0 to 1 (default 1): decided by the
    /// trace id, so a tree is exported whole or not at all, in every
    /// process that sees a part of it.
    pub sampling_ratio: f64,
    /// Whether spans record message text, tool arguments and results
    /// (`[telemetry] capture_content`; default: they do not).
    pub content: Content,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            export: ExportConfig {
                queue: 2048,
                ..ExportConfig::default()
            },
            sampling_ratio: 1.0,
            content: Content::left(),
        }
    }
}

/// Spans of the runs it observes, exported.
#[derive(Debug)]
pub struct Telemetry {
    assembler: Mutex<SpanAssembler>,
    content: Content,
    exporter: Exporter,
    ratio: f64,
}

impl std::fmt::Debug for SpanAssembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpanAssembler")
    }
}

impl Telemetry {
    /// Starts exporting with `config`.
    pub fn start(config: &TelemetrySettings) -> Result<Self, ExportError> {
        Ok(Self {
            // Contents are redacted before the assembler's lock (`observe`).
            assembler: Mutex::new(SpanAssembler::new(Content::left())),
            content: config.content.clone(),
            exporter: Exporter::start(&config.export)?,
            ratio: config.sampling_ratio.clamp(0.0, 1.0),
        })
    }

    /// Whether `span` is exported: as the client decided, when a client
    /// gave the trace context; otherwise the low 64 bits of the trace id
    /// against the ratio, as OpenTelemetry's ratio sampler does. A tree is
    /// exported whole or not at all either way.
    fn sampled(&self, span: &FinishedSpan) -> bool {
        if let Some(decided) = span.sampled_by_client {
            return decided;
        }
        let trace_id = &span.trace_id;
        if self.ratio >= 1.0 {
            return true;
        }
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        (u64::from_be_bytes(low) >> 1) < (self.ratio * (1u64 << 63) as f64) as u64
    }

    /// Sends what waits; at most `patience` (a process's end).
    pub fn flush(&self, patience: Duration) -> bool {
        self.exporter.flush(patience)
    }

    /// Spans dropped so far.
    pub fn dropped(&self) -> u64 {
        self.exporter.dropped()
    }
}

impl EventObserver for Telemetry {
    fn observe(&self, session_id: &str, event: &Event) {
        // Most events (text deltas, tool output, phases) make no span: no lock.
        if !assemble::makes_spans(&event.kind) {
            return;
        }
        // Redacted before the lock: one run's long result does not hold
        // back the others' events.
        let kept = self.content.kept(&event.kind);
        let spans = match self.assembler.lock() {
            Ok(mut assembler) => assembler.observe_kept(session_id, event, kept),
            Err(poisoned) => poisoned.into_inner().observe_kept(session_id, event, kept),
        };
        for span in spans {
            if self.sampled(&span) {
                self.exporter.send(span);
            }
        }
    }
}
