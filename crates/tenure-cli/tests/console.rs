//! `tenure console`: its HTTP API and admin checks over plain HTTP, and the
//! page in a real browser (Debian's chromium, driven through
//! chromium-driver's WebDriver API).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{dead, signal, wait_exit, wait_file, Env};

/// A `tenure console` child, killed when dropped.
struct Console {
    child: Child,
    /// `127.0.0.1:PORT`.
    addr: String,
}

impl Console {
    fn start(env: &Env, extra: &[&str]) -> Console {
        let mut args = vec!["console", "--listen", "127.0.0.1:0", "--refresh", "100ms"];
        args.extend_from_slice(extra);
        let mut child = env
            .cmd(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the console printed its address");
        let addr = line
            .trim()
            .strip_prefix("console listening on http://")
            .and_then(|a| a.strip_suffix('/'))
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_string();
        Console { child, addr }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange (Connection: close), bounded by 10 s.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap();
    // Starting a browser can take a while on a busy machine.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    // Read the head, then the body by its length (a server may keep the
    // connection open whatever we asked), or to the end.
    let mut reader = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let body = match length {
        Some(n) => {
            let mut buf = vec![0; n];
            reader.read_exact(&mut buf).unwrap();
            String::from_utf8_lossy(&buf).to_string()
        }
        None if lower.contains("transfer-encoding: chunked") => {
            let mut out = String::new();
            loop {
                let mut size = String::new();
                reader.read_line(&mut size).unwrap();
                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                if n == 0 {
                    break;
                }
                let mut buf = vec![0; n + 2];
                reader.read_exact(&mut buf).unwrap();
                out.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            out
        }
        None => {
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
            rest
        }
    };
    Answer { status, head, body }
}

fn json(a: &Answer) -> serde_json::Value {
    serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{e}: {}", a.body))
}

/// A `tenure lock NAME -- sh -c 'echo $$ > $D/pid; sleep 60'` child.
fn holder(env: &Env, name: &str, ttl: &str) -> (Child, i32) {
    let pid_file = format!("{name}.pid");
    let child = env
        .cmd(&[
            "lock",
            name,
            "--ttl",
            ttl,
            "--",
            "sh",
            "-c",
            &format!("echo $$ > \"$D/{pid_file}\"; exec sleep 60"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = wait_file(&env.path(&pid_file)).parse().unwrap();
    (child, pid)
}

const TOKEN: &str = "correct-horse-battery-staple";

#[test]
fn read_only_refuses_every_action() {
    let env = Env::sqlite();
    let console = Console::start(&env, &[]);
    let page = http(&console.addr, "GET", "/", &[], "");
    assert_eq!(page.status, 200);
    assert!(page
        .head
        .to_ascii_lowercase()
        .contains("content-security-policy: default-src 'none'"));
    assert!(page.body.contains("/console.js"));
    assert_eq!(
        json(&http(&console.addr, "GET", "/api/config", &[], ""))["admin"],
        false
    );
    let (mut lock, command) = holder(&env, "ro", "15s");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let a = http(&console.addr, "GET", "/api/status", &[], "");
        if a.status == 200 && json(&a).to_string().contains("\"ro\"") {
            break;
        }
        assert!(Instant::now() < deadline, "{} {}", a.status, a.body);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every route checks the Host: a rebound DNS name is refused.
    let rebound = http(
        &console.addr,
        "GET",
        "/api/status",
        &[("Host", "evil.example:9480")],
        "",
    );
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    // Even with every header right, a read-only console acts on nothing.
    let refused = http(
        &console.addr,
        "POST",
        "/api/release",
        &[
            ("Authorization", &format!("Bearer {TOKEN}")),
            ("X-Tenure-CSRF", "1"),
            ("Content-Type", "application/json"),
        ],
        r#"{"name":"ro","confirm":"ro","reason":"test"}"#,
    );
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("read-only"));
    // So are ending a session and pausing a schedule.
    for body in [
        r#"{"name":"0123abcd","confirm":"0123abcd","reason":"t","action":"end-session"}"#,
        r#"{"name":"job","confirm":"job","reason":"t","action":"pause"}"#,
    ] {
        let refused = http(
            &console.addr,
            "POST",
            "/api/action",
            &[
                ("Authorization", &format!("Bearer {TOKEN}")),
                ("X-Tenure-CSRF", "1"),
                ("Content-Type", "application/json"),
            ],
            body,
        );
        assert_eq!(refused.status, 403, "{body}: {}", refused.body);
    }
    assert!(!dead(command), "the holder's command was stopped");
    // A non-loopback address without a token is refused at start.
    let out = env.run(&["console", "--listen", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    signal(lock.id(), libc::SIGTERM);
    wait_exit(&mut lock, Duration::from_secs(20));
}

/// SIGTERM with a page open (an event stream): the stream ends and the
/// console exits at once.
#[test]
fn stops_with_a_page_open() {
    let env = Env::sqlite();
    let mut console = Console::start(&env, &[]);
    let mut stream = TcpStream::connect(&console.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /api/events HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
        console.addr
    )
    .unwrap();
    let mut first = [0u8; 256];
    let n = stream.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).contains("200 OK"));
    signal(console.child.id(), libc::SIGTERM);
    let status = wait_exit(&mut console.child, Duration::from_secs(5));
    assert!(status.success(), "{status:?}");
}

#[test]
fn metrics_are_prometheus_text() {
    let env = Env::sqlite();
    let console = Console::start(&env, &[]);
    let (mut lock, _) = holder(&env, "metered", "15s");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let a = http(&console.addr, "GET", "/metrics", &[], "");
        assert_eq!(a.status, 200);
        assert!(a.head.contains("text/plain; version=0.0.4"));
        if a.body
            .contains("tenure_console_holders{name=\"metered\",kind=\"lock\"} 1")
        {
            break a.body;
        }
        assert!(Instant::now() < deadline, "{}", a.body);
        std::thread::sleep(Duration::from_millis(100));
    };
    // Every sample line belongs to a family announced by # TYPE.
    let mut typed = std::collections::HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.insert(rest.split_whitespace().next().unwrap().to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let family = line.split(['{', ' ']).next().unwrap();
            assert!(typed.contains(family), "{line}");
        }
    }
    if let Some(promtool) = promtool() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.txt");
        std::fs::write(&file, &text).unwrap();
        let out = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&file).unwrap())
            .output()
            .unwrap();
        assert!(out.status.success(), "promtool: {out:?}\n{text}");
    }
    signal(lock.id(), libc::SIGTERM);
    wait_exit(&mut lock, Duration::from_secs(20));
}

/// `tenure lock --metrics ADDR`: the process's own metrics while the
/// command runs, in Prometheus text that promtool accepts.
#[test]
fn lock_serves_its_own_metrics() {
    let env = Env::sqlite();
    let mut lock = env
        .cmd(&[
            "lock",
            "measured",
            "--metrics",
            "127.0.0.1:0",
            "--",
            "sh",
            "-c",
            "exec sleep 30",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = lock.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stderr).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the address");
    let addr = line
        .trim()
        .strip_prefix("tenure: metrics on http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("unexpected: {line:?}"))
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let a = http(&addr, "GET", "/metrics", &[], "");
        assert_eq!(a.status, 200);
        if a.body
            .contains("tenure_held{kind=\"mutex\",name=\"measured\"} 1")
        {
            break a.body;
        }
        assert!(Instant::now() < deadline, "{}", a.body);
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        text.contains("tenure_sessions_open{backend=\"sqlite\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tenure_fencing_token{name=\"measured\"} 1"),
        "{text}"
    );
    assert!(text.contains("tenure_store_operation_seconds"), "{text}");
    if let Some(promtool) = promtool() {
        let mut child = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "promtool: {out:?}\n{text}");
    }
    signal(lock.id(), libc::SIGTERM);
    wait_exit(&mut lock, Duration::from_secs(20));
}

/// docs/alerts.yml parses, and each alert fires on the series it is for
/// (docs/alerts_test.yml, run by `promtool test rules`).
#[test]
fn alert_rules_check_and_fire() {
    let Some(promtool) = promtool() else {
        return;
    };
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(docs)
            .output()
            .unwrap();
        assert!(out.status.success(), "promtool {args:?}: {out:?}");
    }
}

/// promtool, from the prometheus package unpacked by scripts/test, or on
/// PATH. On CI it must be there.
fn promtool() -> Option<std::path::PathBuf> {
    let candidates = [
        std::env::var_os("TENURE_PROMTOOL").map(std::path::PathBuf::from),
        Some("/usr/bin/promtool".into()),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() {
        tenure_testkit::missing("promtool", "prometheus (scripts/test unpacks it)");
    }
    found
}

#[test]
fn admin_actions_are_checked_released_and_audited() {
    let env = Env::sqlite();
    std::fs::write(env.path("token"), format!("{TOKEN}\n")).unwrap();
    let token_file = env.path("token").display().to_string();
    let audit = env.path("audit.jsonl");
    let audit_arg = audit.display().to_string();
    let console = Console::start(
        &env,
        &["--admin-token-file", &token_file, "--audit-log", &audit_arg],
    );
    let (mut lock, command) = holder(&env, "stuck", "15s");
    let bearer = format!("Bearer {TOKEN}");
    let good: Vec<(&str, &str)> = vec![
        ("Authorization", &bearer),
        ("X-Tenure-CSRF", "1"),
        ("Content-Type", "application/json"),
    ];
    let body = r#"{"name":"stuck","confirm":"stuck","reason":"job hung since 02:00"}"#;
    let post = |headers: &[(&str, &str)], body: &str| {
        http(&console.addr, "POST", "/api/release", headers, body)
    };
    // Each check on its own.
    let wrong_token: Vec<(&str, &str)> = vec![
        ("Authorization", "Bearer correct-horse-battery-stapl3"),
        ("X-Tenure-CSRF", "1"),
    ];
    assert_eq!(post(&wrong_token, body).status, 401);
    assert_eq!(post(&good[1..], body).status, 401, "no token");
    assert_eq!(
        post(&[good[0], good[2]], body).status,
        403,
        "no CSRF header"
    );
    let mut cross = good.clone();
    cross.push(("Origin", "http://evil.example"));
    assert_eq!(post(&cross, body).status, 403, "cross-origin");
    let mut rebound = good.clone();
    rebound.push(("Host", "evil.example:9480"));
    assert_eq!(post(&rebound, body).status, 403, "DNS rebinding");
    let mismatch = r#"{"name":"stuck","confirm":"stuk","reason":"x"}"#;
    assert_eq!(post(&good, mismatch).status, 400, "name not typed again");
    let no_reason = r#"{"name":"stuck","confirm":"stuck","reason":"  "}"#;
    assert_eq!(post(&good, no_reason).status, 400, "no reason");
    assert!(!audit.exists(), "a refused action was audited");
    assert!(!dead(command), "a refused action stopped the holder");

    let origin = format!("http://{}", console.addr);
    let mut same_origin = good.clone();
    same_origin.push(("Origin", &origin));
    let done = post(&same_origin, body);
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(json(&done)["evicted_sessions"], 1);
    // The holder learns at its next renewal: its command is stopped and
    // tenure exits 79 (lease lost).
    let status = wait_exit(&mut lock, Duration::from_secs(30));
    assert_eq!(status.code(), Some(79), "{status:?}");
    assert!(dead(command));
    let line = std::fs::read_to_string(&audit).unwrap();
    let record: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(record["action"], "release");
    assert_eq!(record["target"], "stuck");
    assert_eq!(record["reason"], "job hung since 02:00");
    assert_eq!(record["before"][0]["state"], "holder");
    assert_eq!(record["after"].as_array().map(Vec::len), Some(0));
    assert!(record["from"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(!line.contains(TOKEN), "the token reached the audit log");
}

/// A minimal WebDriver client for chromium-driver.
struct Browser {
    driver: Child,
    addr: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// chromium-driver and a headless chromium, or `None` (after the test
    /// kit's `missing`, which fails on CI) without them.
    fn start() -> Option<Browser> {
        for (binary, package) in [
            ("/usr/bin/chromedriver", "chromium-driver"),
            ("/usr/bin/chromium", "chromium"),
        ] {
            if !std::path::Path::new(binary).is_file() {
                tenure_testkit::missing(binary, package);
                return None;
            }
        }
        let port = tenure_testkit::free_port();
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,760",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        let answer = browser.call("POST", "/session", &caps);
        browser.session = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        Some(browser)
    }

    fn call(&self, method: &str, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let a = http(
            &self.addr,
            method,
            path,
            &[("Content-Type", "application/json")],
            &if body.is_null() {
                String::new()
            } else {
                body.to_string()
            },
        );
        let v = json(&a);
        assert_eq!(a.status, 200, "{method} {path}: {v}");
        v["value"].clone()
    }

    fn open(&self, url: &str) {
        self.call(
            "POST",
            &format!("/session/{}/url", self.session),
            &serde_json::json!({ "url": url }),
        );
    }

    fn js(&self, script: &str) -> serde_json::Value {
        self.call(
            "POST",
            &format!("/session/{}/execute/sync", self.session),
            &serde_json::json!({ "script": script, "args": [] }),
        )
    }

    /// Polls `script` until it returns `want`, within `within`.
    fn until(&self, script: &str, want: serde_json::Value, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let got = self.js(script);
            if got == want {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "{script} = {got}, not {want}, after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call(
            "GET",
            &format!("/session/{}/screenshot", self.session),
            &serde_json::Value::Null,
        );
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap_or_default())
            .unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = http(
                &self.addr,
                "DELETE",
                &format!("/session/{}", self.session),
                &[],
                "",
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

const XSS: &str = "<img src=x onerror=alert(1)>";

/// The page, live, in chromium: a lock taken elsewhere appears with its
/// holder and token and goes on release without a reload; a label that is
/// HTML shows as text; a holder that stops renewing turns amber, red, then
/// goes; read-only mode has no action button; no script error.
#[test]
fn the_page_follows_the_store_in_a_real_browser() {
    let Some(browser) = Browser::start() else {
        return;
    };
    let env = Env::sqlite();
    let console = Console::start(&env, &[]);
    // Until its first reading the page says it is reading, not that the
    // store is empty; once live, that nothing is held.
    let page = http(&console.addr, "GET", "/", &[], "");
    assert!(page.body.contains("Reading the store…"), "{}", page.body);
    assert!(!page.body.contains("No name has a holder"), "{}", page.body);
    open_live(&browser, &console);
    browser.until(
        "return document.getElementById('empty').textContent",
        "No name has a holder or a waiter.".into(),
        Duration::from_secs(5),
    );

    // Another process (this test) takes a lock with an HTML label.
    let (rt, store) = runtime_and_store(&env);
    let session = rt
        .block_on(tenure::Session::with_options(
            &store,
            tenure::SessionOptions::new()
                .ttl(Duration::from_secs(15))
                .label(XSS),
        ))
        .unwrap();
    let guard = rt
        .block_on(tenure::Mutex::new(&session, "web-lock").unwrap().lock())
        .unwrap();
    let row = "const r = document.querySelector('tr[data-name=\"web-lock\"]');";
    let seen_in = browser.until(
        &format!("{row} return r ? r.querySelector('.token').textContent : null"),
        guard.token().to_string().into(),
        Duration::from_secs(2),
    );
    eprintln!("the lock appeared on the page {seen_in:?} after it was taken");
    // The label is text: no element was made from it.
    let holder_text = browser.js(&format!(
        "{row} return r.querySelector('.holder').textContent"
    ));
    assert!(holder_text.as_str().unwrap().contains(XSS), "{holder_text}");
    assert_eq!(
        browser.js("return document.querySelectorAll('main img').length"),
        0
    );
    // The builds using the store: this one, with the session just opened.
    browser.until(
        "const b = document.querySelector('#builds .build'); return b ? b.textContent.startsWith('tenure ') : null",
        true.into(),
        Duration::from_secs(5),
    );
    let line = browser.js("return document.querySelector('#builds .build').textContent");
    assert!(
        line.as_str().unwrap().contains(env!("CARGO_PKG_VERSION")),
        "{line}"
    );
    // Read-only: no action button anywhere.
    assert_eq!(
        browser.js("return document.querySelectorAll('button.action').length"),
        0
    );
    // A waiter behind it, and an election with a leader's value.
    let other = rt
        .block_on(tenure::Session::with_options(
            &store,
            tenure::SessionOptions::new().label("worker-2:4242"),
        ))
        .unwrap();
    let waiter = {
        let other = other.clone();
        rt.spawn(async move { tenure::Mutex::new(&other, "web-lock").unwrap().lock().await })
    };
    let term = rt
        .block_on(
            tenure::Election::new(&other, "scheduler")
                .unwrap()
                .campaign("10.0.0.7:8080"),
        )
        .unwrap();
    browser.until(
        "const r = document.querySelector('tr[data-name=\"scheduler\"]'); return r ? r.querySelector('.kind').textContent : null",
        "election".into(),
        Duration::from_secs(5),
    );
    browser.until(
        &format!("{row} return r.querySelector('.waiters').textContent"),
        "1".into(),
        Duration::from_secs(5),
    );
    // A detail view of the queue on click.
    browser.js(&format!("{row} r.click(); return true"));
    browser.until(
        "return document.getElementById('queue').tBodies[0].rows.length",
        2.into(),
        Duration::from_secs(5),
    );
    let shot = browser.screenshot();
    assert!(shot.starts_with(b"\x89PNG"), "not a PNG");
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console.png");
    std::fs::write(&target, &shot).unwrap();
    if std::env::var_os("TENURE_UPDATE_SCREENSHOT").is_some() {
        let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/console.png");
        std::fs::write(docs, &shot).unwrap();
    }

    // The waiter gives up (leaves the queue), then the holder releases.
    waiter.abort();
    rt.block_on(term.resign()).unwrap();
    browser.until(
        &format!("{row} return r.querySelector('.waiters').textContent"),
        "0".into(),
        Duration::from_secs(5),
    );
    rt.block_on(guard.release()).unwrap();
    browser.until(
        "return document.querySelector('tr[data-name=\"web-lock\"]') === null",
        true.into(),
        Duration::from_secs(5),
    );

    // A holder that stops renewing: its tenure process is stopped (its
    // supervisor stops the command at the lease's deadline).
    let (mut lock, _) = holder(&env, "frozen", "6s");
    let lease = "const l = document.querySelector('tr[data-name=\"frozen\"] .lease'); return l ? l.className : null;";
    browser.until(lease, "lease ok".into(), Duration::from_secs(10));
    signal(lock.id(), libc::SIGSTOP);
    browser.until(lease, "lease amber".into(), Duration::from_secs(10));
    browser.until(lease, "lease red".into(), Duration::from_secs(10));
    browser.until(lease, serde_json::Value::Null, Duration::from_secs(15));
    signal(lock.id(), libc::SIGCONT);
    wait_exit(&mut lock, Duration::from_secs(20));

    let errors = browser.js("return window.tenureErrors");
    assert_eq!(errors, serde_json::json!([]), "script errors on the page");
}

/// Opens the console's page and waits until it is live.
fn open_live(browser: &Browser, console: &Console) {
    browser.open(&format!("http://{}/", console.addr));
    browser.until(
        "return document.getElementById('badge').textContent",
        "live".into(),
        Duration::from_secs(10),
    );
}

/// A runtime of this test's own, and the environment's store opened in it
/// (another process than the console, as far as the store can tell).
fn runtime_and_store(env: &Env) -> (tokio::runtime::Runtime, std::sync::Arc<dyn tenure::Store>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(tenure::open(&env.url)).unwrap();
    (rt, store)
}

/// A shard group on the page: its members' name is a `group` whose
/// entries are members, each shard held is a `shard` whose holder is its
/// owner, with the shard's token.
#[test]
fn a_shard_group_shows_its_members_and_owners() {
    let Some(browser) = Browser::start() else {
        return;
    };
    let env = Env::sqlite();
    let console = Console::start(&env, &[]);
    open_live(&browser, &console);
    let (rt, store) = runtime_and_store(&env);
    let session = rt.block_on(tenure::Session::new(&store)).unwrap();
    let mut owner = rt
        .block_on(tenure::Shards::new(&session, "ingest", 2).unwrap().join())
        .unwrap();
    let shard = rt.block_on(owner.next()).unwrap();
    let group = "const r = document.querySelector('tr[data-name=\"tenure.group:ingest\"]');";
    browser.until(
        &format!("{group} return r ? r.querySelector('.kind').textContent : null"),
        "group".into(),
        Duration::from_secs(5),
    );
    let name = shard.name().to_string();
    let row = format!("const r = document.querySelector('tr[data-name=\"{name}\"]');");
    browser.until(
        &format!("{row} return r ? r.querySelector('.kind').textContent : null"),
        "shard".into(),
        Duration::from_secs(5),
    );
    browser.until(
        &format!("{row} return r.querySelector('.token').textContent"),
        shard.token().to_string().into(),
        Duration::from_secs(5),
    );
    // Its queue: the owner.
    browser.js(&format!("{row} r.click(); return true"));
    browser.until(
        "const q = document.getElementById('queue').tBodies[0]; return q.rows.length ? q.rows[0].cells[1].textContent : null",
        "owner".into(),
        Duration::from_secs(5),
    );
    browser.js(&format!("{group} r.click(); return true"));
    browser.until(
        "const q = document.getElementById('queue').tBodies[0]; return q.rows.length ? q.rows[0].cells[1].textContent : null",
        "member".into(),
        Duration::from_secs(5),
    );
    let shot = browser.screenshot();
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-shards.png"),
        &shot,
    )
    .unwrap();
    drop(shard);
    rt.block_on(owner.leave()).unwrap();
    rt.block_on(session.close()).unwrap();
    let errors = browser.js("return window.tenureErrors");
    assert_eq!(errors, serde_json::json!([]), "script errors on the page");
}

/// Outcomes as outcomes, in chromium and in /metrics: a job whose runs
/// fail shows its last run as FAILED with the exit code (in red), and a
/// run in progress as running.
#[test]
fn a_failed_run_stands_out_with_its_exit_code() {
    let Some(browser) = Browser::start() else {
        return;
    };
    let env = Env::sqlite();
    let console = Console::start(&env, &[]);
    let mut cron = env
        .cmd(&[
            "cron",
            "* * * * * *",
            "failer",
            "--",
            "sh",
            "-c",
            "sleep 0.8; exit 3",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    browser.open(&format!("http://{}/", console.addr));
    let row = "const r = document.querySelector('tr[data-job=\"failer\"]');";
    browser.until(
        &format!("{row} return r ? r.querySelector('.running') !== null : null"),
        true.into(),
        Duration::from_secs(15),
    );
    let running = browser.js(&format!(
        "{row} return r.querySelector('.running').textContent"
    ));
    assert!(
        running.as_str().unwrap().starts_with("running tick"),
        "{running}"
    );
    browser.until(
        &format!("{row} const f = r.querySelector('.last-run.failed'); return f ? f.textContent.includes('exit 3') : null"),
        true.into(),
        Duration::from_secs(15),
    );
    let colour = browser.js(&format!(
        "{row} return getComputedStyle(r.querySelector('.last-run.failed')).color"
    ));
    assert_eq!(colour, "rgb(197, 48, 48)", "a failed run is not red");
    let shot = browser.screenshot();
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-failed.png"),
        &shot,
    )
    .unwrap();
    let metrics = http(&console.addr, "GET", "/metrics", &[], "").body;
    assert!(
        metrics.contains("tenure_console_schedule_last_run_failed{job=\"failer\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tenure_console_schedule_last_run_exit_code{job=\"failer\"} 3"),
        "{metrics}"
    );
    let errors = browser.js("return window.tenureErrors");
    assert_eq!(errors, serde_json::json!([]), "script errors on the page");
    signal(cron.id(), libc::SIGTERM);
    wait_exit(&mut cron, Duration::from_secs(20));
}

/// A `tenure cron` instance appending each tick it runs to `$D/ticks`.
fn cron_instance(env: &Env, job: &str) -> Child {
    env.cmd(&[
        "cron",
        "* * * * * *",
        job,
        "--",
        "sh",
        "-c",
        "echo \"$TENURE_TICK\" >> \"$D/ticks\"",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap()
}

fn ticks_run(env: &Env) -> usize {
    std::fs::read_to_string(env.path("ticks"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Admin actions from the page itself, in chromium: pausing a schedule
/// skips its ticks on both of its instances until it is resumed; ending a
/// session stops its holder (exit 79); each act is audited; no script error.
#[test]
fn pause_resume_and_end_session_from_the_page() {
    let Some(browser) = Browser::start() else {
        return;
    };
    let env = Env::sqlite();
    std::fs::write(env.path("token"), format!("{TOKEN}\n")).unwrap();
    let token_file = env.path("token").display().to_string();
    let audit = env.path("audit.jsonl");
    let audit_arg = audit.display().to_string();
    let console = Console::start(
        &env,
        &["--admin-token-file", &token_file, "--audit-log", &audit_arg],
    );
    let mut instances = [cron_instance(&env, "ticker"), cron_instance(&env, "ticker")];
    let (mut lock, command) = holder(&env, "held-by-a-session", "15s");
    browser.open(&format!("http://{}/", console.addr));
    browser.js(&format!(
        "document.getElementById('token').value = '{TOKEN}'; return true"
    ));
    let schedule = "const r = document.querySelector('tr[data-job=\"ticker\"]');";
    browser.until(
        &format!("{schedule} return r ? r.querySelector('.active, .running') !== null : null"),
        true.into(),
        Duration::from_secs(10),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while ticks_run(&env) == 0 {
        assert!(Instant::now() < deadline, "no tick ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Times carry their zone: the schedule's own (UTC).
    let next_ticks = format!("{schedule} return r.querySelector('.next-ticks').textContent");
    let next = browser.js(&next_ticks);
    assert!(next.as_str().unwrap().contains("UTC"), "{next}");
    // The page shows the run at its next reading.
    browser.until(
        &format!("{schedule} return r.querySelector('.last-run').textContent.includes('UTC')"),
        true.into(),
        Duration::from_secs(5),
    );
    // The dialog: the job typed again, a reason, submit.
    let act = |target: &str, reason: &str| {
        browser.js(&format!(
            "document.getElementById('dialog-confirm').value = {target:?};\
             document.getElementById('dialog-reason').value = {reason:?};\
             document.getElementById('dialog-form').requestSubmit(); return true"
        ));
        browser.until(
            "return document.getElementById('dialog').hidden",
            true.into(),
            Duration::from_secs(10),
        );
    };
    browser.js(&format!(
        "{schedule} r.querySelector('button.action').click(); return true"
    ));
    assert_eq!(
        browser.js("return document.getElementById('dialog-for-label').hidden"),
        false,
        "a pause asks for how long"
    );
    act("ticker", "maintenance window");
    browser.until(
        &format!("{schedule} return r.querySelector('.paused') !== null"),
        true.into(),
        Duration::from_secs(5),
    );
    // Paused until resumed: no tick is next.
    assert_eq!(browser.js(&next_ticks), "none until resumed");
    // A tick already claimed may still finish; after that, none runs on
    // either instance.
    std::thread::sleep(Duration::from_millis(1500));
    let paused_at = ticks_run(&env);
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(ticks_run(&env), paused_at, "a tick ran while paused");
    let shot = browser.screenshot();
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-admin.png"),
        &shot,
    )
    .unwrap();
    if std::env::var_os("TENURE_UPDATE_SCREENSHOT").is_some() {
        let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/console-admin.png");
        std::fs::write(docs, &shot).unwrap();
    }
    browser.js(&format!(
        "{schedule} r.querySelector('button.action').click(); return true"
    ));
    act("ticker", "window over");
    browser.until(
        &format!("{schedule} return r.querySelector('.active, .running') !== null"),
        true.into(),
        Duration::from_secs(5),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while ticks_run(&env) == paused_at {
        assert!(Instant::now() < deadline, "no tick ran after resuming");
        std::thread::sleep(Duration::from_millis(50));
    }

    // End the holder's session from the sessions list.
    let status = json(&http(&console.addr, "GET", "/api/status", &[], ""));
    let tag = status
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "held-by-a-session")
        .map(|n| n["entries"][0]["session"].as_str().unwrap().to_string())
        .expect("the holder is listed");
    browser.js(&format!(
        "document.querySelector('li.session[data-session={tag:?}] button.action').click(); return true"
    ));
    act(&tag, "worker is stuck");
    let status = wait_exit(&mut lock, Duration::from_secs(30));
    assert_eq!(status.code(), Some(79), "{status:?}");
    assert!(dead(command));

    let audited: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let actions: Vec<_> = audited.iter().map(|r| r["action"].clone()).collect();
    assert_eq!(actions, ["pause", "resume", "end-session"], "{audited:?}");
    assert_eq!(audited[0]["after"]["reason"], "maintenance window");
    assert_eq!(audited[2]["target"], tag.as_str());
    assert_eq!(audited[2]["before"][0]["name"], "held-by-a-session");
    assert_eq!(audited[2]["after"], serde_json::json!([]));
    let errors = browser.js("return window.tenureErrors");
    assert_eq!(errors, serde_json::json!([]), "script errors on the page");
    for instance in &mut instances {
        signal(instance.id(), libc::SIGTERM);
        wait_exit(instance, Duration::from_secs(20));
    }
}

/// The console on one backend: a `tenure lock` holder shows with its
/// session; ending that session from the API stops the holder (79) and
/// empties the name; schedules and metrics answer.
fn console_on(url: String) {
    let env = Env::with_url(url);
    std::fs::write(env.path("token"), format!("{TOKEN}\n")).unwrap();
    let token_file = env.path("token").display().to_string();
    let console = Console::start(&env, &["--admin-token-file", &token_file]);
    let name = "on-every-backend";
    let (mut lock, command) = holder(&env, name, "15s");
    let entries = || {
        let a = http(&console.addr, "GET", "/api/status", &[], "");
        assert_eq!(a.status, 200, "{}", a.body);
        json(&a)
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| n["entries"].clone())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let tag = loop {
        if let Some(e) = entries() {
            assert_eq!(e[0]["state"], "holder", "{e}");
            break e[0]["session"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "the holder never showed");
        std::thread::sleep(Duration::from_millis(50));
    };
    // The time its session has left: within the TTL where the store tells,
    // null (not zero) where it does not.
    let told = tenure::backend_for(&env.url)
        .ok()
        .and_then(|b| b.capabilities())
        .is_some_and(|c| c.expiry_times);
    let left = &entries().unwrap()[0]["ttl_left_ms"];
    if told {
        assert!(
            left.as_u64().is_some_and(|ms| ms > 0 && ms <= 15_000),
            "{left}"
        );
    } else {
        assert!(left.is_null(), "{left}");
    }
    let schedules = http(&console.addr, "GET", "/api/schedules", &[], "");
    assert_eq!(schedules.status, 200, "{}", schedules.body);
    assert!(json(&schedules).is_array());
    // The holder's build is among the builds using the store.
    let builds = json(&http(&console.addr, "GET", "/api/builds", &[], ""));
    assert!(
        builds["builds"].as_array().unwrap().iter().any(|b| {
            b["release"] == env!("CARGO_PKG_VERSION")
                && b["sessions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s["tag"] == tag.as_str())
        }),
        "{builds}"
    );
    assert_eq!(http(&console.addr, "GET", "/metrics", &[], "").status, 200);
    let bearer = format!("Bearer {TOKEN}");
    let body = serde_json::json!({
        "name": tag, "confirm": tag, "reason": "conformance of the console", "action": "end-session",
    });
    let done = http(
        &console.addr,
        "POST",
        "/api/action",
        &[
            ("Authorization", &bearer),
            ("X-Tenure-CSRF", "1"),
            ("Content-Type", "application/json"),
        ],
        &body.to_string(),
    );
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(json(&done)["ended"], true);
    let status = wait_exit(&mut lock, Duration::from_secs(30));
    assert_eq!(status.code(), Some(79), "{status:?}");
    assert!(dead(command));
    let deadline = Instant::now() + Duration::from_secs(20);
    while entries().is_some_and(|e| !e.as_array().unwrap().is_empty()) {
        assert!(
            Instant::now() < deadline,
            "the ended session's entry stayed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The same page and API on every store of the test kit's table that this
/// build has and that several processes can share, the stores in turn, every
/// store that failed named.
#[test]
fn every_shared_store_of_the_table() {
    let (mut ran, mut failed) = (0, Vec::new());
    for store in tenure_testkit::stores::STORES {
        let shared = store
            .registry()
            .and_then(|b| b.capabilities())
            .is_some_and(|c| c.multi_process);
        if !shared {
            continue;
        }
        let Some(running) = (store.start)() else {
            eprintln!("SKIPPED: {}: server not installed", store.backend);
            continue;
        };
        eprintln!("== {}", store.backend);
        ran += 1;
        if std::panic::catch_unwind(|| console_on(running.url.clone())).is_err() {
            failed.push(store.backend);
        }
    }
    assert!(failed.is_empty(), "the console failed on {failed:?}");
    // SQLite needs no server: at least it ran.
    assert!(ran >= 1, "no store ran");
}

/// Memory lives in the console's own process, so it only shows an empty
/// store.
#[test]
fn memory_shows_an_empty_store() {
    let env = Env::with_url("memory://".into());
    let console = Console::start(&env, &[]);
    let a = http(&console.addr, "GET", "/api/status", &[], "");
    assert_eq!((a.status, json(&a)), (200, serde_json::json!([])));
}
