//! Loom's runs as OpenTelemetry traces in the GenAI semantic conventions
//! (docs/telemetry.md): [`Telemetry`] is an [`EventObserver`] that makes
//! spans of the events of an agent's runs ([`assemble`]) and exports them
//! over OTLP ([`export`]), never making a run wait.

#![warn(missing_docs)]

pub mod assemble;
pub mod conventions;
pub mod export;

use std::sync::Mutex;
use std::time::Duration;

use loom_core::{Event, EventObserver};

pub use assemble::{trace_id_of, FinishedSpan, SpanAssembler};
pub use export::{ExportConfig, ExportError, Exporter};

/// What to export and where.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// Where spans go.
    pub export: ExportConfig,
    /// Share of run trees exported, 0 to 1 (default 1): decided by the
    /// trace id, so a tree is exported whole or not at all, in every
    /// process that sees a part of it.
    pub sampling_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            export: ExportConfig {
                queue: 2048,
                ..ExportConfig::default()
            },
            sampling_ratio: 1.0,
        }
    }
}

/// Spans of the runs it observes, exported.
#[derive(Debug)]
pub struct Telemetry {
    assembler: Mutex<SpanAssembler>,
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
    pub fn start(config: &TelemetryConfig) -> Result<Self, ExportError> {
        Ok(Self {
            assembler: Mutex::default(),
            exporter: Exporter::start(&config.export)?,
            ratio: config.sampling_ratio.clamp(0.0, 1.0),
        })
    }

    /// Whether the tree of trace `trace_id` is exported: the low 64 bits
    /// of the id against the ratio, as OpenTelemetry's ratio sampler does.
    fn sampled(&self, trace_id: &[u8; 16]) -> bool {
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
        let spans = match self.assembler.lock() {
            Ok(mut assembler) => assembler.observe(session_id, event),
            Err(poisoned) => poisoned.into_inner().observe(session_id, event),
        };
        for span in spans {
            if self.sampled(&span.trace_id) {
                self.exporter.send(span);
            }
        }
    }
}
