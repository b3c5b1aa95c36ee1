//! Conformance: group membership and shard ownership.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tenure::{Group, ShardOwner, Shards};

use super::*;

/// How long a group takes to see a change on this store, at most, beyond
/// what a check waits for on its own: a poll's longest interval where the
/// store polls, and scheduling on a loaded machine.
fn change_latency(t: &Target) -> Duration {
    let poll = match t.store.capabilities().wake {
        tenure::store::Wake::LocalOrPoll { max, .. } => max,
        tenure::store::Wake::PubSub { .. } | tenure::store::Wake::NextOnly => Duration::ZERO,
        _ => Duration::from_secs(1),
    };
    Duration::from_millis(500) + poll
}

/// Waits (bounded by `within`) until every owner is settled and together
/// they own each shard exactly once; returns each owner's shards.
async fn settled(owners: &mut [&mut ShardOwner], shards: u32, within: Duration) -> Vec<Vec<u32>> {
    let deadline = Instant::now() + within;
    loop {
        let all: Vec<_> = owners.iter().map(|o| o.status()).collect();
        let owned: Vec<u32> = all.iter().flat_map(|s| s.owned.iter().copied()).collect();
        let distinct: BTreeSet<u32> = owned.iter().copied().collect();
        if all.iter().all(|s| s.settled)
            && owned.len() == shards as usize
            && distinct.len() == owned.len()
        {
            return all.into_iter().map(|s| s.owned).collect();
        }
        assert!(
            Instant::now() < deadline,
            "the group did not settle within {within:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the store can keep groups (shared entries); one that cannot
/// must refuse a group, typed, for a member as for shards: checked here,
/// and the caller's check ends.
async fn refuses_groups(t: &Target) -> bool {
    if t.store.capabilities().shared {
        return false;
    }
    let s = session(&t.store).await;
    let name = unique("no-groups");
    let group = Group::new(&t.store, &name).unwrap();
    let err = group.join(&s, "v").await.unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    let err = Shards::new(&s, &name, 4).unwrap().join().await.unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    s.close().await.unwrap();
    eprintln!(
        "{}: no shared entries (capabilities): groups and shards are Unsupported",
        t.store.capabilities().backend
    );
    true
}

async fn ttl_session(store: &Arc<dyn Store>, ttl: Duration) -> Session {
    Session::with_options(store, SessionOptions::new().ttl(ttl))
        .await
        .expect("open session")
}

/// Members join with values, are listed in the order they joined, and a
/// watch sees every join and leave, a closed session's included.
pub async fn check_shards_group_membership(t: &Target) {
    if refuses_groups(t).await {
        return;
    }
    let name = unique("group");
    let group = Group::new(&t.store, &name).unwrap();
    let mut watch = group.watch();
    assert!(watch.next().await.unwrap().is_empty());
    let a = session(&t.store).await;
    let b = session(&t.store).await;
    let ma = group.join(&a, "10.0.0.1:80").await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch saw the join")
        .unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].value, b"10.0.0.1:80");
    assert_eq!(seen[0].id, ma.id());
    assert_eq!(seen[0].session_tag, a.tag());
    let mb = group.join(&b, "10.0.0.2:80").await.unwrap();
    let mut seen = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch saw the second join")
        .unwrap();
    // A watch may merge changes, never skip the latest.
    if seen.len() < 2 {
        seen = watch.next().await.unwrap();
    }
    let values: Vec<&[u8]> = seen.iter().map(|m| m.value.as_slice()).collect();
    assert_eq!(values, [&b"10.0.0.1:80"[..], b"10.0.0.2:80"]);
    assert!(mb.id() > ma.id());
    assert_eq!(group.members().await.unwrap(), seen);
    ma.leave().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch saw the leave")
        .unwrap();
    assert_eq!(seen.iter().map(|m| m.id).collect::<Vec<_>>(), [mb.id()]);
    // A member whose session ends leaves with it.
    b.close().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch saw the session end")
        .unwrap();
    assert!(seen.is_empty(), "{seen:?}");
    drop(mb);
    a.close().await.unwrap();
}

/// A member whose process dies without a word (its session never closed,
/// never renewed) is seen by a group's watch within a dead holder's bound
/// (its TTL and a renew interval) and the store's change latency: gone from the list, or, where a watcher confirms
/// expiry, listed as lapsed; the live member stays listed, not lapsed.
pub async fn check_shards_group_dead_member_seen(t: &Target) {
    if refuses_groups(t).await {
        return;
    }
    let ttl = short_ttl(t, Duration::from_millis(1000));
    let name = unique("group-dead");
    let group = Group::new(&t.store, &name).unwrap();
    let live = session(&t.store).await;
    let kept = group.join(&live, "live").await.unwrap();
    let spec = SessionSpec {
        ttl,
        label: "dies".into(),
    };
    let dead = t.store.open_session(&spec).await.unwrap();
    let died = Instant::now();
    // A member's entry as every build writes it (`m1 WEIGHT SHARDS`).
    t.store
        .join(
            &dead.key,
            request(group.members_name(), EntryKind::Shared, b"m1 1 0\ndead"),
        )
        .await
        .unwrap()
        .unwrap();
    let mut watch = group.watch();
    // A dead holder's bound: its TTL and a renew interval (a store ends a
    // lease in its own time: etcd checks its leases twice a second), and
    // the store's change latency.
    let bound = ttl + ttl / 3 + change_latency(t);
    let seen = tokio::time::timeout(bound + Duration::from_secs(20), async {
        loop {
            let members = watch.next().await.unwrap();
            let dead_listed = members.iter().find(|m| m.value == b"dead");
            if dead_listed.is_none_or(|m| m.lapsed) {
                return members;
            }
        }
    })
    .await
    .expect("the watch never saw the dead member go");
    let took = died.elapsed();
    eprintln!(
        "a dead member seen gone or lapsed {took:?} after it died (bound {bound:?}): {seen:?}"
    );
    assert!(
        took <= bound,
        "seen {took:?} after the death; the bound is {bound:?}"
    );
    let alive: Vec<_> = seen.iter().filter(|m| !m.lapsed).collect();
    assert_eq!(alive.len(), 1, "{seen:?}");
    assert_eq!(alive[0].id, kept.id());
    if !t.store.capabilities().watched_expiry {
        assert_eq!(
            seen.len(),
            1,
            "a store that ends leases itself drops the member: {seen:?}"
        );
    }
    kept.leave().await.unwrap();
    live.close().await.unwrap();
}

/// Members that give another shard count than the group's are refused.
pub async fn check_shards_refuse_another_count(t: &Target) {
    if refuses_groups(t).await {
        return;
    }
    let name = unique("shards-count");
    let a = session(&t.store).await;
    let b = session(&t.store).await;
    let owner = Shards::new(&a, &name, 4).unwrap().join().await.unwrap();
    let err = Shards::new(&b, &name, 8).unwrap().join().await.unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
    assert!(Shards::new(&b, &name, 0).is_err());
    assert!(Shards::new(&b, &name, 65_537).is_err());
    owner.leave().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Balanced and sticky: 3 members own 16 shards 5/5/6; a fourth joins and
/// the group settles at 4 each, moving few shards; one leaves and the
/// other three take its shards only.
pub async fn check_shards_balanced_and_sticky(t: &Target) {
    if refuses_groups(t).await {
        return;
    }
    let name = unique("shards-balance");
    let within = Duration::from_secs(15);
    let grace = Duration::from_millis(200);
    let join = |s: Session| {
        let name = name.clone();
        async move {
            let owner = Shards::new(&s, &name, 16)
                .unwrap()
                .grace(grace)
                .join()
                .await
                .unwrap();
            (owner, s)
        }
    };
    let mut sessions = Vec::new();
    let mut owners = Vec::new();
    for _ in 0..3 {
        let (owner, s) = join(session(&t.store).await).await;
        owners.push(owner);
        sessions.push(s);
    }
    let by_member = |owners: &[ShardOwner], map: &[Vec<u32>]| -> BTreeMap<u32, u64> {
        owners
            .iter()
            .zip(map)
            .flat_map(|(o, shards)| shards.iter().map(|&s| (s, o.member_id())))
            .collect()
    };
    let map = settled(&mut owners.iter_mut().collect::<Vec<_>>(), 16, within).await;
    let mut sizes: Vec<usize> = map.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [5, 5, 6], "{map:?}");
    let before = by_member(&owners, &map);
    // A fourth joins.
    let (owner, s) = join(session(&t.store).await).await;
    owners.push(owner);
    sessions.push(s);
    let map = settled(&mut owners.iter_mut().collect::<Vec<_>>(), 16, within).await;
    assert!(map.iter().all(|m| m.len() == 4), "{map:?}");
    let after = by_member(&owners, &map);
    let moved = before.iter().filter(|(s, m)| after[s] != **m).count();
    eprintln!("16 shards, 3 members: a join moved {moved} shards");
    // The four the newcomer must take, and at most a few more.
    assert!((4..=8).contains(&moved), "a join moved {moved} shards");
    // The first leaves: only its shards move.
    let gone = owners.remove(0);
    let gone_id = gone.member_id();
    gone.leave().await.unwrap();
    let map = settled(&mut owners.iter_mut().collect::<Vec<_>>(), 16, within).await;
    let mut sizes: Vec<usize> = map.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [5, 5, 6], "{map:?}");
    let last = by_member(&owners, &map);
    let moved = after.iter().filter(|(s, m)| last[s] != **m).count();
    let had = after.values().filter(|m| **m == gone_id).count();
    eprintln!("16 shards, 4 members: a leave moved {moved} shards ({had} were the leaver's)");
    assert!(
        moved >= had && moved <= had * 2,
        "a leave moved {moved} shards"
    );
    for o in owners {
        o.leave().await.unwrap();
    }
    for s in sessions {
        s.close().await.unwrap();
    }
}

/// What every worker of the churn check shares: who holds each shard now,
/// by the workers' own account, and the last token seen per shard.
#[derive(Default)]
struct Ledger {
    holder: HashMap<u32, u64>,
    last_token: HashMap<u32, u64>,
    grants: usize,
    violations: Vec<String>,
}

/// Runs a member's shards as a user would: each granted shard is "worked"
/// until revoked; the ledger says whether two ever held one shard at once
/// and whether tokens rose per shard. Told to stop, the member leaves the
/// group gracefully.
fn work(
    mut owner: ShardOwner,
    ledger: Arc<std::sync::Mutex<Ledger>>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let member = owner.member_id();
    let (stop_tx, mut stop) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        loop {
            let shard = tokio::select! {
                shard = owner.next() => shard,
                _ = &mut stop => break,
            };
            let Ok(shard) = shard else { return };
            {
                let mut l = ledger.lock().unwrap();
                l.grants += 1;
                let index = shard.index();
                if let Some(other) = l.holder.insert(index, member) {
                    l.violations.push(format!(
                        "shard {index} granted to {member} while {other} held it"
                    ));
                }
                let last = l.last_token.insert(index, shard.token()).unwrap_or(0);
                if shard.token() <= last {
                    l.violations.push(format!(
                        "shard {index}: token {} after {last}",
                        shard.token()
                    ));
                }
            }
            let ledger = ledger.clone();
            tokio::spawn(async move {
                shard.revoked().await;
                let mut l = ledger.lock().unwrap();
                if l.holder.get(&shard.index()) == Some(&member) {
                    l.holder.remove(&shard.index());
                }
                drop(l);
                // Done: released now, before the grace.
                shard.release();
            });
        }
        owner.leave().await.unwrap();
    });
    (stop_tx, task)
}

/// At most one owner per shard, tokens rising per shard, under churn:
/// members join and leave (gracefully, each revoked shard handed back by
/// its worker) while the others work; at the end every shard has one
/// owner.
pub async fn check_shards_one_owner_under_churn(t: &Target) {
    if refuses_groups(t).await {
        return;
    }
    let name = unique("shards-churn");
    let shards = 24;
    let ledger = Arc::new(std::sync::Mutex::new(Ledger::default()));
    let join = |s: &Session| {
        let s = s.clone();
        let name = name.clone();
        async move {
            Shards::new(&s, &name, shards)
                .unwrap()
                .grace(Duration::from_secs(10))
                .join()
                .await
                .unwrap()
        }
    };
    let mut running = Vec::new();
    for _ in 0..3 {
        let s = session(&t.store).await;
        running.push((work(join(&s).await, ledger.clone()), s));
    }
    // Six changes, 300 ms apart: join, leave, join, leave, join, leave.
    let mut leaving = Vec::new();
    for step in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if step % 2 == 0 {
            let s = session(&t.store).await;
            running.push((work(join(&s).await, ledger.clone()), s));
        } else {
            let ((stop, task), s) = running.remove(0);
            let _ = stop.send(());
            leaving.push((task, s));
        }
    }
    for (task, s) in leaving {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("a member left within its grace")
            .unwrap();
        s.close().await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let owned = ledger.lock().unwrap().holder.len();
        if owned == shards as usize {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {owned} of {shards} shards were owned again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (violations, grants) = {
        let l = ledger.lock().unwrap();
        (l.violations.clone(), l.grants)
    };
    assert!(violations.is_empty(), "{violations:?}");
    assert!(grants > shards as usize, "{grants} grants");
    eprintln!("{grants} grants of {shards} shards under churn");
    for ((stop, task), s) in running {
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("a member left")
            .unwrap();
        s.close().await.unwrap();
    }
}

/// A member that dies silently (the raw contract: it never renews, leaves
/// or closes) while it holds every shard: the live members own every shard
/// within its TTL, a renew interval and the change latency of its death
/// (where a watcher confirms expiry, a TTL more: they watch it for its
/// TTL first).
pub async fn check_shards_dead_member_reassigned_in_bound(t: &Target) {
    if refuses_groups(t).await {
        return;
    }
    let ttl = short_ttl(t, Duration::from_millis(1000));
    let renew = ttl / 3;
    let name = unique("shards-dead");
    let shards = 8;
    let spec = SessionSpec {
        ttl,
        label: "dies".into(),
    };
    let dead = t.store.open_session(&spec).await.unwrap();
    let died = Instant::now();
    // Its member entry as every build writes it (`m1 WEIGHT SHARDS`), and
    // every shard.
    let members = Name::new(format!("{}{name}", tenure::GROUP_PREFIX)).unwrap();
    let value = format!("m1 1 {shards}\n");
    t.store
        .join(
            &dead.key,
            request(&members, EntryKind::Shared, value.as_bytes()),
        )
        .await
        .unwrap()
        .unwrap();
    for i in 0..shards {
        let shard = Name::new(format!("{}{name}/{i}", tenure::SHARD_PREFIX)).unwrap();
        let joined = t
            .store
            .join(&dead.key, request(&shard, EntryKind::Exclusive, b""))
            .await
            .unwrap()
            .unwrap();
        assert!(joined.granted);
    }
    let a = ttl_session(&t.store, ttl).await;
    let b = ttl_session(&t.store, ttl).await;
    let mut oa = Shards::new(&a, &name, shards)
        .unwrap()
        .join()
        .await
        .unwrap();
    let mut ob = Shards::new(&b, &name, shards)
        .unwrap()
        .join()
        .await
        .unwrap();
    let mut bound = ttl + renew + change_latency(t);
    if t.store.capabilities().watched_expiry {
        bound += ttl + ttl / 100 + Duration::from_millis(10);
    }
    let map = settled(
        &mut [&mut oa, &mut ob],
        shards,
        bound + Duration::from_secs(20),
    )
    .await;
    let took = died.elapsed();
    eprintln!(
        "a dead member's shards owned again {took:?} after it died (bound {bound:?}): {map:?}"
    );
    assert!(
        took <= bound,
        "owned again {took:?} after the death; the bound is {bound:?}"
    );
    oa.leave().await.unwrap();
    ob.leave().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A member that stops renewing (a paused process) loses its shards —
/// [`Shard::lost`](tenure::Shard::lost) resolves — before another member is
/// granted any of them, and the new grants carry higher tokens.
pub async fn check_shards_paused_member_loses_first(t: &Target) {
    if refuses_groups(t).await {
        return;
    }
    let ttl = short_ttl(t, Duration::from_millis(1000));
    let name = unique("shards-paused");
    let shards = 4;
    let a = crashing_session(&t.store, ttl).await;
    let mut oa = Shards::new(&a, &name, shards)
        .unwrap()
        .grace(Duration::from_millis(100))
        .join()
        .await
        .unwrap();
    // Alone, it owns all four; each one's loss is timed.
    let mut lost = Vec::new();
    for _ in 0..shards {
        let shard = tokio::time::timeout(ttl, oa.next())
            .await
            .expect("the lone member owned every shard")
            .unwrap();
        let (index, token) = (shard.index(), shard.token());
        lost.push(tokio::spawn(async move {
            shard.lost().await;
            (index, token, Instant::now())
        }));
    }
    let b = session(&t.store).await;
    let mut ob = Shards::new(&b, &name, shards)
        .unwrap()
        .join()
        .await
        .unwrap();
    let mut granted = BTreeMap::new();
    let limit = ttl * 3 + change_latency(t) + Duration::from_secs(10);
    while granted.len() < shards as usize {
        let shard = tokio::time::timeout(limit, ob.next())
            .await
            .expect("the live member owned every shard")
            .unwrap();
        granted.insert(shard.index(), (shard.token(), Instant::now()));
    }
    for told in lost {
        let (index, token, at) = told.await.unwrap();
        let (new_token, granted_at) = granted[&index];
        assert!(
            at < granted_at,
            "shard {index}: granted elsewhere before its paused owner was told"
        );
        assert!(
            new_token > token,
            "shard {index}: token {new_token} after {token}"
        );
    }
    assert!(
        oa.next().await.is_err(),
        "the paused member's session is lost"
    );
    ob.leave().await.unwrap();
    b.close().await.unwrap();
}

/// A member owns both shards of the group `group`, a second joins and one
/// shard moves to it (a handover on each side), both settle, both leave:
/// what every shard metric records (the metrics scenarios' shards step).
pub async fn shards_scenario(store: &Arc<dyn Store>, group: &str) {
    let within = Duration::from_secs(20);
    let a = session(store).await;
    let b = session(store).await;
    let mut first = Shards::new(&a, group, 2).unwrap().join().await.unwrap();
    for _ in 0..2 {
        // Dropped at once: the work on it is over, so a revocation
        // releases it without waiting for the grace.
        drop(
            tokio::time::timeout(within, first.next())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    settled(&mut [&mut first], 2, within).await;
    let mut second = Shards::new(&b, group, 2).unwrap().join().await.unwrap();
    drop(
        tokio::time::timeout(within, second.next())
            .await
            .unwrap()
            .unwrap(),
    );
    let map = settled(&mut [&mut first, &mut second], 2, within).await;
    assert_eq!(map.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1]);
    first.leave().await.unwrap();
    second.leave().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
