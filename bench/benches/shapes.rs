//! Where a lock cycle's cost goes on Redis, etcd, PostgreSQL and MySQL: tenure's cycle beside
//! its floor and beside lighter shapes of the same operations, sent by the
//! raw client, in one run, interleaved (each turn runs every row once).
//!
//! Each row is one acquire + release on a free name. The ratio is the
//! median over turns of the row's mean cycle to the floor's in the same
//! turn; the server's CPU is read from `/proc` (schedstat) for the turn.
//! A row that drops a part says what the rest costs: the bound a design
//! without that part could reach, not a lock anyone should use.
//!
//!     cd bench && cargo bench --bench shapes
//!     SHAPES_ONLY=redis|etcd|postgres|mysql, SHAPES_TURNS (10), SHAPES_CYCLES (per row and turn: 300),
//!     SHAPES_PG_PLAN=force_generic_plan|force_custom_plan (the raw PostgreSQL client's plan_cache_mode),
//!     BENCH_OUT=path.json
mod common;

use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, GetOptions, LockOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use tenure::{Mutex, Session, SessionOptions};

/// The CPU time (ns) run so far by this bench's servers named `comm`.
fn server_cpu(comm: &str) -> u64 {
    common::server_cpu_ns(Some(comm)).unwrap_or(0)
}

#[derive(Default, Clone)]
struct Row {
    samples: Vec<Duration>,
    /// Per turn: (wall time, cycles, server CPU ns).
    turns: Vec<(Duration, usize, u64)>,
}

impl Row {
    fn mean_us(&self, turn: usize) -> f64 {
        let (wall, n, _) = self.turns[turn];
        wall.as_secs_f64() * 1e6 / n as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() % 2 {
        1 => v[mid],
        _ => (v[mid - 1] + v[mid]) / 2.0,
    }
}

fn report(store: &str, labels: &[&str], rows: &[Row], out: &mut Vec<serde_json::Value>) {
    println!("{store}:");
    println!(
        "  {:<100} {:>8} {:>9} {:>12} {:>9}",
        "row", "p50 µs", "vs floor", "server µs", "vs floor"
    );
    let cpu = |r: &Row| {
        let ns: u64 = r.turns.iter().map(|t| t.2).sum();
        let n: usize = r.turns.iter().map(|t| t.1).sum();
        ns as f64 / 1e3 / n as f64
    };
    let floor_cpu = cpu(&rows[0]);
    for (label, row) in labels.iter().zip(rows) {
        let ratio = median(
            (0..row.turns.len())
                .map(|t| row.mean_us(t) / rows[0].mean_us(t))
                .collect(),
        );
        let mut sorted = row.samples.clone();
        sorted.sort();
        let p50 = sorted[sorted.len() / 2].as_secs_f64() * 1e6;
        println!(
            "  {label:<100} {p50:>8.1} {ratio:>8.2}× {:>12.1} {:>8.2}×",
            cpu(row),
            cpu(row) / floor_cpu
        );
        out.push(serde_json::json!({
            "store": store, "row": label, "cycles": sorted.len(), "p50_us": p50,
            "vs_floor": ratio, "server_cpu_us_per_cycle": cpu(row),
            "server_cpu_vs_floor": cpu(row) / floor_cpu,
        }));
    }
}

/// Runs `rows` interleaved: every turn runs each row for `cycles` cycles.
async fn interleave<C>(
    ctx: &mut C,
    rows: usize,
    comm: &str,
    mut cycle: impl for<'a> FnMut(
        &'a mut C,
        usize,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>,
) -> Vec<Row> {
    let turns: usize = env("SHAPES_TURNS", 10);
    let cycles: usize = env("SHAPES_CYCLES", 300);
    let mut out = vec![Row::default(); rows];
    for i in 0..rows {
        for _ in 0..cycles / 10 {
            cycle(ctx, i).await;
        }
    }
    for _ in 0..turns {
        for (i, row) in out.iter_mut().enumerate() {
            let cpu = server_cpu(comm);
            let start = Instant::now();
            for _ in 0..cycles {
                let t = Instant::now();
                cycle(ctx, i).await;
                row.samples.push(t.elapsed());
            }
            row.turns.push((
                start.elapsed(),
                cycles,
                server_cpu(comm).saturating_sub(cpu),
            ));
        }
    }
    out
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// The fast path of tenure's join and release (redis.lua), with the calls a
// lighter layout could drop marked: Q the queue's sorted set, I the
// session's index of names, P the change message, C the release's bump of
// the name's version. Keys and arguments are this bench's own.
const REDIS_JOIN: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local secret, name = ARGV[1], ARGV[2]
local ekey = 's:e:' .. name
if redis.call('EXISTS', ekey) == 0 then
  if not redis.call('GET', 's:s:' .. secret) then return -1 end
  local seq = redis.call('INCR', 's:c:' .. name)
  local rec = secret .. '\tX\t1\t1\t1\t' .. now
  redis.call('HSET', ekey, seq, rec, 'o' .. secret, seq)
  --Q redis.call('ZADD', 's:q:' .. name, seq, seq)
  --I redis.call('SADD', 's:se:' .. secret, name)
  --P redis.call('PUBLISH', 's:ch:' .. name, 'changed')
  return seq
end
return 0
"#;
const REDIS_LEAVE: &str = r#"
local secret, name, seq = ARGV[1], ARGV[2], ARGV[3]
if not redis.call('GET', 's:s:' .. secret) then return -1 end
local ekey = 's:e:' .. name
--Q if redis.call('ZCARD', 's:q:' .. name) == 1 then
  local mine = redis.call('HMGET', ekey, 'o' .. secret, seq)
  local rec = mine[1] == seq and mine[2]
  if rec and string.match(rec, '^[^\t]*\t[^\t]*\t[^\t]*\t[^\t]*\t(%d+)') == '1' then
    redis.call('DEL', ekey --Q , 's:q:' .. name
    )
    --I redis.call('SREM', 's:se:' .. secret, name)
    --C if redis.call('INCR', 's:c:' .. name) == 1 then redis.call('DEL', 's:c:' .. name) end
    --P redis.call('PUBLISH', 's:ch:' .. name, 'changed')
    return 0
  end
--Q end
return -2
"#;

fn redis_shape(src: &str, parts: &str) -> redis::Script {
    let mut out = String::new();
    for line in src.lines() {
        let mut l = line.to_string();
        for part in parts.chars() {
            l = l.replace(&format!("--{part} "), "");
        }
        out.push_str(&l);
        out.push('\n');
    }
    redis::Script::new(&out)
}

/// Row 8 sends ARGV[1] = "plain": only the SET. Row 9: a non-fair lock on
/// one key, with the session check and a fencing token.
const SINGLE: &str =
    "if ARGV[1] == 'plain' then return redis.call('SET', KEYS[1], 'me', 'NX', 'PX', 30000) end
if not redis.call('GET', 's:s:sec') then return -1 end
local token = redis.call('INCR', 's:c:' .. KEYS[1])
if redis.call('SET', KEYS[1], token, 'NX', 'PX', 30000) then return token end
return 0";

struct RedisCtx {
    conn: redis::aio::MultiplexedConnection,
    mutex: Mutex,
    real: redis::Script,
    shapes: Vec<(redis::Script, redis::Script)>,
    release: redis::Script,
    single: redis::Script,
}

async fn redis_cycle(c: &mut RedisCtx, row: usize) {
    let conn = &mut c.conn;
    match row {
        0 | 8 => {
            // The floor, or (8) the same SET sent from a script.
            let mut cmd = match row {
                0 => redis::cmd("SET"),
                _ => redis::cmd("EVALSHA"),
            };
            match row {
                0 => cmd.arg("floor").arg("me").arg("NX").arg("PX").arg(30000),
                _ => cmd
                    .arg(c.single.get_hash())
                    .arg(1)
                    .arg("floor")
                    .arg("plain"),
            };
            let ok: Option<String> = cmd.query_async(conn).await.unwrap();
            assert!(ok.is_some());
            let n: i64 = c
                .release
                .key("floor")
                .arg("me")
                .invoke_async(conn)
                .await
                .unwrap();
            assert_eq!(n, 1);
        }
        1 => c.mutex.lock().await.unwrap().release().await.unwrap(),
        2 => {
            let call = |args: &[&str]| {
                let mut i = c.real.key("{bench}:sessions");
                i.arg("{bench}");
                for a in args {
                    i.arg(*a);
                }
                i
            };
            let joined: redis::Value = call(&["join", "raw", "raw", "X", "0", "0", "", "wait", ""])
                .invoke_async(conn)
                .await
                .unwrap();
            let seq = match joined {
                redis::Value::Int(n) => n.unsigned_abs().to_string(),
                other => panic!("join reply {other:?}"),
            };
            let left: redis::Value = call(&["leave", "raw", "raw", &seq])
                .invoke_async(conn)
                .await
                .unwrap();
            assert!(matches!(left, redis::Value::Int(0)), "{left:?}");
        }
        3..=7 => {
            let (join, leave) = &c.shapes[row - 3];
            let seq: i64 = join
                .arg("sec")
                .arg("shape")
                .invoke_async(conn)
                .await
                .unwrap();
            assert!(seq > 0);
            let r: i64 = leave
                .arg("sec")
                .arg("shape")
                .arg(seq)
                .invoke_async(conn)
                .await
                .unwrap();
            assert_eq!(r, 0);
        }
        _ => {
            // Non-fair, one key: session check, token, SET NX PX; the floor's release.
            let token: i64 = c
                .single
                .key("nf")
                .arg("token")
                .invoke_async(conn)
                .await
                .unwrap();
            assert!(token > 0);
            let n: i64 = c
                .release
                .key("nf")
                .arg(token)
                .invoke_async(conn)
                .await
                .unwrap();
            assert_eq!(n, 1);
        }
    }
}

async fn redis_rows(out: &mut Vec<serde_json::Value>) {
    let Some(server) = tenure_testkit::RedisServer::start() else {
        eprintln!("redis-server is not installed: no Redis rows");
        return;
    };
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("s:s:sec")
        .arg("1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let real = redis::Script::new(include_str!(
        "../../crates/tenure/src/backend/redis/redis.lua"
    ));
    let _: redis::Value = real
        .key("{bench}:sessions")
        .arg("{bench}")
        .arg("open")
        .arg("raw")
        .arg("raw")
        .arg("30000")
        .arg("raw")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    let store = tenure::open(&url).await.unwrap();
    let session = Session::with_options(&store, SessionOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let single = redis::Script::new(SINGLE);
    let mut ctx = RedisCtx {
        conn,
        mutex: Mutex::new(&session, "bench").unwrap(),
        real,
        shapes: ["", "Q", "QI", "QIP", "QIPC"]
            .iter()
            .map(|p| (redis_shape(REDIS_JOIN, p), redis_shape(REDIS_LEAVE, p)))
            .collect(),
        release: redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
        ),
        single,
    };
    // Row 8 sends the script by its hash alone.
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SINGLE)
        .query_async(&mut ctx.conn)
        .await
        .unwrap();
    let labels = [
        "floor: SET NX PX + Lua compare-and-delete",
        "tenure fair mutex (the library)",
        "tenure's script (redis.lua), raw client",
        "fair-lock fast path, minimal: clock, session check, token, entry hash (5 + 3 calls)",
        "  + the queue's sorted set (ZADD; ZCARD, and DEL of 2 keys)",
        "  + the session's index of names (SADD; SREM)",
        "  + the change message (PUBLISH; PUBLISH)",
        "  + the release's version bump (INCR): tenure's calls, 8 + 7",
        "SET NX PX sent from a script + Lua compare-and-delete",
        "non-fair on one key: session check, token (INCR), SET NX PX + compare-and-delete",
    ];
    let rows = interleave(&mut ctx, labels.len(), "redis-server", |c, i| {
        Box::pin(redis_cycle(c, i))
    })
    .await;
    report("redis", &labels, &rows, out);
    session.close().await.unwrap();
}

struct EtcdCtx {
    client: etcd_client::Client,
    mutex: Mutex,
    lease: i64,
}

const ENTRY_VALUE: &str = "X\tnonce-0123456789";

async fn etcd_cycle(c: &mut EtcdCtx, row: usize) {
    let lease = c.lease;
    let client = &mut c.client;
    let key = |s: &str| format!("s/n/bench\0{s}");
    let entry = key(&format!("q{lease:016x}"));
    let busy = key("b");
    let holds = key(&format!("h{lease:016x}"));
    let with_lease = || Some(PutOptions::new().with_lease(lease));
    let sorted = |order| {
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, order)
                .with_limit(if order == SortOrder::Descend { 2 } else { 1 }),
        )
    };
    match row {
        0 => {
            let take = Txn::new()
                .when(vec![Compare::create_revision("floor", CompareOp::Equal, 0)])
                .and_then(vec![TxnOp::put("floor", "me", with_lease())]);
            assert!(client.txn(take).await.unwrap().succeeded());
            client.delete("floor", None).await.unwrap();
        }
        1 => c.mutex.lock().await.unwrap().release().await.unwrap(),
        7 => {
            let k = client
                .lock("api", Some(LockOptions::new().with_lease(lease)))
                .await
                .unwrap();
            client.unlock(k.key().to_vec()).await.unwrap();
        }
        _ => {
            // 2: tenure's join and release transactions (etcd/mod.rs), own keys;
            // 3: without the seen key; 4: lean; 5, 6: the Lock API's shape.
            let full = row <= 3;
            let mut when = vec![Compare::create_revision(entry.clone(), CompareOp::Equal, 0)];
            if row <= 4 {
                when.insert(0, Compare::value("sk", CompareOp::Equal, "secret"));
            }
            let mut then = vec![];
            if row == 2 {
                then.push(TxnOp::get("c/bench", None));
                then.push(TxnOp::txn(
                    Txn::new()
                        .when(vec![Compare::create_revision(
                            "c/bench",
                            CompareOp::Equal,
                            0,
                        )])
                        .and_then(vec![TxnOp::put("c/bench", "", None)]),
                ));
            }
            then.push(TxnOp::put(entry.clone(), ENTRY_VALUE, with_lease()));
            match row {
                5 | 6 => then.push(TxnOp::get(key("q"), sorted(SortOrder::Ascend))),
                _ => then.push(TxnOp::get(key("q"), sorted(SortOrder::Descend))),
            }
            if full {
                then.push(TxnOp::get(key("q"), sorted(SortOrder::Ascend)));
                then.push(TxnOp::put(
                    busy.clone(),
                    format!("{lease:016x}"),
                    with_lease(),
                ));
            }
            let joined = client
                .txn(Txn::new().when(when).and_then(then))
                .await
                .unwrap();
            assert!(joined.succeeded());
            let seq = joined.header().unwrap().revision();
            if row == 6 {
                client.delete(entry, None).await.unwrap();
                return;
            }
            let mut when = vec![Compare::create_revision(
                entry.clone(),
                CompareOp::Equal,
                seq,
            )];
            if row <= 4 {
                when.insert(0, Compare::value("sk", CompareOp::Equal, "secret"));
                when.push(Compare::create_revision(holds, CompareOp::Equal, 0));
            }
            let mut then = vec![TxnOp::delete(entry, None)];
            if full {
                then.push(TxnOp::txn(
                    Txn::new()
                        .when(vec![Compare::value(
                            busy.clone(),
                            CompareOp::Equal,
                            format!("{lease:016x}"),
                        )])
                        .and_then(vec![TxnOp::delete(busy, None)]),
                ));
            }
            assert!(client
                .txn(Txn::new().when(when).and_then(then))
                .await
                .unwrap()
                .succeeded());
        }
    }
}

async fn etcd_rows(out: &mut Vec<serde_json::Value>) {
    let Some(etcd) = tenure_testkit::EtcdCluster::start_or_skip(1) else {
        eprintln!("etcd is not installed: no etcd rows");
        return;
    };
    let url = etcd.url();
    let store = tenure::open(&url).await.unwrap();
    let session = Session::with_options(&store, SessionOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let endpoint = format!("http://{}", url.trim_start_matches("etcd://"));
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    // Long enough for the whole run without a keep-alive.
    let lease = client.lease_grant(3600, None).await.unwrap().id();
    client.put("sk", "secret", None).await.unwrap();
    let mut ctx = EtcdCtx {
        client,
        mutex: Mutex::new(&session, "bench").unwrap(),
        lease,
    };
    let labels = [
        "floor: txn put-if-absent (on a lease) + delete",
        "tenure fair mutex (the library)",
        "tenure's join and release transactions, raw client",
        "  without the name's seen key (read + put-if-absent)",
        "lean: secret compare, entry, entry ahead; release compares secret, entry, holds",
        "the Lock API's shape: put-if-absent + head; release a txn comparing the create revision",
        "the Lock API's shape: put-if-absent + head; release a plain delete",
        "etcd's Lock API (server-side lock + unlock)",
    ];
    let rows = interleave(&mut ctx, labels.len(), "etcd", |c, i| {
        Box::pin(etcd_cycle(c, i))
    })
    .await;
    report("etcd", &labels, &rows, out);
    session.close().await.unwrap();
}

// PostgreSQL: tenure's take of a free name and release of a lone holder (one
// `UPDATE` each, postgres.rs), and lighter statements on the same row of
// tenure's own `names` table, with a session row of this bench's own.
const PG_SCHEMA: &str = "tenure";
const PG_SECRET: &str = "rawsecret";
const PG_NAME: &str = "raw";

struct PgCtx {
    client: tokio_postgres::Client,
    mutex: Mutex,
    floor: (tokio_postgres::Statement, tokio_postgres::Statement),
    /// Per row from 2: the take (secret, name, kind, count, limit, value;
    /// answers the token second) and the release (secret, name, token).
    shapes: Vec<(tokio_postgres::Statement, tokio_postgres::Statement)>,
}

async fn pg_cycle(c: &mut PgCtx, row: usize) {
    match row {
        0 => {
            c.client
                .execute(&c.floor.0, &[&"floor", &"me"])
                .await
                .unwrap();
            c.client
                .execute(&c.floor.1, &[&"floor", &"me"])
                .await
                .unwrap();
        }
        1 => c.mutex.lock().await.unwrap().release().await.unwrap(),
        _ => {
            let (take, release) = &c.shapes[row - 2];
            let value: &[u8] = b"";
            let taken = c
                .client
                .query_one(take, &[&PG_SECRET, &PG_NAME, &0i16, &0i32, &0i32, &value])
                .await
                .unwrap();
            let token: i64 = taken.get(1);
            let n = c
                .client
                .execute(release, &[&PG_SECRET, &PG_NAME, &token])
                .await
                .unwrap();
            assert_eq!(n, 1, "row {row}: released");
        }
    }
}

/// `sql` with `from` replaced by `to`, which must be there.
fn without(sql: &str, from: &str, to: &str) -> String {
    assert!(sql.contains(from), "{from:?} is not in {sql}");
    sql.replace(from, to)
}

async fn pg_rows(out: &mut Vec<serde_json::Value>) {
    use tokio_postgres::types::Type;
    let Some(server) = tenure_testkit::PostgresServer::start_or_skip() else {
        eprintln!("PostgreSQL is not installed: no PostgreSQL rows");
        return;
    };
    let url = server.url();
    // Creates tenure's schema.
    let store = tenure::open(&url).await.unwrap();
    let session = Session::with_options(&store, SessionOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS floor_locks (name text PRIMARY KEY, owner text NOT NULL, expires timestamptz NOT NULL);
             INSERT INTO {PG_SCHEMA}.sessions (id, tag, label, ttl_ms, expires_ms)
                 VALUES ('{PG_SECRET}', 'raw', 'raw', 3600000, 9000000000000000);
             INSERT INTO {PG_SCHEMA}.names (name, last_seq, version, queued) VALUES ('{PG_NAME}', 0, 0, false);"
        ))
        .await
        .unwrap();
    let floor = (
        client
            .prepare("INSERT INTO floor_locks VALUES ($1, $2, now() + interval '30 seconds')")
            .await
            .unwrap(),
        client
            .prepare("DELETE FROM floor_locks WHERE name = $1 AND owner = $2")
            .await
            .unwrap(),
    );
    if let Some(mode) = std::env::var("SHAPES_PG_PLAN")
        .ok()
        .filter(|v| !v.is_empty())
    {
        client
            .batch_execute(&format!("SET plan_cache_mode = {mode}"))
            .await
            .unwrap();
    }
    let (join, leave) = tenure::backend::postgres::fast_statements(PG_SCHEMA);
    let notify = ", pg_notify('tenure_change', n.name)";
    let (join_quiet, leave_quiet) = (without(&join, notify, ""), without(&leave, notify, ""));
    let key_share = " FOR KEY SHARE SKIP LOCKED";
    let for_update = "\n       FOR UPDATE SKIP LOCKED";
    let join_unshared = without(&join_quiet, key_share, "");
    let unlocked = (
        without(&join_unshared, for_update, ""),
        without(&leave_quiet, for_update, ""),
    );
    let live = format!(
        "EXISTS (SELECT 1 FROM {PG_SCHEMA}.sessions s WHERE s.id = $1 AND s.expires_ms > 0)"
    );
    let holder = "h_kind = $3, h_count = $4, h_lim = $5, h_value = $6,
               h_granted_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint";
    let one_update = |session: &str| {
        (
            format!(
                "UPDATE {PG_SCHEMA}.names n
                    SET last_seq = n.last_seq + 1, version = n.version + 1, h_seq = n.last_seq + 1,
                        h_session = $1, {holder}
                  WHERE n.name = $2 AND n.h_session IS NULL AND NOT n.queued {session}
                 RETURNING 'ok'::text, n.last_seq"
            ),
            format!(
                "UPDATE {PG_SCHEMA}.names n
                    SET version = n.version + 1, h_seq = NULL, h_session = NULL, h_value = NULL
                  WHERE n.name = $2 AND n.h_seq = $3 AND n.h_session = $1 {session}"
            ),
        )
    };
    let minimal = (
        format!(
            "UPDATE {PG_SCHEMA}.names SET last_seq = last_seq + 1, h_seq = last_seq + 1, h_session = $1
              WHERE name = $2 AND h_session IS NULL RETURNING 'ok'::text, last_seq"
        ),
        format!(
            "UPDATE {PG_SCHEMA}.names SET h_seq = NULL, h_session = NULL
              WHERE name = $2 AND h_seq = $3 AND h_session = $1"
        ),
    );
    let take_types = [
        Type::TEXT,
        Type::TEXT,
        Type::INT2,
        Type::INT4,
        Type::INT4,
        Type::BYTEA,
    ];
    let release_types = [Type::TEXT, Type::TEXT, Type::INT8];
    let mut shapes = Vec::new();
    for (take, release) in [
        (join, leave),
        (join_quiet, leave_quiet.clone()),
        (join_unshared, leave_quiet),
        unlocked,
        one_update(&format!("AND {live}")),
        one_update(""),
        minimal,
    ] {
        shapes.push((
            client.prepare_typed(&take, &take_types).await.unwrap(),
            client
                .prepare_typed(&release, &release_types)
                .await
                .unwrap(),
        ));
    }
    let mut ctx = PgCtx {
        client,
        mutex: Mutex::new(&session, "bench").unwrap(),
        floor,
        shapes,
    };
    let labels = [
        "floor: INSERT + DELETE",
        "tenure fair mutex (the library)",
        "tenure's take and release statements, raw client",
        "  without the change notification (pg_notify)",
        "  + without the session row's lock (FOR KEY SHARE SKIP LOCKED)",
        "  + without the name row's lock (FOR UPDATE SKIP LOCKED): no lock taken ahead",
        "  + without the CTEs: one UPDATE each, the session read in its WHERE",
        "  + without the session read: the holder's columns and the token",
        "token and holder only: UPDATE of 3 columns; release clears 2",
    ];
    let rows = interleave(&mut ctx, labels.len(), "postgres", |c, i| {
        Box::pin(pg_cycle(c, i))
    })
    .await;
    report("postgres", &labels, &rows, out);
    session.close().await.unwrap();
}

// MySQL/MariaDB: the same, on tenure's `tenure_names` table.
const MY_PREFIX: &str = "tenure_";
const MY_SECRET: &str = "rawsecret00000000000000000000000";
const MY_NAME: &str = "raw";

struct MyCtx {
    conn: mysql_async::Conn,
    /// A pool set as tenure's is (no reset when a connection goes back).
    pool: mysql_async::Pool,
    mutex: Mutex,
    /// Per row from 2: the take and the release, which parameters they
    /// take, and whether each statement takes its connection from the pool
    /// (as the library does) rather than using one held connection.
    shapes: Vec<(String, String, MyParams, bool)>,
}

#[derive(Clone, Copy)]
enum MyParams {
    /// Take: secret, kind, count, limit, value, name, secret (the session
    /// read's); release: name, token, secret, secret. The token comes back
    /// as the last-insert id.
    Full,
    /// As `Full` without the session read's secrets.
    Unread,
    /// Take: secret, name; release: name, token, secret.
    Minimal,
}

/// Runs `sql` with `params` and answers (rows changed, last-insert id).
async fn my_exec(
    conn: &mut mysql_async::Conn,
    sql: &str,
    params: mysql_async::Params,
) -> (u64, Option<u64>) {
    use mysql_async::prelude::Queryable;
    conn.exec_drop(sql, params).await.unwrap();
    (conn.affected_rows(), conn.last_insert_id())
}

async fn my_cycle(c: &mut MyCtx, row: usize) {
    use mysql_async::prelude::Queryable;
    if row == 0 {
        c.conn
            .exec_drop(
                "INSERT INTO floor_locks VALUES (?, ?, NOW(3) + INTERVAL 30 SECOND)",
                ("floor", "me"),
            )
            .await
            .unwrap();
        c.conn
            .exec_drop(
                "DELETE FROM floor_locks WHERE name = ? AND owner = ?",
                ("floor", "me"),
            )
            .await
            .unwrap();
        return;
    }
    if row == 1 {
        return c.mutex.lock().await.unwrap().release().await.unwrap();
    }
    let (take, release, params, pooled) = &c.shapes[row - 2];
    let value: &[u8] = b"";
    let take_params: mysql_async::Params = match params {
        MyParams::Full => (MY_SECRET, 0i16, 0i32, 0i32, value, MY_NAME, MY_SECRET).into(),
        MyParams::Unread => (MY_SECRET, 0i16, 0i32, 0i32, value, MY_NAME).into(),
        MyParams::Minimal => (MY_SECRET, MY_NAME).into(),
    };
    let (changed, token) = if *pooled {
        my_exec(&mut c.pool.get_conn().await.unwrap(), take, take_params).await
    } else {
        my_exec(&mut c.conn, take, take_params).await
    };
    assert_eq!(changed, 1, "row {row}: taken");
    let token = token.unwrap();
    let release_params: mysql_async::Params = match params {
        MyParams::Full => (MY_NAME, token, MY_SECRET, MY_SECRET).into(),
        _ => (MY_NAME, token, MY_SECRET).into(),
    };
    let (changed, _) = if *pooled {
        my_exec(
            &mut c.pool.get_conn().await.unwrap(),
            release,
            release_params,
        )
        .await
    } else {
        my_exec(&mut c.conn, release, release_params).await
    };
    assert_eq!(changed, 1, "row {row}: released");
}

async fn my_rows(out: &mut Vec<serde_json::Value>) {
    use mysql_async::prelude::Queryable;
    let Some(server) = tenure_testkit::MariaDbServer::start_or_skip() else {
        eprintln!("MariaDB is not installed: no MySQL rows");
        return;
    };
    let url = server.url();
    let store = tenure::open(&url).await.unwrap();
    let session = Session::with_options(&store, SessionOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let opts = mysql_async::Opts::from_url(&url).unwrap();
    let pool_opts = opts.pool_opts().clone().with_reset_connection(false);
    let pool =
        mysql_async::Pool::new(mysql_async::OptsBuilder::from_opts(opts).pool_opts(pool_opts));
    let mut conn = pool.get_conn().await.unwrap();
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS floor_locks (name VARCHAR(64) PRIMARY KEY, owner VARCHAR(64) NOT NULL, expires DATETIME(3) NOT NULL) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    conn.query_drop(format!(
        "INSERT INTO {MY_PREFIX}sessions (id, tag, label, ttl_ms, expires_ms)
             VALUES ('{MY_SECRET}', 'raw', 'raw', 3600000, 9000000000000000)"
    ))
    .await
    .unwrap();
    conn.query_drop(format!(
        "INSERT INTO {MY_PREFIX}names (name, last_seq, version, queued) VALUES ('{MY_NAME}', 0, 0, 0)"
    ))
    .await
    .unwrap();
    let (join, leave) = tenure::backend::mysql::fast_statements(MY_PREFIX);
    let share = " LOCK IN SHARE MODE";
    let plain = (without(&join, share, ""), without(&leave, share, ""));
    let session_read =
        format!("\n    AND (SELECT s.expires_ms FROM {MY_PREFIX}sessions s WHERE s.id = ?) > 0");
    let unread = (
        without(&plain.0, &session_read, ""),
        without(&plain.1, &session_read, ""),
    );
    let minimal = (
        format!(
            "UPDATE {MY_PREFIX}names SET last_seq = LAST_INSERT_ID(last_seq + 1), h_seq = LAST_INSERT_ID(), h_session = ?
              WHERE name = ? AND h_session IS NULL"
        ),
        format!(
            "UPDATE {MY_PREFIX}names SET h_seq = NULL, h_session = NULL
              WHERE name = ? AND h_seq = ? AND h_session = ?"
        ),
    );
    let mut ctx = MyCtx {
        conn,
        mutex: Mutex::new(&session, "bench").unwrap(),
        pool: pool.clone(),
        shapes: vec![
            (join.clone(), leave.clone(), MyParams::Full, true),
            (join, leave, MyParams::Full, false),
            (plain.0, plain.1, MyParams::Full, false),
            (unread.0, unread.1, MyParams::Unread, false),
            (minimal.0, minimal.1, MyParams::Minimal, false),
        ],
    };
    let labels = [
        "floor: INSERT + DELETE",
        "tenure fair mutex (the library)",
        "tenure's take and release statements, raw client, a pooled connection per statement",
        "tenure's take and release statements, raw client, one held connection",
        "  without the session row's shared lock (LOCK IN SHARE MODE)",
        "  + without the session read: the holder's columns and the token",
        "token and holder only: UPDATE of 3 columns; release clears 2",
    ];
    let rows = interleave(&mut ctx, labels.len(), "mariadbd", |c, i| {
        Box::pin(my_cycle(c, i))
    })
    .await;
    report("mysql", &labels, &rows, out);
    session.close().await.unwrap();
    drop(ctx);
    pool.disconnect().await.unwrap();
}

#[tokio::main]
async fn main() {
    let only = std::env::var("SHAPES_ONLY").unwrap_or_default();
    let mut out = vec![];
    if only.is_empty() || only == "redis" {
        redis_rows(&mut out).await;
    }
    if only.is_empty() || only == "etcd" {
        etcd_rows(&mut out).await;
    }
    if only.is_empty() || only == "postgres" {
        pg_rows(&mut out).await;
    }
    if only.is_empty() || only == "mysql" {
        my_rows(&mut out).await;
    }
    if let Ok(path) = std::env::var("BENCH_OUT") {
        std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
        println!("wrote {path}");
    }
}
