//! A worker of a run of shard owners (`--shards`): a member of the group,
//! working on each shard it is granted, handing each revoked one back.

use std::sync::Arc;
use std::time::Duration;

use tenure::{Session, SessionOptions, Shards, Store};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Mutex;

use super::options::WorkerArgs;
use super::worker::{critical_section, lost_at, read_answer, Lines};
use super::Rng;

/// The member's loop: join with a session, and for each shard granted
/// say `grant SHARD TOKEN`, read and write that shard's registers (as a
/// lock's holder does, stopping the moment the library says the session
/// is lost), then wait for its revocation and say `release SHARD` before
/// handing it back; a lost session is `lost` (every shard), and a new
/// session joins again; `term` leaves the group.
pub(super) async fn shard_loop<W>(
    store: Arc<dyn Store>,
    args: WorkerArgs,
    input: impl tokio::io::AsyncRead + Unpin,
    out: Lines<W>,
    mut term: tokio::sync::watch::Receiver<bool>,
) -> Result<u8, String>
where
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut rng = Rng::new(args.seed);
    let mut answers = BufReader::new(input).lines();
    let out = Arc::new(Mutex::new(out));
    loop {
        let opened = tokio::select! {
            s = Session::with_options(&store, SessionOptions::new().ttl(args.ttl)) => s,
            _ = term.changed() => return Ok(0),
        };
        let Ok(s) = opened else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let members = Shards::new(&s, &args.name, args.shards)
            .map_err(|e| e.to_string())?
            .grace(args.ttl);
        let joined = tokio::select! {
            j = members.join() => j,
            _ = term.changed() => {
                let _ = s.close().await;
                return Ok(0);
            }
        };
        let Ok(mut owner) = joined else {
            let _ = s.close().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut revocations = tokio::task::JoinSet::new();
        let mut last_act = 0;
        loop {
            let shard = tokio::select! {
                shard = owner.next() => shard,
                _ = term.changed() => {
                    let _ = tokio::time::timeout(args.ttl * 3, owner.leave()).await;
                    let _ = s.close().await;
                    return Ok(0);
                }
            };
            let Ok(shard) = shard else {
                out.lock()
                    .await
                    .say_at(lost_at(&s, last_act), "lost")
                    .await?;
                break;
            };
            let (index, token) = (shard.index(), shard.token());
            out.lock()
                .await
                .say(&format!("grant {index} {token}"))
                .await?;
            last_act = out
                .lock()
                .await
                .say(&format!("read {index} {token}"))
                .await?;
            let Some(value) = read_answer(&mut answers).await? else {
                return Ok(0);
            };
            let lost = critical_section(&s, &mut rng).await;
            if lost {
                out.lock()
                    .await
                    .say_at(lost_at(&s, last_act), "lost")
                    .await?;
                break;
            }
            last_act = out
                .lock()
                .await
                .say(&format!("write {index} {token} {}", value + 1))
                .await?;
            let _ = answers.next_line().await.map_err(|e| e.to_string())?;
            if s.is_lost() {
                out.lock()
                    .await
                    .say_at(lost_at(&s, last_act), "lost")
                    .await?;
                break;
            }
            // Held until revoked; the section ends (said) before the shard
            // is handed back. A shard that ends with the session is the
            // session's `lost` line's.
            let out = out.clone();
            revocations.spawn(async move {
                shard.revoked().await;
                if !shard.is_lost() {
                    let _ = out.lock().await.say(&format!("release {index}")).await;
                }
                shard.release();
            });
        }
        drop(revocations);
        drop(owner);
        let _ = tokio::time::timeout(Duration::from_secs(1), s.close()).await;
    }
}
