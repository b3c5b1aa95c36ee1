//! Differential test: random operation sequences on the reference backend
//! (memory) and on SQLite must give the same answers and the same grants.

use std::sync::Arc;
use std::time::Duration;

use tenure::{EntryKind, Error, JoinMode, Name, SessionKey, SessionSpec, Store};

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
}

impl Side {
    /// The queue with session tags replaced by slot numbers.
    async fn view(&self, name: &Name) -> Vec<(u64, EntryKind, Option<usize>, bool, u32, Vec<u8>)> {
        let q = self.store.queue(name).await.unwrap();
        q.entries
            .into_iter()
            .map(|e| {
                let slot = self
                    .keys
                    .iter()
                    .position(|k| k.as_ref().is_some_and(|(_, tag)| *tag == e.session_tag));
                (e.seq, e.kind, slot, e.granted, e.holds, e.value)
            })
            .collect()
    }
}

async fn run(seed: u64, steps: usize, sqlite_url: &str) {
    let spec = SessionSpec {
        ttl: Duration::from_secs(60),
        label: "diff".into(),
    };
    let mut sides = [
        Side {
            store: tenure::open("memory://").await.unwrap(),
            keys: vec![None; SLOTS],
        },
        Side {
            store: tenure::open(sqlite_url).await.unwrap(),
            keys: vec![None; SLOTS],
        },
    ];
    let mut rng = Rng(seed | 1);
    let names: Vec<Name> = NAMES
        .iter()
        .map(|n| Name::new(format!("{n}-{seed}")).unwrap())
        .collect();
    for step in 0..steps {
        let slot = rng.below(SLOTS as u64) as usize;
        let name = &names[rng.below(NAMES.len() as u64) as usize];
        let op = rng.below(10);
        let kind = KINDS[rng.below(KINDS.len() as u64) as usize];
        let mut answers = Vec::new();
        for side in sides.iter_mut() {
            let answer = match (&side.keys[slot], op) {
                (None, _) => {
                    let opened = side.store.open_session(&spec).await.unwrap();
                    side.keys[slot] = Some((opened.key, opened.tag));
                    "opened".to_string()
                }
                (Some((key, _)), 0..=3) => {
                    let mode = if op == 0 {
                        JoinMode::IfGranted
                    } else {
                        JoinMode::Wait
                    };
                    outcome(&side.store.join(key, name, kind, &[slot as u8], mode).await)
                }
                (Some((key, _)), 4..=6) => {
                    // Leave this slot's entry, whatever its seq, or a bogus one.
                    let view = side.view(name).await;
                    let seq = view
                        .iter()
                        .find(|e| e.2 == Some(slot))
                        .map(|e| e.0)
                        .unwrap_or(9_999);
                    outcome(&side.store.leave(key, name, seq).await)
                }
                (Some((key, _)), 7) => {
                    let view = side.view(name).await;
                    let seq = view
                        .iter()
                        .find(|e| e.2 == Some(slot))
                        .map(|e| e.0)
                        .unwrap_or(1);
                    outcome(&side.store.set_value(key, name, seq, &[step as u8]).await)
                }
                (Some((key, _)), _) => {
                    let key = key.clone();
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
            let (m, s) = (sides[0].view(name).await, sides[1].view(name).await);
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
