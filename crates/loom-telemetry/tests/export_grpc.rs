//! The exporter over OTLP/gRPC (the `grpc` feature) against a real gRPC
//! receiver: a tonic server of the OTLP trace service, decoding what it is
//! sent with `opentelemetry-proto`. Spans arrive as sent, with the
//! configured headers as metadata.

#![cfg(feature = "grpc")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use loom_telemetry::assemble::{FinishedSpan, Kind, Value};
use loom_telemetry::{ExportConfig, Exporter, Transport};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};

/// A span as received: its name and trace id.
type NameAndTrace = (String, Vec<u8>);

/// What the receiver was sent: spans, and the `x-api-key` metadata of
/// each request.
#[derive(Default, Clone)]
struct Received {
    spans: Arc<Mutex<Vec<NameAndTrace>>>,
    keys: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        if let Some(key) = request.metadata().get("x-api-key") {
            self.keys.lock().unwrap().push(key.to_str().unwrap().to_string());
        }
        let mut spans = self.spans.lock().unwrap();
        for resource in &request.get_ref().resource_spans {
            for scope in &resource.scope_spans {
                for span in &scope.spans {
                    spans.push((span.name.clone(), span.trace_id.clone()));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn span(n: u8) -> FinishedSpan {
    FinishedSpan {
        name: format!("span {n}"),
        trace_id: [9; 16],
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

#[test]
fn spans_arrive_over_grpc_with_the_headers_as_metadata() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let received = Received::default();
    let incoming = runtime
        .block_on(async { tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()) })
        .unwrap();
    let port = incoming.local_addr().unwrap().port();
    let service = TraceServiceServer::new(received.clone());
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );

    let exporter = Exporter::start(&ExportConfig {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        headers: [("x-api-key".to_string(), "k-123".to_string())].into(),
        queue: 64,
        transport: Some(Transport::Grpc),
        ..ExportConfig::default()
    })
    .unwrap();
    for n in 0..3 {
        exporter.send(span(n));
    }
    assert!(exporter.flush(Duration::from_secs(10)));
    let spans = received.spans.lock().unwrap().clone();
    assert_eq!(
        spans.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(),
        ["span 0", "span 1", "span 2"]
    );
    assert!(spans.iter().all(|(_, trace)| trace == &vec![9u8; 16]));
    assert_eq!(*received.keys.lock().unwrap(), ["k-123"]);
    assert_eq!(exporter.dropped(), 0);
}
