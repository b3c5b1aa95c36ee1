//! `--metrics ADDR` on `lock`, `elect` and `cron`: this process's own
//! metrics (the library's `tenure_*` series: its session, renewals, holds,
//! leadership, schedule ticks, store latency) in Prometheus text at
//! `http://ADDR/metrics` while the command runs.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::header;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;

/// Installs the Prometheus recorder for the process and serves it on
/// `addr`; returns the address bound (port 0 picks one).
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--metrics {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("--metrics {addr}: {e}"))?;
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("--metrics: cannot install the recorder: {e}"))?;
    tenure::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        // Histograms drain their buffers here (the crate leaves it to us).
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    handle.render(),
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics endpoint stopped");
        }
    });
    Ok(bound)
}
