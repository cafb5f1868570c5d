//! `[telemetry]` (docs/telemetry.md): the runs of this process exported
//! as OpenTelemetry traces over OTLP, when loom.toml names a collector
//! (`otlp_endpoint`) or the `OTEL_EXPORTER_OTLP_*` variables do. One
//! exporter per process, whatever agents it builds; what waits is sent
//! when the command ends.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use loom::telemetry::{Content, ExportConfig, Telemetry, TelemetrySettings, Transport, GRPC_BUILT};

/// How long a command's end waits for its last spans to go out.
const FLUSH_PATIENCE: Duration = Duration::from_secs(5);

static STARTED: OnceLock<Option<Arc<Telemetry>>> = OnceLock::new();

/// The process's exporter, started at the first call (`None`: no
/// collector is named, or it could not start — said once).
pub(crate) fn observer(config: Option<&loom_config::TelemetryConfig>) -> Option<Arc<Telemetry>> {
    STARTED.get_or_init(|| start(config)).clone()
}

fn start(config: Option<&loom_config::TelemetryConfig>) -> Option<Arc<Telemetry>> {
    let endpoint = config.and_then(|config| config.otlp_endpoint.clone());
    let from_environment = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
    if endpoint.is_none() && !from_environment {
        return None;
    }
    let ratio = config.and_then(|config| config.sampling_ratio).unwrap_or(1.0);
    if !(0.0..=1.0).contains(&ratio) {
        say!("loom: warning: [telemetry] sampling_ratio {ratio} is not between 0 and 1: no traces are sent");
        return None;
    }
    // The protocol is settled here, so that a bad one is said where the
    // person sees it, rather than in the exporter thread's log.
    let transport = match config.and_then(|config| config.protocol.as_deref()) {
        Some(name) => name.parse::<Transport>().map(Some).map_err(|err| err.to_string()),
        None => Transport::from_environment().map_err(|err| err.to_string()),
    };
    let transport = match transport {
        Ok(transport) => transport.unwrap_or_default(),
        Err(why) => {
            say!("loom: warning: no traces are sent: {why}");
            return None;
        }
    };
    if transport == Transport::Grpc && !GRPC_BUILT {
        say!("loom: warning: no traces are sent: this loom was built without gRPC export (`cargo install --features grpc`); use protocol = \"http/protobuf\"");
        return None;
    }
    let settings = TelemetrySettings {
        export: ExportConfig {
            endpoint,
            headers: config
                .map(|config| config.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
            service_name: config.and_then(|config| config.service_name.clone()),
            queue: 2048,
            transport: Some(transport),
        },
        sampling_ratio: ratio,
        content: if config.and_then(|config| config.capture_content).unwrap_or(false) {
            // The same redactor the runs' tool output goes through.
            Content::captured(loom::Redactor::from_env())
        } else {
            Content::left()
        },
    };
    match Telemetry::start(&settings) {
        Ok(telemetry) => Some(Arc::new(telemetry)),
        Err(err) => {
            say!("loom: warning: no traces are sent: {err}");
            None
        }
    }
}

/// Sends the spans that wait (at a command's end), at most a few seconds.
pub(crate) fn flush() {
    if let Some(Some(telemetry)) = STARTED.get() {
        if !telemetry.flush(FLUSH_PATIENCE) {
            say!("loom: warning: the last traces could not be sent in time");
        }
    }
}

/// The trace a command runs in, from `TRACEPARENT` (OpenTelemetry's
/// variable for a trace context handed to a child process, as a traced CI
/// job or script sets it): its run's span becomes that span's child. One
/// that is not valid is ignored, as for the header.
pub(crate) fn trace_parent_from_environment() -> Option<loom::TraceParent> {
    // Read once: `loom chat` asks for each task, and says a bad one once.
    static GIVEN: OnceLock<Option<loom::TraceParent>> = OnceLock::new();
    *GIVEN.get_or_init(|| {
        let given = std::env::var("TRACEPARENT").ok()?;
        match given.parse() {
            Ok(parent) => Some(parent),
            Err(err) => {
                say!("loom: warning: TRACEPARENT is ignored: {err}");
                None
            }
        }
    })
}
