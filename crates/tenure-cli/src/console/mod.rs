//! `tenure console`: a live web page of the store's locks, elections and
//! sessions, with an HTTP API, Prometheus text, and guarded admin actions.
//!
//! One task reads the store every `--refresh` and publishes a snapshot;
//! the page follows it over server-sent events. The page is three files
//! compiled into the binary (nothing is fetched from outside) and builds its
//! DOM with `textContent` only, under a strict Content-Security-Policy.
//!
//! Admin actions are enforced here, not by hiding buttons: without
//! `--admin-token-file` every POST is refused; with it, a POST needs the
//! token as a bearer token (compared in constant time), a same-origin
//! `Origin` (when the browser sends one), a `Host` that names this console
//! (against DNS rebinding), the CSRF header the page sets, the name typed
//! again and a reason. Each action is appended to the audit log.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use tenure::{Name, Store};
use tokio::sync::watch;

mod actions;
mod metrics;

use actions::{act, check_host};
use metrics::metrics;

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// The header the page sets on every POST: a cross-site form cannot.
const CSRF_HEADER: &str = "x-tenure-csrf";

#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// Address to serve on. Loopback by default; any other address needs
    /// --admin-token-file (the token guards actions, and the page is not
    /// meant to be public).
    #[arg(long, default_value = "127.0.0.1:9480")]
    pub listen: SocketAddr,
    /// Enables admin actions (force release, step down): the file holds the
    /// token an administrator types into the page (whitespace trimmed, at
    /// least 16 characters). Without it the console is read-only.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// Appends one JSON line per admin action here (also logged).
    #[arg(long)]
    pub audit_log: Option<PathBuf>,
    /// How often the store is read.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub refresh: Duration,
    /// Only names that start with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Another `host:port` browsers may use to reach this console (behind a
    /// proxy, or a non-loopback --listen); repeatable. Requests naming any
    /// other Host are refused (against DNS rebinding).
    #[arg(long = "allow-host", value_name = "HOST:PORT")]
    pub allow_hosts: Vec<String>,
}

/// What the console needs from the CLI around it.
pub struct Context {
    pub store: Arc<dyn Store>,
    /// The store URL with its password masked.
    pub store_url: String,
}

struct Console {
    store: Arc<dyn Store>,
    store_url: String,
    token: Option<Vec<u8>>,
    audit_log: Option<PathBuf>,
    /// `Host` values that name this console.
    hosts: Vec<String>,
    snapshot: watch::Receiver<Arc<Snapshot>>,
    /// Becomes true when the console is stopping: open event streams end.
    stopping: watch::Receiver<bool>,
    /// Wakes an idle read loop (a scrape, an API call).
    demand: Arc<tokio::sync::Notify>,
    refresh: Duration,
    /// Requests served, by route (the console's own metrics).
    requests: std::sync::Mutex<HashMap<&'static str, u64>>,
    started: Instant,
}

/// One reading of the store.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    /// `tenure status --json`'s array, each entry with `waiting_ms` (how
    /// long this console has seen it waiting).
    names: serde_json::Value,
    /// `tenure schedule list --json`'s array.
    schedules: serde_json::Value,
    /// `tenure upgrade status --json`: the builds the store's sessions
    /// speak (null where the store lists none).
    builds: serde_json::Value,
    /// Why the last read failed, if it did.
    error: Option<String>,
    /// When it was read (Unix ms).
    at_ms: u128,
    /// Reads so far, and how many failed.
    reads: u64,
    failed_reads: u64,
}

/// Serves the console until SIGINT/SIGTERM.
pub async fn run(cx: Context, args: ConsoleArgs) -> Result<u8, (u8, String)> {
    let usage = |m: String| (crate::exit::USAGE, m);
    let token = match &args.admin_token_file {
        None => None,
        Some(path) => {
            let raw = std::fs::read_to_string(path)
                .map_err(|e| usage(format!("--admin-token-file {}: {e}", path.display())))?;
            let token = raw.trim().as_bytes().to_vec();
            if token.len() < 16 {
                return Err(usage(format!(
                    "--admin-token-file {}: the token must be at least 16 characters",
                    path.display()
                )));
            }
            Some(token)
        }
    };
    if !args.listen.ip().is_loopback() && token.is_none() {
        return Err(usage(format!(
            "--listen {}: a non-loopback address needs --admin-token-file",
            args.listen
        )));
    }
    if args.refresh < Duration::from_millis(50) {
        return Err(usage("--refresh must be at least 50ms".into()));
    }
    let (publish, snapshot) = watch::channel(Arc::new(Snapshot::default()));
    let (stop, stopping) = watch::channel(false);
    let demand = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(read_loop(
        cx.store.clone(),
        args.prefix.clone(),
        args.refresh,
        publish,
        demand.clone(),
    ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| {
            (
                crate::exit::UNAVAILABLE,
                format!("--listen {}: {e}", args.listen),
            )
        })?;
    let listen = listener
        .local_addr()
        .map_err(|e| (crate::exit::SOFTWARE, e.to_string()))?;
    let port = listen.port();
    let mut hosts = vec![
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ];
    if !listen.ip().is_unspecified() {
        hosts.push(listen.to_string());
    }
    hosts.extend(args.allow_hosts.iter().cloned());
    let console = Arc::new(Console {
        store: cx.store,
        store_url: cx.store_url,
        token,
        audit_log: args.audit_log,
        hosts,
        snapshot,
        stopping,
        demand,
        refresh: args.refresh,
        requests: std::sync::Mutex::new(HashMap::new()),
        started: Instant::now(),
    });
    let app = Router::new()
        .route("/", get(page))
        .route("/console.js", get(script))
        .route("/console.css", get(style))
        .route("/api/config", get(config))
        .route("/api/status", get(status))
        .route("/api/schedules", get(schedules))
        .route("/api/builds", get(builds))
        .route("/api/events", get(events))
        .route("/metrics", get(metrics))
        .route("/api/release", post(act))
        .route("/api/action", post(act))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            check_host,
        ))
        .with_state(console.clone());
    // The handlers are in place before the address is out: a SIGTERM that
    // follows the first answer must stop the console gracefully, not kill
    // it (seen in CI when the shutdown future was first polled late).
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    // The address first, on its own line: scripts and tests read it.
    outln!("console listening on http://{listen}/");
    tracing::info!(%listen, admin = console.token.is_some(), "console started");
    let shutdown = async move {
        tokio::select! {
            _ = received(interrupt.as_mut()) => {}
            _ = received(term.as_mut()) => {}
        }
        // Open pages' event streams end, so the server can finish.
        let _ = stop.send(true);
    };
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .map_err(|e| (crate::exit::SOFTWARE, e.to_string()))?;
    Ok(0)
}

/// Resolves when `signal` arrives (never without a handler).
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Reads the store every `refresh` and publishes what it saw.
/// Reads every `refresh` while a page is open (an event stream holds a
/// receiver) or a request came in the last half minute; otherwise every
/// 10 s, or at once when a request asks.
async fn read_loop(
    store: Arc<dyn Store>,
    prefix: String,
    refresh: Duration,
    publish: watch::Sender<Arc<Snapshot>>,
    demand: Arc<tokio::sync::Notify>,
) {
    let mut last_demand = Instant::now();
    // When each waiting entry (name, token) was first seen waiting.
    let mut waiting_since: HashMap<(String, u64), Instant> = HashMap::new();
    let (mut reads, mut failed) = (0u64, 0u64);
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let names = crate::commands::status::status_json(&store, &prefix).await?;
            // The schedules' board apart: if it cannot be read, the names
            // still are.
            let schedules = crate::commands::schedule::schedules_json(&store, &prefix).await;
            // Which builds use the store: shown when the store lists them.
            let builds = crate::commands::upgrade::builds_json(&store)
                .await
                .unwrap_or(serde_json::Value::Null);
            Ok::<_, tenure::Error>((names, schedules, builds))
        })
        .await;
        reads += 1;
        let mut snapshot = Snapshot {
            at_ms: unix_ms(),
            ..Snapshot::default()
        };
        match read {
            Ok(Ok((mut names, schedules, builds))) => {
                snapshot.builds = builds;
                match schedules {
                    Ok(schedules) => snapshot.schedules = schedules,
                    Err(e) => {
                        failed += 1;
                        snapshot.error = Some(format!("schedules: {e}"));
                        snapshot.schedules = publish.borrow().schedules.clone();
                    }
                }
                let now = Instant::now();
                let mut seen = std::collections::HashSet::new();
                for n in names.as_array_mut().into_iter().flatten() {
                    let name = n["name"].as_str().unwrap_or_default().to_string();
                    for e in n["entries"].as_array_mut().into_iter().flatten() {
                        if e["state"] != "waiter" {
                            continue;
                        }
                        let key = (name.clone(), e["token"].as_u64().unwrap_or(0));
                        let since = *waiting_since.entry(key.clone()).or_insert(now);
                        e["waiting_ms"] = serde_json::json!(now.duration_since(since).as_millis());
                        seen.insert(key);
                    }
                }
                waiting_since.retain(|k, _| seen.contains(k));
                snapshot.names = names;
            }
            Ok(Err(e)) => {
                failed += 1;
                snapshot.error = Some(e.to_string());
                snapshot.names = publish.borrow().names.clone();
                snapshot.schedules = publish.borrow().schedules.clone();
            }
            Err(_) => {
                failed += 1;
                snapshot.error = Some("the store did not answer within 10s".into());
                snapshot.names = publish.borrow().names.clone();
                snapshot.schedules = publish.borrow().schedules.clone();
            }
        }
        snapshot.reads = reads;
        snapshot.failed_reads = failed;
        if publish.send(Arc::new(snapshot)).is_err() {
            return;
        }
        // The console itself keeps one receiver.
        let watched = publish.receiver_count() > 1;
        if watched || last_demand.elapsed() < Duration::from_secs(30) {
            tokio::select! {
                _ = tokio::time::sleep(refresh) => {}
                _ = demand.notified() => last_demand = Instant::now(),
            }
        } else if tokio::time::timeout(Duration::from_secs(10), demand.notified())
            .await
            .is_ok()
        {
            last_demand = Instant::now();
        }
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

impl Console {
    fn count(&self, route: &'static str) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry(route).or_insert(0) += 1;
        }
    }

    /// A snapshot no older than two refreshes (waking an idle read loop),
    /// or the latest one after 10 s.
    async fn fresh(&self) -> Arc<Snapshot> {
        self.demand.notify_one();
        let mut rx = self.snapshot.clone();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let s = rx.borrow_and_update().clone();
            let age = unix_ms().saturating_sub(s.at_ms);
            if s.reads > 0 && age <= 2 * self.refresh.as_millis() + 50 {
                return s;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .map_or(true, |r| r.is_err())
            {
                return s;
            }
        }
    }

    fn snapshot_json(&self) -> serde_json::Value {
        let s = self.snapshot.borrow().clone();
        serde_json::json!({
            "store": self.store_url,
            "at_ms": s.at_ms,
            "error": s.error,
            "names": s.names,
            "schedules": s.schedules,
            "builds": s.builds,
        })
    }
}

/// Security headers on every page and script: nothing from elsewhere, no
/// inline script, no framing.
fn with_headers(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn page(State(c): State<Arc<Console>>) -> Response {
    c.count("page");
    with_headers("text/html; charset=utf-8", PAGE)
}

async fn script(State(c): State<Arc<Console>>) -> Response {
    c.count("script");
    with_headers("text/javascript; charset=utf-8", SCRIPT)
}

async fn style(State(c): State<Arc<Console>>) -> Response {
    c.count("style");
    with_headers("text/css; charset=utf-8", STYLE)
}

async fn config(State(c): State<Arc<Console>>) -> Json<serde_json::Value> {
    c.count("config");
    Json(serde_json::json!({
        "admin": c.token.is_some(),
        "store": c.store_url,
        "backend": c.store.capabilities().backend,
    }))
}

async fn status(State(c): State<Arc<Console>>) -> Response {
    answer(&c, "status", |s| &s.names).await
}

async fn schedules(State(c): State<Arc<Console>>) -> Response {
    answer(&c, "schedules", |s| &s.schedules).await
}

async fn builds(State(c): State<Arc<Console>>) -> Response {
    answer(&c, "builds", |s| &s.builds).await
}

/// A part of a fresh snapshot as JSON, or 503 while the store has never
/// answered.
async fn answer(
    c: &Console,
    route: &'static str,
    part: impl Fn(&Snapshot) -> &serde_json::Value,
) -> Response {
    c.count(route);
    let snapshot = c.fresh().await;
    match &snapshot.error {
        Some(e) if snapshot.reads <= 1 => {
            (StatusCode::SERVICE_UNAVAILABLE, e.clone()).into_response()
        }
        _ => Json(part(&snapshot).clone()).into_response(),
    }
}

async fn events(
    State(c): State<Arc<Console>>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>> {
    c.count("events");
    let console = c.clone();
    let stream = futures_util::stream::unfold(
        (c.snapshot.clone(), c.stopping.clone(), true),
        move |(mut rx, mut stopping, first)| {
            let console = console.clone();
            async move {
                // The current snapshot at once, then each new one, until
                // the console stops.
                if *stopping.borrow() {
                    return None;
                }
                if !first {
                    tokio::select! {
                        changed = rx.changed() => changed.ok()?,
                        _ = stopping.changed() => return None,
                    }
                }
                rx.borrow_and_update();
                let data = console.snapshot_json().to_string();
                Some((
                    Ok(Event::default().event("snapshot").data(data)),
                    (rx, stopping, false),
                ))
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
}
