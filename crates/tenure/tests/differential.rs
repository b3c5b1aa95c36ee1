//! Differential test: random operation sequences on the reference backend
//! (memory) and on SQLite must give the same answers and the same grants.

use std::sync::Arc;
use std::time::Duration;

use tenure::store::{JoinMode, JoinRequest, SessionKey, SessionSpec};
use tenure::{EntryKind, Error, Name, Store};

/// A small deterministic generator (xorshift64*), so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const SLOTS: usize = 4;
const NAMES: [&str; 3] = ["a", "b", "x'); DROP TABLE tenure_entries; --"];
const KINDS: [EntryKind; 5] = [
    EntryKind::Exclusive,
    EntryKind::Shared,
    EntryKind::Permits { count: 1, limit: 2 },
    EntryKind::Permits { count: 2, limit: 2 },
    EntryKind::Permits { count: 1, limit: 3 },
];

fn outcome<T: std::fmt::Debug>(r: &tenure::Result<T>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(Error::NotHeld(_)) => "not held".into(),
        Err(Error::SessionLost(_)) => "session lost".into(),
        Err(Error::Conflict { .. }) => "conflict".into(),
        Err(Error::InvalidArgument { .. }) => "invalid argument".into(),
        Err(e) => format!("other error: {e}"),
    }
}

struct Side {
    store: Arc<dyn Store>,
    keys: Vec<Option<(SessionKey, String)>>,
    /// Tokens differ between backends (Redis seeds them from its clock), so
    /// each (name, token) is compared by the order it was first seen in.
    seen: std::collections::HashMap<(String, u64), usize>,
}

impl Side {
    fn norm(&mut self, name: &Name, seq: u64) -> usize {
        let next = self.seen.len();
        *self.seen.entry((name.to_string(), seq)).or_insert(next)
    }
}

impl Side {
    /// The queue with session tags replaced by slot numbers.
    async fn view(
        &mut self,
        name: &Name,
    ) -> Vec<(usize, EntryKind, Option<usize>, bool, u32, Vec<u8>)> {
        let q = self.store.queue(name).await.unwrap();
        let mut out = Vec::new();
        for e in q.entries {
            let slot = self
                .keys
                .iter()
                .position(|k| k.as_ref().is_some_and(|(_, tag)| *tag == e.session_tag));
            out.push((
                self.norm(name, e.seq),
                e.kind,
                slot,
                e.granted,
                e.holds,
                e.value,
            ));
        }
        out
    }

    /// The raw token of this slot's entry on `name`, if any.
    async fn own_seq(&mut self, name: &Name, slot: usize) -> Option<u64> {
        let q = self.store.queue(name).await.unwrap();
        let tag = self.keys[slot].as_ref().map(|(_, t)| t.clone())?;
        q.entries
            .iter()
            .find(|e| e.session_tag == tag)
            .map(|e| e.seq)
    }
}

async fn run(seed: u64, steps: usize, other_url: &str) {
    let spec = SessionSpec {
        ttl: Duration::from_secs(60),
        label: "diff".into(),
    };
    let mut sides = [
        Side {
            store: tenure::open("memory://").await.unwrap(),
            keys: vec![None; SLOTS],
            seen: Default::default(),
        },
        Side {
            store: tenure::open(other_url).await.unwrap(),
            keys: vec![None; SLOTS],
            seen: Default::default(),
        },
    ];
    // Semaphores only where the other backend has them.
    let permits = sides[1].store.capabilities().permits;
    let kinds: Vec<EntryKind> = KINDS
        .iter()
        .copied()
        .filter(|k| permits || !matches!(k, EntryKind::Permits { .. }))
        .collect();
    let mut rng = Rng(seed | 1);
    let names: Vec<Name> = NAMES
        .iter()
        .map(|n| Name::new(format!("{n}-{seed}")).unwrap())
        .collect();
    for step in 0..steps {
        let slot = rng.below(SLOTS as u64) as usize;
        let name = &names[rng.below(NAMES.len() as u64) as usize];
        let op = rng.below(10);
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let mut answers = Vec::new();
        for side in sides.iter_mut() {
            let key = side.keys[slot].as_ref().map(|(k, _)| k.clone());
            let answer = match (key, op) {
                (None, _) => {
                    let opened = side.store.open_session(&spec).await.unwrap();
                    side.keys[slot] = Some((opened.key, opened.tag));
                    "opened".to_string()
                }
                (Some(key), 0..=3) => {
                    let mode = if op == 0 {
                        JoinMode::IfGranted
                    } else {
                        JoinMode::Wait
                    };
                    match side
                        .store
                        .join(
                            &key,
                            JoinRequest {
                                name,
                                kind,
                                value: &[slot as u8],
                                mode,
                                likely_free: false,
                            },
                        )
                        .await
                    {
                        Ok(Some(j)) => format!(
                            "joined #{} granted={} holds={} first={}",
                            side.norm(name, j.seq),
                            j.granted,
                            j.holds,
                            j.first
                        ),
                        other => outcome(&other),
                    }
                }
                (Some(key), 4..=6) => {
                    // Leave this slot's entry, whatever its token, or a bogus one.
                    let seq = side.own_seq(name, slot).await.unwrap_or(9_999);
                    outcome(&side.store.leave(&key, name, seq).await)
                }
                (Some(key), 7) => {
                    let seq = side.own_seq(name, slot).await.unwrap_or(1);
                    outcome(&side.store.set_value(&key, name, seq, &[step as u8]).await)
                }
                (Some(key), _) => {
                    side.keys[slot] = None;
                    outcome(&side.store.close_session(&key).await)
                }
            };
            answers.push(answer);
        }
        if std::env::var("DIFF_TRACE").is_ok() {
            eprintln!("{}", answers[0]);
        }
        assert_eq!(
            answers[0], answers[1],
            "seed {seed} step {step}: answers differ"
        );
        for name in &names {
            let m = sides[0].view(name).await;
            let s = sides[1].view(name).await;
            assert_eq!(m, s, "seed {seed} step {step}: queues of {name} differ");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_sqlite_agree() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("diff.db").display());
    for seed in 1..=12u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 150, &url).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_agree() {
    let Some(server) = tenure_testkit::RedisServer::start_or_skip() else {
        return;
    };
    for seed in 1..=12u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 150, &server.url()).await;
    }
}

#[cfg(feature = "redlock")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redlock_agree() {
    let servers: Option<Vec<_>> = (0..3)
        .map(|_| tenure_testkit::RedisServer::start_or_skip())
        .collect();
    let Some(servers) = servers else { return };
    let url = tenure_testkit::RedisServer::redlock_url(&servers);
    for seed in 1..=8u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 150, &url).await;
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_postgres_agree() {
    let Some(server) = tenure_testkit::PostgresServer::start_or_skip() else {
        return;
    };
    for seed in 1..=8u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 150, &server.url()).await;
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_mysql_agree() {
    let Some(server) = tenure_testkit::MariaDbServer::start_or_skip() else {
        return;
    };
    for seed in 1..=8u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 150, &server.url()).await;
    }
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_etcd_agree() {
    let Some(server) = tenure_testkit::EtcdCluster::start_or_skip(1) else {
        return;
    };
    for seed in 1..=6u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 150, &server.url()).await;
    }
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_zookeeper_agree() {
    let Some(server) = tenure_testkit::ZkEnsemble::start_or_skip(1) else {
        return;
    };
    for seed in 1..=6u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 150, &server.url()).await;
    }
}

/// Every backend of the table that this build has is compared with memory
/// above: a backend added to the table without a comparison fails here.
#[test]
fn every_built_in_backend_is_compared() {
    const COMPARED: [&str; 8] = [
        "memory",
        "sqlite",
        "redis",
        "redlock",
        "postgres",
        "mysql",
        "etcd",
        "zookeeper",
    ];
    for backend in tenure::backends().iter().filter(|b| b.is_built_in()) {
        assert!(
            COMPARED.contains(&backend.name),
            "{} has no differential test",
            backend.name
        );
    }
}
