//! Prometheus metrics: recorded through the `metrics` facade, rendered by
//! `metrics-exporter-prometheus` from the gateway's own `/metrics` route.
//! The names are listed in docs/server.md.

use std::sync::OnceLock;
use std::time::Duration;

use loom_core::{Event, EventKind};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Seconds: model calls, tools and store writes all fall in this range.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process's recorder (once; every gateway in the process
/// shares it) and returns what renders it. `None` when another recorder
/// was installed first.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .map_err(|err| tracing::warn!(error = %err, "histogram buckets"))
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder)
                .map_err(|err| tracing::warn!(error = %err, "another metrics recorder is installed"))
                .ok()?;
            describe();
            start_at_zero();
            keep_up(handle.clone());
            Some(handle)
        })
        .clone()
}

/// How often histogram samples are folded into their buckets when no one
/// scrapes `/metrics` (what the exporter's own `install` would do).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Folds the histograms' samples into their buckets every few seconds, on
/// a thread of its own. The recorder keeps every sample it is given until
/// a render or an upkeep drains it: a gateway nobody scrapes would
/// otherwise grow by every store write, model call and tool call it ever
/// timed.
fn keep_up(handle: PrometheusHandle) {
    let started = std::thread::Builder::new()
        .name("loom-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            handle.run_upkeep();
        });
    if let Err(err) = started {
        tracing::warn!(error = %err, "cannot start the metrics upkeep thread: histograms grow until /metrics is read");
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!("loom_runs_active", "Runs executing now.");
    describe_gauge!("loom_runs_queued", "Runs waiting for a slot.");
    describe_counter!("loom_runs_finished_total", "Runs that ended, by status.");
    describe_counter!("loom_turns_total", "Turns begun.");
    describe_counter!("loom_tool_calls_total", "Tool calls, by tool and status.");
    describe_histogram!(
        "loom_tool_duration_seconds",
        Unit::Seconds,
        "Tool call durations, by tool."
    );
    describe_histogram!("loom_model_duration_seconds", Unit::Seconds, "Model call durations.");
    describe_counter!("loom_tokens_total", "Model tokens, by kind (input, output).");
    describe_gauge!(
        "loom_cost_usd_total",
        "Model cost in US dollars so far (priced models)."
    );
    describe_gauge!("loom_permission_pending", "Asks waiting for an answer.");
    describe_gauge!("loom_ws_connections", "Open WebSocket connections.");
    describe_gauge!("loom_worker_runs_owned", "Runs this worker holds a lease on.");
    describe_counter!("loom_worker_leases_renewed_total", "Lease renewals that held.");
    describe_counter!(
        "loom_worker_leases_lost_total",
        "Runs this worker gave up: taken over by another worker, or not renewed in time."
    );
    describe_counter!(
        "loom_worker_runs_forgotten_total",
        "Finished runs removed after [cluster] keep_finished_days."
    );
    describe_counter!(
        "loom_worker_runs_parked_total",
        "Runs this worker parked while they waited for a person (they hold no worker until answered)."
    );
    describe_counter!(
        "loom_worker_takeovers_total",
        "Runs this worker took over from a worker that stopped renewing (or handed them back)."
    );
    describe_counter!(
        "loom_worker_writes_fenced_total",
        "Writes of this worker refused as stale: another worker had taken the run over, or this one had given it up."
    );
    describe_counter!(
        "loom_worker_writes_sent_stale_total",
        "Of those, the ones this worker sent and Redis refused: it had not seen yet that its lease was gone."
    );
    describe_gauge!("loom_sse_connections", "Open SSE streams.");
    describe_counter!(
        "loom_subscribers_dropped_total",
        "Subscribers dropped for falling behind."
    );
    describe_histogram!(
        "loom_store_write_seconds",
        Unit::Seconds,
        "Store write latency as the writing run waits for it, by operation."
    );
    describe_histogram!(
        "loom_store_commit_seconds",
        Unit::Seconds,
        "The store's part of a write's latency (in line for the writer, then committed), by operation."
    );
    describe_gauge!(
        "loom_circuit_breaker_state",
        "Model provider circuit: 0 closed, 1 half-open, 2 open."
    );
    describe_counter!("loom_http_requests_total", "HTTP requests, by status class.");
    describe_gauge!(
        "loom_http_connections",
        "Open client connections (WebSocket ones included)."
    );
    describe_counter!(
        "loom_http_connections_refused_total",
        "Connections refused at max_connections (none could be closed for them)."
    );
    describe_counter!(
        "loom_http_connections_evicted_total",
        "Connections waiting for a request closed at max_connections to admit a new one."
    );
    describe_counter!(
        "loom_http_timeouts_total",
        "Connections or requests ended by a timeout, by kind (header, idle, body)."
    );
    describe_counter!(
        "loom_audit_records_total",
        "Records appended to the audit trail, by action."
    );
    describe_counter!(
        "loom_audit_write_errors_total",
        "Audit records the store failed to take (the action was answered)."
    );
    describe_counter!(
        "loom_audit_refusals_dropped_total",
        "Refused-token records over 600 a minute, counted here instead of written."
    );
}

/// Every series whose labels are known ahead is exported from start-up,
/// at 0: an alert on a series needs the series before the first event.
fn start_at_zero() {
    for gauge in [
        "loom_runs_active",
        "loom_runs_queued",
        "loom_permission_pending",
        "loom_ws_connections",
        "loom_sse_connections",
        "loom_http_connections",
        "loom_cost_usd_total",
        "loom_worker_runs_owned",
    ] {
        metrics::gauge!(gauge).set(0.0);
    }
    for counter in [
        "loom_turns_total",
        "loom_subscribers_dropped_total",
        "loom_http_connections_refused_total",
        "loom_http_connections_evicted_total",
        "loom_worker_leases_renewed_total",
        "loom_worker_leases_lost_total",
        "loom_worker_takeovers_total",
        "loom_worker_runs_parked_total",
        "loom_worker_runs_forgotten_total",
        "loom_worker_writes_fenced_total",
        "loom_worker_writes_sent_stale_total",
        "loom_audit_write_errors_total",
        "loom_audit_refusals_dropped_total",
    ] {
        metrics::counter!(counter).absolute(0);
    }
    for status in ["DONE", "ERROR", "CANCELED", "TIMEOUT", "INTERRUPTED"] {
        metrics::counter!("loom_runs_finished_total", "status" => status).absolute(0);
    }
    for kind in ["input", "output"] {
        metrics::counter!("loom_tokens_total", "kind" => kind).absolute(0);
    }
    for class in ["1xx", "2xx", "3xx", "4xx", "5xx"] {
        metrics::counter!("loom_http_requests_total", "class" => class).absolute(0);
    }
    for kind in ["header", "idle", "body"] {
        metrics::counter!("loom_http_timeouts_total", "kind" => kind).absolute(0);
    }
}

/// Counts what an event says.
pub(crate) fn observe(event: &Event, model_started: &mut Option<std::time::Instant>) {
    match &event.kind {
        EventKind::IterationStart { .. } => metrics::counter!("loom_turns_total").increment(1),
        EventKind::LlmStart { .. } => *model_started = Some(std::time::Instant::now()),
        EventKind::LlmFinish { usage, cost_usd, .. } => {
            if let Some(started) = model_started.take() {
                metrics::histogram!("loom_model_duration_seconds").record(started.elapsed().as_secs_f64());
            }
            if let Some(usage) = usage {
                metrics::counter!("loom_tokens_total", "kind" => "input").increment(usage.input_tokens);
                metrics::counter!("loom_tokens_total", "kind" => "output").increment(usage.output_tokens);
            }
            if let Some(cost) = cost_usd {
                metrics::gauge!("loom_cost_usd_total").increment(*cost);
            }
        }
        EventKind::ToolResult {
            name,
            status,
            duration_ms,
            ..
        } => {
            metrics::counter!("loom_tool_calls_total", "tool" => name.clone(), "status" => status.as_str())
                .increment(1);
            metrics::histogram!("loom_tool_duration_seconds", "tool" => name.clone())
                .record(Duration::from_millis(*duration_ms).as_secs_f64());
        }
        _ => {}
    }
}
