//! `GET /metrics`: Prometheus text from the `metrics` facade's recorder
//! (`metrics-exporter-prometheus`), which the kernel's counters feed (see
//! `crate::telemetry`). One recorder per process: the first server (or
//! `--metrics-addr` exporter) installs it; later ones share it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::AppState;
use crate::Host;

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Model call latency buckets, in seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The process's Prometheus recorder, installed on first use (`None`
/// when another recorder was installed first). Counting starts then.
pub fn recorder() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(crate::telemetry::MODEL_CALL_SECONDS.to_string()),
                    LATENCY_BUCKETS,
                )
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            crate::telemetry::enable();
            spawn_upkeep(handle.clone());
            Some(handle)
        })
        .as_ref()
}

/// How often the recorder drains its histograms when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Drains the recorder's histogram samples every [`UPKEEP_EVERY`]: the
/// recorder keeps every sample until an upkeep folds it into the buckets,
/// and `build_recorder` starts no upkeep of its own, so a host nobody
/// scrapes would otherwise grow by every model call it makes. A plain
/// thread, so it needs no runtime and outlives none (it sleeps between
/// passes, for the life of the process, as the recorder does).
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("agentvisor-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            handle.run_upkeep();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "metrics: no upkeep thread; histograms drain only when scraped");
    }
}

/// The Prometheus text for `host`: the kernel's counters, and the gauges
/// read at scrape time (active runs, runs awaiting approval).
pub fn render(host: &Host) -> String {
    let Some(handle) = recorder() else {
        return String::new();
    };
    metrics::gauge!("agentvisor_active_runs").set(host.live_runs() as f64);
    metrics::gauge!("agentvisor_runs_awaiting_approval").set(host.awaiting_approval() as f64);
    handle.run_upkeep();
    handle.render()
}

pub(crate) async fn serve_metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(&st.host),
    )
        .into_response()
}

/// Serves `/metrics` alone on `listener` (`swarm` / `soak --metrics-addr`)
/// until the task is dropped.
pub async fn serve_alone(listener: tokio::net::TcpListener, host: Host) -> std::io::Result<()> {
    recorder();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let host = host.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    render(&host),
                )
            }
        }),
    );
    axum::serve(listener, app).await
}
