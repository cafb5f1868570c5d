//! `[telemetry]` (docs/telemetry.md): the runs of this process exported
//! as OpenTelemetry traces over OTLP, when loom.toml names a collector
//! (`otlp_endpoint`) or the `OTEL_EXPORTER_OTLP_*` variables do. One
//! exporter per process, whatever agents it builds; what waits is sent
//! when the command ends.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use loom::telemetry::{ExportConfig, Telemetry, TelemetryConfig};

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
    let settings = TelemetryConfig {
        export: ExportConfig {
            endpoint,
            headers: config
                .map(|config| config.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
            service_name: config.and_then(|config| config.service_name.clone()),
            queue: 2048,
        },
        sampling_ratio: ratio,
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
