//! Spans sent to an OTLP collector over HTTP/protobuf, from a thread of
//! their own: a run hands a finished span over without waiting
//! ([`Exporter::send`]); a line that is full (a slow or dead collector)
//! drops it and counts it (`loom_telemetry_spans_dropped_total`), so a
//! collector never slows a run. Spans go out in batches, at most a second
//! after they ended; [`Exporter::flush`] sends what waits (at a process's
//! end).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};

use crate::assemble::{FinishedSpan, Kind, Value};

/// Spans sent in one request at most.
const BATCH: usize = 512;

/// How long a span waits for its batch at most.
const BATCH_WAIT: Duration = Duration::from_secs(1);

/// How long a request to the collector may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where spans go and how.
#[derive(Debug, Clone, Default)]
pub struct ExportConfig {
    /// The collector's base URL (`http://localhost:4318`); spans go to its
    /// `/v1/traces`. `None`: the `OTEL_EXPORTER_OTLP_*` variables say.
    pub endpoint: Option<String>,
    /// Headers sent with every request (an API key).
    pub headers: HashMap<String, String>,
    /// The service the spans are of (`None`: `OTEL_SERVICE_NAME`, else `loom`).
    pub service_name: Option<String>,
    /// Spans that may wait to be sent; more are dropped (default 2048).
    pub queue: usize,
    /// How spans travel (`None`: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, or
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else HTTP/protobuf).
    pub transport: Option<Transport>,
}

/// Whether this build can send over gRPC (the `grpc` feature).
pub const GRPC_BUILT: bool = cfg!(feature = "grpc");

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// OTLP over HTTP with protobuf bodies, to `ENDPOINT/v1/traces`
    /// (port 4318 by convention).
    #[default]
    HttpProtobuf,
    /// OTLP over gRPC, to `ENDPOINT` (port 4317 by convention). Only in a
    /// build with the crate's `grpc` feature.
    Grpc,
}

/// An OTLP protocol Loom does not send (`http/json`, a typo).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the OTLP protocol {0:?} is not one Loom sends: \"http/protobuf\" or \"grpc\"")]
pub struct UnknownTransport(String);

impl std::str::FromStr for Transport {
    type Err = UnknownTransport;

    /// OpenTelemetry's names: `http/protobuf`, `grpc`.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim().to_ascii_lowercase().as_str() {
            "http/protobuf" => Ok(Self::HttpProtobuf),
            "grpc" => Ok(Self::Grpc),
            _ => Err(UnknownTransport(name.trim().chars().take(40).collect())),
        }
    }
}

impl Transport {
    /// The protocol the standard variables name, if any.
    pub fn from_environment() -> Result<Option<Self>, ExportError> {
        for name in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
            if let Some(value) = std::env::var(name).ok().filter(|value| !value.trim().is_empty()) {
                return value
                    .parse()
                    .map(Some)
                    .map_err(|err| ExportError::Build(format!("{name}: {err}")));
            }
        }
        Ok(None)
    }
}

/// The exporter could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The OTLP exporter refused its settings.
    #[error("telemetry: {0}")]
    Build(String),
    /// Its thread could not start.
    #[error("telemetry: cannot start the exporter's thread: {0}")]
    Thread(#[from] std::io::Error),
}

enum Message {
    Span(Box<FinishedSpan>),
    Flush(std::sync::mpsc::Sender<()>),
}

/// The sending side of the exporter's thread.
pub struct Exporter {
    line: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("dropped", &self.dropped.load(Ordering::Relaxed))
            .finish()
    }
}

impl Exporter {
    /// Starts the exporter's thread, without waiting for it: an exporter
    /// that cannot be made is said in the log, and every span is then
    /// dropped and counted.
    pub fn start(config: &ExportConfig) -> Result<Self, ExportError> {
        let (line, waiting) = sync_channel(config.queue.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let config = config.clone();
        let counted = dropped.clone();
        std::thread::Builder::new()
            .name("loom-telemetry".into())
            .spawn(move || {
                let made = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|err| ExportError::Build(err.to_string()))
                    .and_then(|runtime| {
                        let exporter = runtime.block_on(async { build(&config) })?;
                        Ok((runtime, exporter))
                    });
                match made {
                    Ok((runtime, exporter)) => send_batches(&runtime, exporter, &waiting, &counted),
                    Err(err) => {
                        tracing::warn!(error = %err, "telemetry: no traces are sent");
                        drain(&waiting, &counted);
                    }
                }
            })?;
        Ok(Self { line, dropped })
    }

    /// Hands a span over without waiting; a full line drops it.
    pub fn send(&self, span: FinishedSpan) {
        match self.line.try_send(Message::Span(Box::new(span))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.drop_one("queue_full"),
            Err(TrySendError::Disconnected(_)) => self.drop_one("stopped"),
        }
    }

    fn drop_one(&self, reason: &'static str) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("loom_telemetry_spans_dropped_total", "reason" => reason).increment(1);
    }

    /// Spans dropped so far (a full line, a failed request).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends every span handed over so far; waits at most `patience`.
    /// Whether it was done in time.
    pub fn flush(&self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        let (done, wait) = std::sync::mpsc::channel();
        let mut message = Message::Flush(done);
        loop {
            match self.line.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    message = back;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => return false,
            }
        }
        wait.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }
}

/// Without an exporter: every span is dropped and counted; flushes are
/// answered.
fn drain(waiting: &Receiver<Message>, dropped: &AtomicU64) {
    while let Ok(message) = waiting.recv() {
        match message {
            Message::Span(_) => {
                dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("loom_telemetry_spans_dropped_total", "reason" => "no_exporter").increment(1);
            }
            Message::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// The OTLP exporter: HTTP/protobuf or gRPC to the endpoint (or the
/// variables').
fn build(config: &ExportConfig) -> Result<opentelemetry_otlp::SpanExporter, ExportError> {
    let transport = match config.transport {
        Some(transport) => transport,
        None => Transport::from_environment()?.unwrap_or_default(),
    };
    let mut exporter = match transport {
        Transport::HttpProtobuf => http_exporter(config)?,
        Transport::Grpc => grpc_exporter(config)?,
    };
    let named_by_environment = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|attributes| attributes.contains("service.name="));
    let resource = match &config.service_name {
        Some(name) => opentelemetry_sdk::Resource::builder().with_service_name(name.clone()),
        None if named_by_environment => opentelemetry_sdk::Resource::builder(),
        None => opentelemetry_sdk::Resource::builder().with_service_name("loom"),
    };
    exporter.set_resource(&resource.build());
    Ok(exporter)
}

fn http_exporter(config: &ExportConfig) -> Result<opentelemetry_otlp::SpanExporter, ExportError> {
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(REQUEST_TIMEOUT);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
    }
    if !config.headers.is_empty() {
        builder = builder.with_headers(config.headers.clone());
    }
    builder.build().map_err(|err| ExportError::Build(err.to_string()))
}

/// gRPC to the endpoint as given (a gRPC collector serves traces at its
/// root); the headers as metadata.
#[cfg(feature = "grpc")]
fn grpc_exporter(config: &ExportConfig) -> Result<opentelemetry_otlp::SpanExporter, ExportError> {
    use opentelemetry_otlp::tonic_types::metadata::MetadataMap;
    use opentelemetry_otlp::WithTonicConfig;

    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_timeout(REQUEST_TIMEOUT);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
    }
    // A collector over TLS is verified against the system's roots (tonic
    // trusts none by itself).
    let endpoint = config.endpoint.clone().or_else(|| {
        ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
    });
    if endpoint.is_some_and(|endpoint| endpoint.trim().to_ascii_lowercase().starts_with("https://")) {
        builder = builder
            .with_tls_config(opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new().with_native_roots());
    }
    if !config.headers.is_empty() {
        let mut headers = http::HeaderMap::new();
        for (name, value) in &config.headers {
            let bad = |what: &str| ExportError::Build(format!("the header {name:?} is not a valid gRPC {what}"));
            headers.insert(
                http::HeaderName::try_from(name.to_ascii_lowercase()).map_err(|_| bad("name"))?,
                http::HeaderValue::try_from(value.as_str()).map_err(|_| bad("value"))?,
            );
        }
        builder = builder.with_metadata(MetadataMap::from_headers(headers));
    }
    builder.build().map_err(|err| ExportError::Build(err.to_string()))
}

#[cfg(not(feature = "grpc"))]
fn grpc_exporter(_: &ExportConfig) -> Result<opentelemetry_otlp::SpanExporter, ExportError> {
    Err(ExportError::Build(
        "this loom was built without gRPC export (the `grpc` feature); send over \"http/protobuf\" or rebuild with it"
            .into(),
    ))
}

/// The thread's loop: a batch is sent when full, a second after its first
/// span, or when a flush asks.
fn send_batches(
    runtime: &tokio::runtime::Runtime,
    exporter: opentelemetry_otlp::SpanExporter,
    waiting: &Receiver<Message>,
    dropped: &AtomicU64,
) {
    let mut batch: Vec<SpanData> = Vec::new();
    let mut since: Option<Instant> = None;
    loop {
        let wait = since.map_or(Duration::from_secs(3600), |since| {
            BATCH_WAIT.saturating_sub(since.elapsed())
        });
        let mut flushed = None;
        match waiting.recv_timeout(wait) {
            Ok(Message::Span(span)) => {
                batch.push(span_data(*span));
                since.get_or_insert_with(Instant::now);
            }
            Ok(Message::Flush(done)) => flushed = Some(done),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                export(runtime, &exporter, &mut batch, dropped);
                return;
            }
        }
        let due = since.is_some_and(|since| since.elapsed() >= BATCH_WAIT);
        if batch.len() >= BATCH || due || flushed.is_some() {
            export(runtime, &exporter, &mut batch, dropped);
            since = None;
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
    }
}

fn export(
    runtime: &tokio::runtime::Runtime,
    exporter: &opentelemetry_otlp::SpanExporter,
    batch: &mut Vec<SpanData>,
    dropped: &AtomicU64,
) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::take(batch);
    let count = spans.len() as u64;
    match runtime.block_on(exporter.export(spans)) {
        Ok(()) => metrics::counter!("loom_telemetry_spans_exported_total").increment(count),
        Err(err) => {
            dropped.fetch_add(count, Ordering::Relaxed);
            metrics::counter!("loom_telemetry_spans_dropped_total", "reason" => "export_failed").increment(count);
            tracing::warn!(error = %err, spans = count, "telemetry: the collector did not take the spans");
        }
    }
}

/// A finished span as the SDK's exporter takes it.
fn span_data(span: FinishedSpan) -> SpanData {
    let attributes = span
        .attributes
        .into_iter()
        .map(|(key, value)| match value {
            Value::Text(text) => KeyValue::new(key, text),
            Value::Int(number) => KeyValue::new(key, number),
            Value::Float(number) => KeyValue::new(key, number),
            Value::Bool(flag) => KeyValue::new(key, flag),
            Value::Texts(texts) => KeyValue::new(
                key,
                opentelemetry::Value::Array(Array::String(texts.into_iter().map(StringValue::from).collect())),
            ),
        })
        .collect();
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(span.trace_id),
            SpanId::from_bytes(span.span_id),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: span.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: span.parent_is_remote,
        span_kind: match span.kind {
            Kind::Internal => SpanKind::Internal,
            Kind::Client => SpanKind::Client,
        },
        name: span.name.into(),
        start_time: span.start,
        end_time: span.end,
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: span.error.map_or(Status::Unset, Status::error),
        instrumentation_scope: InstrumentationScope::builder("loom")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_are_read_by_their_opentelemetry_names() {
        assert_eq!("grpc".parse::<Transport>(), Ok(Transport::Grpc));
        assert_eq!(" HTTP/Protobuf ".parse::<Transport>(), Ok(Transport::HttpProtobuf));
        assert!("http/json".parse::<Transport>().is_err());
    }

    /// A collector over TLS can be reached: the exporter is made (it is
    /// not refused for want of TLS), as for one without.
    #[cfg(feature = "grpc")]
    #[test]
    fn a_grpc_collector_over_tls_is_an_exporter_that_can_be_made() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for endpoint in ["https://collector.example.com:4317", "http://127.0.0.1:4317"] {
            let config = ExportConfig {
                endpoint: Some(endpoint.into()),
                transport: Some(Transport::Grpc),
                ..ExportConfig::default()
            };
            let made = runtime.block_on(async { build(&config) });
            assert!(made.is_ok(), "{endpoint}: {:?}", made.err());
        }
    }
}
