//! What released builds wrote to and call in each store (its *format*) is a
//! contract with every build that shares the store (docs/operations/upgrades.md):
//! a newer build installs its format beside the old one, never over it.
//!
//! `tests/formats/<release>/<store>.txt` holds a released build's format as
//! the server keeps it — routines as the server stores their text, tables
//! and their columns, indexes, views, the version marker, the shapes of keys
//! and nodes — dumped from a store that release's build used. On every run,
//! this build uses a fresh store the same way, and every released section
//! must still be there, byte for byte (key shapes and marker rows: each
//! released one still present). Then the released build's own calls (its SQL
//! text, its script by `EVALSHA`, with its arguments) run on the store this
//! build used, beside this build's holders, and must answer as they did.
//!
//! `FORMATS_WRITE=<release>` writes the fixtures instead: run it on the
//! release's commit (this file compiles against the API both share).

// Helpers serve some stores each: with a store's feature off, theirs go
// unused (the full build, which CI lints, uses them all).
#![cfg_attr(
    not(all(
        feature = "redis",
        feature = "redlock",
        feature = "postgres",
        feature = "mysql",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tenure::{Cell, Expect, Fence, Mutex, RwLock, Semaphore, Session};

/// A dump: section header (`== …`) → its lines.
type Format = BTreeMap<String, Vec<String>>;

/// A nullable text column.
type Text = Option<String>;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/formats")
}

/// Sections whose released lines must each still be present (a newer build
/// may add keys, node shapes or marker rows); every other section must be
/// byte-identical.
fn is_subset_section(header: &str) -> bool {
    header.starts_with("== keys") || header.starts_with("== rows")
}

fn render(format: &Format) -> String {
    let mut out = String::new();
    for (header, lines) in format {
        out.push_str(header);
        out.push('\n');
        for l in lines {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

fn parse(text: &str) -> Format {
    let mut format = Format::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("== ") {
            current = Some(line.to_string());
            format.entry(line.to_string()).or_default();
        } else if let Some(h) = &current {
            format.get_mut(h).unwrap().push(line.to_string());
        }
    }
    format
}

/// Writes the fixture (`FORMATS_WRITE`), or checks `now` against every
/// release's fixture for `store`.
fn keep_or_compare(store: &str, now: &Format) {
    if let Ok(release) = std::env::var("FORMATS_WRITE") {
        let dir = fixtures().join(&release);
        std::fs::create_dir_all(&dir).unwrap();
        let header = format!(
            "# The format tenure {release} left in this store, as tests/formats.rs dumps it.\n"
        );
        std::fs::write(dir.join(format!("{store}.txt")), header + &render(now)).unwrap();
        return;
    }
    let mut releases: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join(format!("{store}.txt")).exists())
        .collect();
    releases.sort();
    assert!(
        !releases.is_empty(),
        "no released format of {store} in {:?}",
        fixtures()
    );
    for dir in releases {
        let path = dir.join(format!("{store}.txt"));
        let released = parse(&std::fs::read_to_string(&path).unwrap());
        assert!(!released.is_empty(), "{path:?} is empty");
        let mut broken = Vec::new();
        for (header, lines) in &released {
            let Some(current) = now.get(header) else {
                broken.push(format!("{header}: gone"));
                continue;
            };
            if is_subset_section(header) {
                for l in lines.iter().filter(|l| !current.contains(l)) {
                    broken.push(format!("{header}: {l:?} gone"));
                }
            } else if current != lines {
                broken.push(format!(
                    "{header}: changed in place\n--- released\n{}\n--- now\n{}",
                    lines.join("\n"),
                    current.join("\n")
                ));
            }
        }
        assert!(
            broken.is_empty(),
            "{store}: this build changed what the release of {path:?} wrote or calls:\n{}",
            broken.join("\n")
        );
    }
}

/// A name or key with its generated parts replaced by placeholders, so that
/// two runs' shapes compare: 12 or more hex digits in a row (secrets, tags,
/// lease ids) become `<id>`, and a number standing alone `<n>`.
fn shape(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    let mut ids = String::new();
    let mut i = 0;
    while i < chars.len() {
        let run = chars[i..]
            .iter()
            .take_while(|c| c.is_ascii_hexdigit())
            .count();
        if run >= 12 {
            ids.push_str("<id>");
            i += run;
        } else if run > 0 {
            ids.extend(&chars[i..i + run]);
            i += run;
        } else {
            ids.push(chars[i]);
            i += 1;
        }
    }
    let mut out = String::new();
    let mut word = String::new();
    let mut chars = ids.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else if c.is_control() {
            // Separators some stores put in keys, written visibly.
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        let word_ends = !chars.peek().is_some_and(char::is_ascii_alphanumeric);
        if c.is_ascii_alphanumeric() && word_ends {
            if word.chars().all(|d| d.is_ascii_digit()) {
                out.push_str("<n>");
            } else {
                out.push_str(&word);
            }
            word.clear();
        }
    }
    out
}

fn shapes(keys: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut s: Vec<String> = keys.into_iter().map(|k| shape(&k)).collect();
    s.sort();
    s.dedup();
    s
}

/// What the test holds while the format is dumped.
struct Held {
    sessions: Vec<Session>,
    guards: Vec<Box<dyn std::any::Any + Send>>,
    waiter: tokio::task::JoinHandle<()>,
}

/// Uses the store as every recipe does: a held mutex with a waiter queued
/// behind it, a read lock, a permit, a fence written, a cell put.
async fn use_store(url: &str) -> Held {
    let store = tenure::open(url).await.unwrap();
    let a = Session::new(&store).await.unwrap();
    let b = Session::new(&store).await.unwrap();
    let m = Mutex::new(&a, "fmt/mutex").unwrap().lock().await.unwrap();
    let behind = Mutex::new(&b, "fmt/mutex").unwrap();
    let waiter = tokio::spawn(async move {
        let _ = behind.lock().await;
    });
    let r = RwLock::new(&b, "fmt/rw").unwrap().read().await.unwrap();
    let mut guards: Vec<Box<dyn std::any::Any + Send>> = vec![Box::new(r)];
    // A store that cannot bound a count (Redlock) refuses the semaphore.
    match Semaphore::new(&b, "fmt/sem", 2).unwrap().acquire().await {
        Ok(p) => guards.push(Box::new(p)),
        Err(tenure::Error::Unsupported { .. }) => {}
        Err(e) => panic!("{e:?}"),
    }
    let fence = Fence::new(&store, "fmt/fence").unwrap();
    match fence.write(m.token(), b"v").await {
        Ok(()) => {}
        // Where a fence keeps no value (Redlock), it still admits.
        Err(tenure::Error::Unsupported { .. }) => {
            fence.admit(m.token()).await.unwrap();
        }
        Err(e) => panic!("{e:?}"),
    }
    match Cell::new(&store, "fmt/cell")
        .unwrap()
        .put(b"x", Expect::Absent)
        .await
    {
        Ok(_) | Err(tenure::Error::Unsupported { .. }) => {}
        Err(e) => panic!("{e:?}"),
    }
    // The waiter's entry is in the queue.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Held {
        sessions: vec![a, b],
        guards: {
            guards.insert(0, Box::new(m));
            guards
        },
        waiter,
    }
}

impl Held {
    async fn end(self) {
        drop(self.guards);
        for s in &self.sessions {
            let _ = s.close().await;
        }
        self.waiter.abort();
    }
}

/// A secret as the released builds make them: 32 hex digits.
const OLD_SECRET: &str = "0123456789abcdef0123456789abcdef";

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use tenure_testkit::PostgresServer;
    use tokio_postgres::NoTls;

    async fn client(url: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }

    async fn dump(c: &tokio_postgres::Client, s: &str) -> Format {
        let mut f = Format::new();
        for r in c
            .query(
                "SELECT p.proname::text, pg_get_function_identity_arguments(p.oid),
                        pg_get_function_result(p.oid), p.prosrc
                   FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                  WHERE n.nspname = $1",
                &[&s],
            )
            .await
            .unwrap()
        {
            let (name, args, result, src): (String, String, Option<String>, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let result = result.unwrap_or_default();
            f.insert(
                format!("== function {name}({args}) {result}"),
                src.lines().map(str::to_string).collect(),
            );
        }
        for r in c
            .query(
                "SELECT c.relname::text, c.relkind::text, a.attname::text,
                        format_type(a.atttypid, a.atttypmod), a.attnotnull,
                        coalesce(pg_get_expr(d.adbin, d.adrelid), '')
                   FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                   LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
                  WHERE n.nspname = $1 AND c.relkind IN ('r', 'v', 'p')
                  ORDER BY c.relname, a.attnum",
                &[&s],
            )
            .await
            .unwrap()
        {
            let (table, kind, col, ty, not_null, default): (
                String,
                String,
                String,
                String,
                bool,
                String,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
            let kind = if kind == "v" { "view" } else { "table" };
            f.entry(format!("== {kind} {table}"))
                .or_default()
                .push(format!(
                    "{col} {ty}{}{}",
                    if not_null { " NOT NULL" } else { "" },
                    if default.is_empty() {
                        String::new()
                    } else {
                        format!(" DEFAULT {default}")
                    }
                ));
        }
        for r in c
            .query(
                "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1
                 UNION ALL
                 SELECT 'view ' || viewname::text, definition FROM pg_views WHERE schemaname = $1
                 UNION ALL
                 SELECT 'trigger ' || t.tgname::text, pg_get_triggerdef(t.oid)
                   FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = $1 AND NOT t.tgisinternal",
                &[&s],
            )
            .await
            .unwrap()
        {
            let (name, def): (String, String) = (r.get(0), r.get(1));
            let header = if name.starts_with("view ") || name.starts_with("trigger ") {
                format!("== definition {name}")
            } else {
                format!("== index {name}")
            };
            f.insert(header, def.lines().map(str::to_string).collect());
        }
        let marker: Vec<String> = c
            .query(
                &format!("SELECT key || '=' || value FROM {s}.meta ORDER BY key"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .filter(|l| l.starts_with("schema="))
            .collect();
        f.insert("== rows meta".into(), marker);
        f
    }

    /// The released build's calls, as its `statements.rs` prepares them
    /// (untyped), on the schema `s`.
    const OLD_CALLS: &[(&str, &str)] = &[
        ("open", "SELECT {s}.open($1, $2, $3, $4)"),
        ("join", "SELECT * FROM {s}.join($1, $2, $3, $4, $5, $6, $7)"),
        ("leave", "SELECT * FROM {s}.leave($1, $2, $3)"),
        ("close", "SELECT {s}.close($1)"),
    ];

    /// Runs the released build's calls beside this build's holder of
    /// `fmt/mutex`: its join there queues; on a free name it is granted,
    /// and this build then sees the name held.
    async fn old_build_calls(c: &tokio_postgres::Client, url: &str, s: &str) {
        let sql = |op: &str| {
            OLD_CALLS
                .iter()
                .find(|(o, _)| *o == op)
                .unwrap()
                .1
                .replace("{s}", s)
        };
        c.execute(
            &sql("open"),
            &[&OLD_SECRET, &"oldtag", &"old build", &30_000i64],
        )
        .await
        .unwrap();
        let join = c.prepare(&sql("join")).await.unwrap();
        let empty: &[u8] = b"";
        let queued = c
            .query_one(
                &join,
                &[
                    &OLD_SECRET,
                    &"fmt/mutex",
                    &0i16,
                    &0i32,
                    &0i32,
                    &empty,
                    &false,
                ],
            )
            .await
            .unwrap();
        assert_eq!(queued.get::<_, String>("status"), "ok");
        assert!(
            !queued.get::<_, bool>("granted"),
            "granted beside this build's holder"
        );
        let free = c
            .query_one(
                &join,
                &[&OLD_SECRET, &"fmt/old", &0i16, &0i32, &0i32, &empty, &false],
            )
            .await
            .unwrap();
        assert!(free.get::<_, bool>("granted"));
        let seq: i64 = free.get("seq");
        let store = tenure::open(url).await.unwrap();
        let mine = Session::new(&store).await.unwrap();
        let m = Mutex::new(&mine, "fmt/old").unwrap();
        assert!(
            m.try_lock().await.unwrap().is_none(),
            "the old build's grant unseen"
        );
        let left = c
            .query_one(&sql("leave"), &[&OLD_SECRET, &"fmt/old", &seq])
            .await
            .unwrap();
        assert_eq!(left.get::<_, String>("status"), "ok");
        c.execute(&sql("close"), &[&OLD_SECRET]).await.unwrap();
        assert!(
            m.try_lock().await.unwrap().is_some(),
            "the old build's release unseen"
        );
        mine.close().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn released_postgres_formats_are_kept_and_answer() {
        let Some(server) = PostgresServer::start_or_skip() else {
            return;
        };
        let url = server.url();
        let held = use_store(&url).await;
        let c = client(&url).await;
        keep_or_compare("postgres", &dump(&c, "tenure").await);
        old_build_calls(&c, &url, "tenure").await;
        held.end().await;
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use mysql_async::prelude::Queryable;
    use tenure_testkit::MariaDbServer;

    async fn dump(c: &mut mysql_async::Conn) -> Format {
        let mut f = Format::new();
        let routines: Vec<(String, String, Text, Text)> = c
            .query(
                "SELECT ROUTINE_NAME, ROUTINE_TYPE, DTD_IDENTIFIER, ROUTINE_DEFINITION
                   FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE()",
            )
            .await
            .unwrap();
        let params: Vec<(String, Text, Text, Text)> = c
            .query(
                "SELECT SPECIFIC_NAME, PARAMETER_MODE, PARAMETER_NAME, DTD_IDENTIFIER
                   FROM information_schema.PARAMETERS WHERE SPECIFIC_SCHEMA = DATABASE()
                  ORDER BY SPECIFIC_NAME, ORDINAL_POSITION",
            )
            .await
            .unwrap();
        for (name, kind, returns, body) in routines {
            let args: Vec<String> = params
                .iter()
                .filter(|p| p.0 == name && p.2.is_some())
                .map(|p| {
                    format!(
                        "{} {} {}",
                        p.1.clone().unwrap_or_default(),
                        p.2.clone().unwrap_or_default(),
                        p.3.clone().unwrap_or_default()
                    )
                })
                .collect();
            f.insert(
                format!(
                    "== {} {name}({}) {}",
                    kind.to_lowercase(),
                    args.join(", "),
                    returns.unwrap_or_default()
                )
                .trim_end()
                .to_string(),
                body.unwrap_or_default()
                    .lines()
                    .map(str::to_string)
                    .collect(),
            );
        }
        let columns: Vec<(String, String, String, String, Text, String)> = c
            .query(
                "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, EXTRA
                   FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
                  ORDER BY TABLE_NAME, ORDINAL_POSITION",
            )
            .await
            .unwrap();
        for (table, col, ty, nullable, default, extra) in columns {
            let default = default.unwrap_or_else(|| "-".into());
            f.entry(format!("== table {table}")).or_default().push(
                format!("{col} {ty} {nullable} {default} {extra}")
                    .trim_end()
                    .to_string(),
            );
        }
        let indexes: Vec<(String, String, String, String)> = c
            .query(
                "SELECT TABLE_NAME, INDEX_NAME, CAST(NON_UNIQUE AS CHAR), COLUMN_NAME
                   FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
                  ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX",
            )
            .await
            .unwrap();
        for (table, index, non_unique, col) in indexes {
            f.entry(format!("== index {table}.{index} non_unique={non_unique}"))
                .or_default()
                .push(col);
        }
        let defs: Vec<(String, String)> = c
            .query(
                "SELECT CONCAT('view ', TABLE_NAME), VIEW_DEFINITION FROM information_schema.VIEWS
                  WHERE TABLE_SCHEMA = DATABASE()
                 UNION ALL
                 SELECT CONCAT('trigger ', TRIGGER_NAME), ACTION_STATEMENT
                   FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()",
            )
            .await
            .unwrap();
        for (name, def) in defs {
            f.insert(
                format!("== definition {name}"),
                def.lines().map(str::to_string).collect(),
            );
        }
        let marker: Vec<(String, String)> = c
            .query("SELECT k, v FROM tenure_meta WHERE k = 'schema'")
            .await
            .unwrap();
        f.insert(
            "== rows meta".into(),
            marker
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
        );
        f
    }

    /// Runs the released build's calls (`CALL tenure_<routine>(?, …)`, as
    /// its driver sends them) beside this build's holder of `fmt/mutex`.
    async fn old_build_calls(c: &mut mysql_async::Conn, url: &str) {
        let _: Vec<mysql_async::Row> = c
            .exec(
                "CALL tenure_open(?, ?, ?, ?)",
                (OLD_SECRET, "oldtag", "old build", 30_000i64),
            )
            .await
            .unwrap();
        let join = "CALL tenure_join(?, ?, ?, ?, ?, ?, ?)";
        let queued: Vec<mysql_async::Row> = c
            .exec(
                join,
                (OLD_SECRET, "fmt/mutex", 0, 0, 0, Vec::<u8>::new(), false),
            )
            .await
            .unwrap();
        let status = |rows: &[mysql_async::Row], col: usize| -> String {
            match rows.first().and_then(|r| r.as_ref(col)) {
                Some(mysql_async::Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(mysql_async::Value::Int(n)) => n.to_string(),
                Some(mysql_async::Value::UInt(n)) => n.to_string(),
                other => format!("{other:?}"),
            }
        };
        assert_eq!(status(&queued, 0), "ok", "{queued:?}");
        assert_eq!(
            status(&queued, 2),
            "0",
            "granted beside this build's holder: {queued:?}"
        );
        let free: Vec<mysql_async::Row> = c
            .exec(
                join,
                (OLD_SECRET, "fmt/old", 0, 0, 0, Vec::<u8>::new(), false),
            )
            .await
            .unwrap();
        assert_eq!(status(&free, 2), "1", "{free:?}");
        let seq: i64 = status(&free, 1).parse().unwrap();
        let store = tenure::open(url).await.unwrap();
        let mine = Session::new(&store).await.unwrap();
        let m = Mutex::new(&mine, "fmt/old").unwrap();
        assert!(
            m.try_lock().await.unwrap().is_none(),
            "the old build's grant unseen"
        );
        let left: Vec<mysql_async::Row> = c
            .exec("CALL tenure_leave(?, ?, ?)", (OLD_SECRET, "fmt/old", seq))
            .await
            .unwrap();
        assert_eq!(status(&left, 0), "ok", "{left:?}");
        let _: Vec<mysql_async::Row> = c.exec("CALL tenure_close(?)", (OLD_SECRET,)).await.unwrap();
        assert!(
            m.try_lock().await.unwrap().is_some(),
            "the old build's release unseen"
        );
        mine.close().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn released_mysql_formats_are_kept_and_answer() {
        let Some(server) = MariaDbServer::start_or_skip() else {
            return;
        };
        let url = server.url();
        let held = use_store(&url).await;
        let mut c = mysql_async::Conn::from_url(&url).await.unwrap();
        keep_or_compare("mysql", &dump(&mut c).await);
        old_build_calls(&mut c, &url).await;
        held.end().await;
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_sqlite_formats_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.db");
    let url = format!("sqlite://{}", path.display());
    let held = use_store(&url).await;
    let c = rusqlite::Connection::open(&path).unwrap();
    let mut f = Format::new();
    let mut q = c
        .prepare("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        .unwrap();
    let rows = q
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .unwrap();
    for row in rows {
        let (kind, name, sql) = row.unwrap();
        f.insert(
            format!("== {kind} {name}"),
            sql.lines().map(str::to_string).collect(),
        );
    }
    let marker: String = c
        .query_row(
            "SELECT 'schema=' || value FROM tenure_meta WHERE key = 'schema'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    f.insert("== rows meta".into(), vec![marker]);
    keep_or_compare("sqlite", &f);
    held.end().await;
}

#[cfg(feature = "redis")]
mod redis_script {
    use super::*;
    use tenure_testkit::RedisServer;

    /// The released script's text, as its build sent it (`SCRIPT LOAD`).
    fn released_script() -> Vec<(String, String)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(fixtures()).unwrap() {
            let p = e.unwrap().path().join("redis.lua");
            if let Ok(text) = std::fs::read_to_string(&p) {
                out.push((p.display().to_string(), text));
            }
        }
        out
    }

    fn dump(con: &mut redis::Connection) -> Format {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(con).unwrap();
        let mut typed = Vec::new();
        for k in &keys {
            let t: String = redis::cmd("TYPE").arg(k).query(con).unwrap();
            typed.push(format!("{k} {t}"));
        }
        let marker: Option<String> = redis::cmd("GET")
            .arg("{tenure}:sessions")
            .query(con)
            .unwrap();
        let mut f = Format::new();
        f.insert("== keys".into(), shapes(typed));
        f.insert(
            "== rows marker".into(),
            vec![format!(
                "{{tenure}}:sessions={}",
                marker.unwrap_or_default()
            )],
        );
        f
    }

    /// Loads each released script (its SHA must be the one its build
    /// called, so `SCRIPT EXISTS` after that build's use says 1), then runs
    /// it by `EVALSHA` with the released build's arguments beside this
    /// build's holder of `fmt/mutex`.
    async fn old_build_calls(con: &mut redis::Connection, url: &str, write: bool) {
        let scripts = released_script();
        assert!(
            !scripts.is_empty(),
            "no released redis.lua under {:?}",
            fixtures()
        );
        for (path, text) in scripts {
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&text)
                .query(con)
                .unwrap();
            if write {
                // The released build loaded exactly this text.
                let exists: Vec<i64> = redis::cmd("SCRIPT")
                    .arg("EXISTS")
                    .arg(&sha)
                    .query(con)
                    .unwrap();
                assert_eq!(exists, vec![1], "{path} is not the script this build runs");
            }
            let call = |con: &mut redis::Connection, args: &[&str]| -> redis::Value {
                let mut c = redis::cmd("EVALSHA");
                c.arg(&sha).arg(1).arg("{tenure}:sessions").arg("{tenure}");
                for a in args {
                    c.arg(*a);
                }
                c.query(con).unwrap()
            };
            // The reply's fields as text (a bare integer is the fast path's
            // answer to a join granted at once: its seq).
            let fields = |v: &redis::Value| -> Vec<String> {
                match v {
                    redis::Value::Array(a) => a
                        .iter()
                        .map(|f| match f {
                            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                            redis::Value::SimpleString(s) => s.clone(),
                            redis::Value::Int(n) => n.to_string(),
                            other => format!("{other:?}"),
                        })
                        .collect(),
                    redis::Value::Int(n) => {
                        vec!["ok".into(), n.unsigned_abs().to_string(), "1".into()]
                    }
                    other => vec![format!("{other:?}")],
                }
            };
            call(con, &["open", OLD_SECRET, "oldtag", "30000", "old build"]);
            let queued = fields(&call(
                con,
                &[
                    "join",
                    OLD_SECRET,
                    "fmt/mutex",
                    "X",
                    "0",
                    "0",
                    "",
                    "wait",
                    "",
                ],
            ));
            assert_eq!(queued[0], "ok", "{path}: {queued:?}");
            assert_eq!(
                queued[2], "0",
                "{path}: granted beside this build's holder: {queued:?}"
            );
            let free = fields(&call(
                con,
                &["join", OLD_SECRET, "fmt/old", "X", "0", "0", "", "wait", ""],
            ));
            assert_eq!(free[2], "1", "{path}: {free:?}");
            let seq = free[1].clone();
            let store = tenure::open(url).await.unwrap();
            let mine = Session::new(&store).await.unwrap();
            let m = Mutex::new(&mine, "fmt/old").unwrap();
            assert!(
                m.try_lock().await.unwrap().is_none(),
                "{path}: the old grant unseen"
            );
            let left = call(con, &["leave", OLD_SECRET, "fmt/old", &seq, "0"]);
            assert!(!format!("{left:?}").contains("notheld"), "{path}: {left:?}");
            call(con, &["close", OLD_SECRET]);
            let g = m.try_lock().await.unwrap();
            assert!(g.is_some(), "{path}: the old release unseen");
            drop(g);
            mine.close().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn released_redis_formats_are_kept_and_answer() {
        let Some(server) = RedisServer::start_or_skip() else {
            return;
        };
        let url = server.url();
        let held = use_store(&url).await;
        let mut con = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        keep_or_compare("redis", &dump(&mut con));
        let write = std::env::var("FORMATS_WRITE").is_ok();
        old_build_calls(&mut con, &url, write).await;
        held.end().await;
    }
}

/// Redlock's nodes run the Redis script (its calls are checked above); what
/// is kept here is the keys Redlock leaves on each node.
#[cfg(feature = "redlock")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_redlock_key_shapes_are_kept() {
    let nodes: Option<Vec<tenure_testkit::RedisServer>> = (0..3)
        .map(|_| tenure_testkit::RedisServer::start_or_skip())
        .collect();
    let Some(nodes) = nodes else {
        return;
    };
    let hosts: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", port_of(&n.url())))
        .collect();
    let url = format!("redlock://{}/0", hosts.join(","));
    let held = use_store(&url).await;
    // Every node's keys together: which nodes an entry reached can vary.
    let mut all = Vec::new();
    let mut markers = Vec::new();
    for node in &nodes {
        let mut con = redis::Client::open(node.url().as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
        let mut typed = Vec::new();
        for k in &keys {
            let t: String = redis::cmd("TYPE").arg(k).query(&mut con).unwrap();
            typed.push(format!("{k} {t}"));
        }
        let marker: Option<String> = redis::cmd("GET")
            .arg("{tenure}:sessions")
            .query(&mut con)
            .unwrap();
        all.extend(typed);
        markers.push(format!(
            "{{tenure}}:sessions={}",
            marker.unwrap_or_default()
        ));
    }
    markers.sort();
    markers.dedup();
    let mut f = Format::new();
    f.insert("== keys".into(), shapes(all));
    f.insert("== rows marker".into(), markers);
    keep_or_compare("redlock", &f);
    held.end().await;
}

/// The port of a loopback URL the test kit gave.
fn port_of(url: &str) -> u16 {
    let after = url.split("127.0.0.1:").nth(1).unwrap();
    after
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_etcd_key_shapes_are_kept() {
    let Some(cluster) = tenure_testkit::EtcdCluster::start_or_skip(1) else {
        return;
    };
    let url = cluster.url();
    let held = use_store(&url).await;
    let out = std::process::Command::new("etcdctl")
        .args([
            &format!("--endpoints=http://127.0.0.1:{}", port_of(&url)),
            "get",
            "",
            "--prefix",
            "--keys-only",
        ])
        .output()
        .expect("etcdctl (Debian's etcd-client)");
    assert!(out.status.success(), "{out:?}");
    let keys = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect::<Vec<_>>();
    let mut f = Format::new();
    f.insert("== keys".into(), shapes(keys));
    keep_or_compare("etcd", &f);
    held.end().await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_zookeeper_node_shapes_are_kept() {
    let Some(ensemble) = tenure_testkit::ZkEnsemble::start_or_skip(1) else {
        return;
    };
    let url = ensemble.url();
    let held = use_store(&url).await;
    let out = std::process::Command::new("/usr/share/zookeeper/bin/zkCli.sh")
        .args([
            "-server",
            &format!("127.0.0.1:{}", port_of(&url)),
            "ls",
            "-R",
            "/",
        ])
        .output()
        .expect("zkCli.sh (Debian's zookeeper)");
    let nodes = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('/') && !l.starts_with("/zookeeper"))
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert!(!nodes.is_empty(), "{out:?}");
    let mut f = Format::new();
    f.insert("== keys".into(), shapes(nodes));
    keep_or_compare("zookeeper", &f);
    held.end().await;
}
