//! Conformance: a recipe's future dropped at any point leaves nothing
//! behind and blocks nothing.

use super::*;
use tenure::{Election, RwLock, Semaphore};

/// One way to ask for a name.
#[derive(Debug, Clone, Copy)]
enum Ask {
    Fair,
    Unfair,
    Write,
    Read,
    Permit,
    Campaign,
}

const ASKS: [Ask; 6] = [
    Ask::Fair,
    Ask::Unfair,
    Ask::Write,
    Ask::Read,
    Ask::Permit,
    Ask::Campaign,
];

/// What an ask gave: something to give back.
enum Held {
    Mutex(MutexGuard),
    Write(tenure::RwLockWriteGuard),
    Read(tenure::RwLockReadGuard),
    Permit(tenure::SemaphorePermit),
    Term(tenure::Term),
}

impl Held {
    async fn give_back(self) -> tenure::Result<()> {
        match self {
            Held::Mutex(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Permit(p) => p.release().await,
            Held::Term(t) => t.resign().await,
        }
    }
}

/// Asks for `name` in the way `ask` says, for `session`.
async fn ask(ask: Ask, session: &Session, name: &str, permits: u32) -> tenure::Result<Held> {
    Ok(match ask {
        Ask::Fair => Held::Mutex(Mutex::new(session, name)?.lock().await?),
        Ask::Unfair => Held::Mutex(Mutex::new(session, name)?.fair(false).lock().await?),
        Ask::Write => Held::Write(RwLock::new(session, name)?.write().await?),
        Ask::Read => Held::Read(RwLock::new(session, name)?.read().await?),
        Ask::Permit => Held::Permit(Semaphore::new(session, name, permits)?.acquire().await?),
        Ask::Campaign => Held::Term(Election::new(session, name)?.campaign("x").await?),
    })
}

/// Every recipe's wait (fair and non-fair mutex, write and read lock,
/// semaphore permit, campaign), dropped at a point picked at random — before
/// the store answered, while waiting behind a holder, as the holder lets go,
/// after the grant — many times: the same session then asks for the same
/// name at once and is served as if the dropped call never happened (granted
/// once the name is free, no error, no deadlock), and its one entry is the
/// only one left; once given back, the queue is empty.
pub async fn check_dropped_anywhere_leaves_nothing(t: &Target) {
    const ROUNDS: u64 = 36;
    let caps = t.store.capabilities().clone();
    let permits = 2;
    let started = Instant::now();
    // A small fixed-seed generator: the same points on every run.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let (asker, holder) = (session(&t.store).await, session(&t.store).await);
    for round in 0..ROUNDS {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{ROUNDS} rounds took over 2 minutes"
        );
        let how = ASKS[(round % ASKS.len() as u64) as usize];
        let unsupported = match how {
            Ask::Read | Ask::Write => !caps.shared,
            Ask::Permit => !caps.permits,
            _ => false,
        };
        if unsupported {
            continue;
        }
        let name = unique("dropped");
        // Half the rounds wait behind a holder, which lets go at a point of
        // its own, before or after the drop.
        let held = if next(2) == 0 {
            Some(ask(Ask::Fair, &holder, &name, permits).await.unwrap())
        } else {
            None
        };
        let drop_after = Duration::from_millis(next(40));
        let let_go_after = Duration::from_millis(next(40));
        let letting_go = async {
            tokio::time::sleep(let_go_after).await;
            if let Some(held) = held {
                held.give_back().await.unwrap();
            }
        };
        let dropped = async {
            let _ = tokio::time::timeout(drop_after, ask(how, &asker, &name, permits)).await;
        };
        tokio::join!(letting_go, dropped);
        let again = tokio::time::timeout(Duration::from_secs(10), ask(how, &asker, &name, permits))
            .await
            .unwrap_or_else(|_| {
                panic!("round {round} ({how:?}, dropped after {drop_after:?}): not granted again")
            })
            .unwrap_or_else(|e| {
                panic!("round {round} ({how:?}, dropped after {drop_after:?}): asked again: {e:?}")
            });
        let n = Name::new(&name).unwrap();
        let queue = t.store.queue(&n).await.unwrap();
        assert_eq!(
            queue.entries.len(),
            1,
            "round {round} ({how:?}, dropped after {drop_after:?}): {queue:?}"
        );
        assert_eq!(
            queue.entries[0].holds, 1,
            "round {round} ({how:?}): {queue:?}"
        );
        again.give_back().await.unwrap();
        wait_queue_len(&t.store, &name, 0).await;
    }
}
