//! `GET /metrics`: what the console exports in Prometheus text — the
//! store-wide view of names and schedules, and its own reads and requests.

use super::*;

/// The schedules' gauges of `/metrics`: paused, running, the last run's
/// outcome, exit code and time.
fn schedule_metrics(out: &mut String, schedules: &serde_json::Value) {
    let jobs: Vec<&serde_json::Value> = schedules
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut per_job = |name: &str, help: &str, f: &dyn Fn(&serde_json::Value) -> Option<f64>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for j in &jobs {
            if let Some(v) = f(j) {
                let job = prom_escape(j["job"].as_str().unwrap_or_default());
                out.push_str(&format!("{name}{{job=\"{job}\"}} {v}\n"));
            }
        }
    };
    per_job(
        "tenure_console_schedule_paused",
        "1 while a schedule is paused cluster-wide.",
        &|j| Some(if j["paused"].is_null() { 0.0 } else { 1.0 }),
    );
    per_job(
        "tenure_console_schedule_running",
        "1 while a run of the schedule is in progress (a live claim of a tick not yet recorded).",
        &|j| Some(if j["running"].is_null() { 0.0 } else { 1.0 }),
    );
    per_job(
        "tenure_console_schedule_last_run_failed",
        "1 if the schedule's last run failed (exited non-zero or died of a signal), 0 if it succeeded or was stopped.",
        &|j| {
            let result = j["last_run"]["result"].as_str()?;
            Some(if result == "failed" { 1.0 } else { 0.0 })
        },
    );
    per_job(
        "tenure_console_schedule_last_run_exit_code",
        "The exit code of the schedule's last run, where it gave one (128+N: signal N).",
        &|j| j["last_run"]["exit_code"].as_f64(),
    );
    per_job(
        "tenure_console_schedule_last_run_timestamp_seconds",
        "When a schedule's last run ended (Unix seconds), by its runner's clock.",
        &|j| {
            let ended = j["last_run"]["ended"].as_str()?;
            let t = humantime::parse_rfc3339(ended).ok()?;
            t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs_f64())
        },
    );
}

/// Prometheus text: the store-wide view (per name: entries, holders,
/// waiters, the longest wait seen, the highest token held; the leader's
/// token of each name), and the console's own process figures.
pub(super) async fn metrics(State(c): State<Arc<Console>>) -> Response {
    c.count("metrics");
    let s = c.fresh().await;
    let mut out = String::new();
    // Per name, the series carry the name and its kind ("lock", "election",
    // …), so that rules can tell a standby candidate from a waiter.
    let mut family =
        |name: &str, kind: &str, help: &str, rows: Vec<(Option<(String, String)>, f64)>| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, v) in rows {
                match labels {
                    Some((n, k)) => out.push_str(&format!(
                        "{name}{{name=\"{}\",kind=\"{}\"}} {v}\n",
                        prom_escape(&n),
                        prom_escape(&k)
                    )),
                    None => out.push_str(&format!("{name} {v}\n")),
                }
            }
        };
    // A schedule's per-tick claims (`JOB@UNIX_SECONDS`) would be a new
    // series every tick: they are left out, as the library leaves them out.
    let names: Vec<&serde_json::Value> = s
        .names
        .as_array()
        .map(|a| a.iter().filter(|n| n["kind"] != "tick claim").collect())
        .unwrap_or_default();
    let per = |f: &dyn Fn(&serde_json::Value) -> f64| -> Vec<(Option<(String, String)>, f64)> {
        names
            .iter()
            .map(|n| {
                let text = |k: &str| n[k].as_str().unwrap_or_default().to_string();
                (Some((text("name"), text("kind"))), f(n))
            })
            .collect()
    };
    let entries = |n: &serde_json::Value| n["entries"].as_array().cloned().unwrap_or_default();
    let count = |n: &serde_json::Value, state: &str| {
        entries(n).iter().filter(|e| e["state"] == state).count() as f64
    };
    family(
        "tenure_console_holders",
        "gauge",
        "Granted entries of a name.",
        per(&|n| count(n, "holder")),
    );
    family(
        "tenure_console_waiters",
        "gauge",
        "Waiting entries of a name (its queue length).",
        per(&|n| count(n, "waiter")),
    );
    family(
        "tenure_console_oldest_wait_seconds",
        "gauge",
        "How long the oldest waiter of a name has been seen waiting by this console.",
        per(&|n| {
            entries(n)
                .iter()
                .filter_map(|e| e["waiting_ms"].as_f64())
                .fold(0.0, f64::max)
                / 1000.0
        }),
    );
    family(
        "tenure_console_holder_token",
        "gauge",
        "The highest fencing token granted on a name (an election's term).",
        per(&|n| {
            entries(n)
                .iter()
                .filter(|e| e["state"] == "holder")
                .filter_map(|e| e["token"].as_f64())
                .fold(0.0, f64::max)
        }),
    );
    family(
        "tenure_console_names",
        "gauge",
        "Names with live entries.",
        vec![(None, names.len() as f64)],
    );
    family(
        "tenure_console_store_reads_total",
        "counter",
        "Reads of the store by the console.",
        vec![(None, s.reads as f64)],
    );
    family(
        "tenure_console_store_read_errors_total",
        "counter",
        "Reads of the store that failed.",
        vec![(None, s.failed_reads as f64)],
    );
    family(
        "tenure_console_uptime_seconds",
        "gauge",
        "Seconds since the console started.",
        vec![(None, c.started.elapsed().as_secs_f64())],
    );
    schedule_metrics(&mut out, &s.schedules);
    let requests: Vec<(String, u64)> = c
        .requests
        .lock()
        .map(|r| r.iter().map(|(k, v)| (k.to_string(), *v)).collect())
        .unwrap_or_default();
    out.push_str("# HELP tenure_console_requests_total HTTP requests served, by route.\n# TYPE tenure_console_requests_total counter\n");
    let mut requests = requests;
    requests.sort();
    for (route, n) in requests {
        out.push_str(&format!(
            "tenure_console_requests_total{{route=\"{route}\"}} {n}\n"
        ));
    }
    let mut r = out.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// A label value in Prometheus's text format.
fn prom_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_labels_are_escaped() {
        assert_eq!(prom_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
