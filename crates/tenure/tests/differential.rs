//! Differential test: random operation sequences on the reference backend
//! (memory) and on every other store of the test kit's table must give the
//! same answers and the same grants.

use std::sync::Arc;
use std::time::Duration;

use tenure::store::{JoinMode, JoinRequest, SessionKey, SessionSpec};
use tenure::{EntryKind, Error, Name, Store};
use tenure_testkit::stores::{StoreFixture, STORES};

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

/// One test per store of the test kit's table that this build has, each
/// compared with memory, the reference.
fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let trials = STORES
        .iter()
        .filter(|store| store.backend != "memory")
        .filter(|store| store.is_built_in())
        .map(|store| {
            libtest_mimic::Trial::test(format!("memory_and_{}_agree", store.backend), || {
                compare_with_memory(store);
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

fn compare_with_memory(store: &StoreFixture) {
    assert!(
        store.differential_seeds > 0,
        "{}: the table of stores gives no differential seeds",
        store.backend
    );
    let Some(running) = (store.start)() else {
        eprintln!("SKIPPED: {}: server not installed", store.backend);
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        for seed in 1..=store.differential_seeds {
            run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 150, &running.url).await;
        }
    });
}
