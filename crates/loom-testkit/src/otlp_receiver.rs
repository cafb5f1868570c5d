//! A real OTLP/HTTP receiver for tests (docs/telemetry.md): it takes
//! `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`, decodes
//! it with `opentelemetry-proto`, and keeps every span, so a test can read
//! the trace Loom sent. It can also be told never to answer: a collector
//! that hangs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use serde_json::Value;

/// A span as the receiver got it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// Its name.
    pub name: String,
    /// Its trace id, hex.
    pub trace_id: String,
    /// Its id, hex.
    pub span_id: String,
    /// Its parent's id, hex (`None`: a root).
    pub parent: Option<String>,
    /// Its kind (OTLP's number: 1 internal, 3 client).
    pub kind: i32,
    /// Start and end, ns since the Unix epoch.
    pub start_ns: u64,
    /// End.
    pub end_ns: u64,
    /// Its attributes, as JSON values.
    pub attributes: BTreeMap<String, Value>,
    /// Its status code (0 unset, 1 ok, 2 error).
    pub status: i32,
    /// The `service.name` of its resource.
    pub service: Option<String>,
}

#[derive(Default)]
struct Shared {
    spans: Mutex<Vec<ReceivedSpan>>,
    hang: AtomicBool,
}

/// The receiver, on 127.0.0.1.
pub struct OtlpReceiver {
    port: u16,
    shared: Arc<Shared>,
}

impl OtlpReceiver {
    /// Starts a receiver on a free port.
    pub fn start() -> Self {
        let shared = Arc::new(Shared::default());
        let port = crate::http_thread::serve(
            Router::new()
                .route("/v1/traces", post(receive))
                .with_state(shared.clone()),
        );
        Self { port, shared }
    }

    /// The base URL (`[telemetry] otlp_endpoint`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// From now on, requests get no answer (a collector that hangs).
    pub fn hang(&self) {
        self.shared.hang.store(true, Ordering::SeqCst);
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared.spans.lock().unwrap().clone()
    }

    /// Waits until `count` spans came (at most `within`); those received.
    pub fn wait_for(&self, count: usize, within: Duration) -> Vec<ReceivedSpan> {
        let started = Instant::now();
        loop {
            let spans = self.spans();
            if spans.len() >= count || started.elapsed() > within {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json_of(value: Option<&any_value::Value>) -> Value {
    match value {
        Some(any_value::Value::StringValue(text)) => Value::from(text.clone()),
        Some(any_value::Value::IntValue(number)) => Value::from(*number),
        Some(any_value::Value::DoubleValue(number)) => Value::from(*number),
        Some(any_value::Value::BoolValue(flag)) => Value::from(*flag),
        Some(any_value::Value::ArrayValue(array)) => {
            Value::Array(array.values.iter().map(|value| json_of(value.value.as_ref())).collect())
        }
        _ => Value::Null,
    }
}

async fn receive(State(shared): State<Arc<Shared>>, body: Bytes) -> Vec<u8> {
    if shared.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut received = Vec::new();
    for resource in request.resource_spans {
        let service = resource.resource.as_ref().and_then(|resource| {
            resource
                .attributes
                .iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| {
                    json_of(kv.value.as_ref().and_then(|v| v.value.as_ref()))
                        .as_str()
                        .map(str::to_string)
                })
        });
        for scope in resource.scope_spans {
            for span in scope.spans {
                received.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: (!span.parent_span_id.is_empty()).then(|| hex(&span.parent_span_id)),
                    kind: span.kind,
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| {
                            (
                                kv.key.clone(),
                                json_of(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                            )
                        })
                        .collect(),
                    status: span.status.map_or(0, |status| status.code),
                    service: service.clone(),
                });
            }
        }
    }
    shared.spans.lock().unwrap().extend(received);
    ExportTraceServiceResponse::default().encode_to_vec()
}
