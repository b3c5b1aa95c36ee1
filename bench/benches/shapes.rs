//! Where a lock cycle's cost goes on Redis and etcd: tenure's cycle beside
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
//!     SHAPES_ONLY=redis|etcd, SHAPES_TURNS (10), SHAPES_CYCLES (per row and turn: 300),
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
    let real = redis::Script::new(include_str!("../../crates/tenure/src/backend/redis.lua"));
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
    if let Ok(path) = std::env::var("BENCH_OUT") {
        std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
        println!("wrote {path}");
    }
}
