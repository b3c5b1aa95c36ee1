//! Conformance: one scenario records the same metrics — names and label
//! keys — on every backend as on `memory://`, the reference.
//!
//! Metrics are recorded by the recipes and one store wrapper only, so this
//! holds by construction; the check keeps it so.
//!
//! Isolation: the recorder is process-wide by default and checks run in
//! parallel, so each run of the scenario gets a thread of its own with a
//! current-thread runtime and a debugging recorder set as that thread's
//! local recorder (`metrics::set_default_local_recorder`). The store is
//! opened again from the target's URL inside that runtime, so everything the
//! scenario does — its spawned tasks, keep-alives and background clean-up
//! included — runs on that thread and records there, and nothing another
//! check does can. The check verifies the isolation too: every `backend`
//! label names the backend under test, and every `name` label starts with
//! the scenario's own unique prefix.

use super::*;

use std::collections::{BTreeMap, BTreeSet};

use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

/// One recorded series: its metric's name and its labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Series {
    metric: String,
    labels: BTreeMap<String, String>,
}

/// A metric's name and its sorted label keys: what must not differ between
/// backends.
type Shape = BTreeSet<(String, Vec<String>)>;

fn shape(series: &[Series]) -> Shape {
    series
        .iter()
        .map(|s| (s.metric.clone(), s.labels.keys().cloned().collect()))
        .collect()
}

/// Runs the scenario on a store opened from `url` on a thread of its own
/// (see the module's doc) and returns what it recorded.
async fn record(url: String, prefix: String) -> Vec<Series> {
    let thread = std::thread::spawn(move || {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        {
            let _local = ::metrics::set_default_local_recorder(&recorder);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the scenario");
            runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(60), scenario(&url, &prefix))
                    .await
                    .unwrap_or_else(|_| panic!("the metrics scenario on {url} took over 60 s"));
                // Let background clean-up (releases, closes) finish here.
                tokio::time::sleep(Duration::from_millis(50)).await;
            });
            // The runtime goes first, while the recorder is still set.
            drop(runtime);
        }
        series(&snapshotter)
    });
    // Wait without blocking this runtime; a panic in the scenario is this
    // check's panic.
    match tokio::task::spawn_blocking(move || thread.join())
        .await
        .expect("join the scenario's thread")
    {
        Ok(series) => series,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn series(snapshotter: &Snapshotter) -> Vec<Series> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, _)| {
            let key = key.key();
            Series {
                metric: key.name().to_string(),
                labels: key
                    .labels()
                    .map(|l| (l.key().to_string(), l.value().to_string()))
                    .collect(),
            }
        })
        .collect()
}

/// The scenario: a lock taken, tried, timed out on and waited for; an
/// election; `once` twice; a schedule's tick; an evicted session; a shard
/// group's handover.
async fn scenario(url: &str, prefix: &str) {
    let store = tenure::open(url).await.expect("open the store");
    let ttl = Duration::from_secs(10).max(store.capabilities().min_ttl);
    let options = || SessionOptions::new().ttl(ttl);
    let a = Session::with_options(&store, options()).await.unwrap();
    let b = Session::with_options(&store, options()).await.unwrap();
    a.renew().await.expect("a renewal");

    // A lock, contended: busy, a timeout, then a waiter granted on release.
    let lock = format!("{prefix}/lock");
    let held = Mutex::new(&a, &lock).unwrap().lock().await.unwrap();
    let mb = Mutex::new(&b, &lock).unwrap();
    assert!(mb.try_lock().await.unwrap().is_none(), "the lock is held");
    let timed_out = mb.lock_timeout(Duration::from_millis(50)).await;
    assert!(matches!(timed_out, Err(Error::Timeout(_))), "{timed_out:?}");
    let waiter = tokio::spawn(async move { mb.lock().await });
    let name = Name::new(&lock).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.queue(&name).await.unwrap().entries.len() < 2 {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    next.release().await.unwrap();

    // An election.
    let term = Election::new(&a, format!("{prefix}/election"))
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    term.proclaim("a2").await.unwrap();
    term.resign().await.unwrap();

    // `once`, run and then recorded.
    {
        use tenure::{once, OnceOutcome, WhileRunning};
        let key = format!("{prefix}/once");
        let job = || async { Ok(b"done".to_vec()) };
        let first = once(&store, &key, ttl, WhileRunning::Fail, job).await;
        assert!(matches!(first, Ok(OnceOutcome::Ran(_))), "{first:?}");
        let again = once(&store, &key, ttl, WhileRunning::Fail, job).await;
        assert!(matches!(again, Ok(OnceOutcome::Recorded(_))), "{again:?}");
    }

    // One tick of a schedule, run by its only instance.
    {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let schedule = tenure::Schedule::new(&store, format!("{prefix}/cron"), "* * * * * *")
            .unwrap()
            .session_options(options());
        let ran = Arc::new(AtomicUsize::new(0));
        let counted = ran.clone();
        schedule
            .run(
                move |_| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = tx.send(());
                    async {}
                },
                async move {
                    let _ = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
                },
            )
            .await
            .unwrap();
        assert!(ran.load(Ordering::SeqCst) >= 1, "no tick ran in 5 s");
    }

    // An evicted holder: its next renewal is refused.
    let c = Session::with_options(&store, options()).await.unwrap();
    let evicted = format!("{prefix}/evict");
    let guard = Mutex::new(&c, &evicted).unwrap().lock().await.unwrap();
    let ended = store.evict(&Name::new(&evicted).unwrap()).await.unwrap();
    assert_eq!(ended, 1, "evict ended {ended} sessions");
    if c.renew().await.is_ok() {
        // Not refused yet: the background renewal will be.
        tokio::time::timeout(c.renew_interval() + Duration::from_secs(5), c.lost())
            .await
            .expect("the evicted session learnt of it");
    }
    drop(guard);

    // A shard group: a handover each way, a member that settles (on a
    // store with shared entries; others refuse groups).
    if store.capabilities().shared {
        super::shards_scenario(&store, &format!("{prefix}/shards")).await;
    }

    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// The scenario records the same metric names with the same label keys on
/// this backend as on `memory://`, and all of tenure's metrics.
pub async fn check_metrics_same_as_memory(t: &Target) {
    let backend = t.store.capabilities().backend;
    let prefix = unique("metrics");
    let reference_prefix = format!("{prefix}-reference");
    let theirs = record(t.url.clone(), prefix.clone()).await;
    let reference = record("memory://".into(), reference_prefix.clone()).await;

    // Isolated: only this scenario's series were recorded.
    for (series, backend, prefix) in [
        (&theirs, backend, &prefix),
        (&reference, "memory", &reference_prefix),
    ] {
        for s in series {
            if let Some(b) = s.labels.get("backend") {
                assert_eq!(b, backend, "another backend's series leaked in: {s:?}");
            }
            if let Some(n) = s.labels.get("name") {
                assert!(
                    n.starts_with(prefix.as_str()),
                    "a series of another check leaked in: {s:?}"
                );
                assert!(!n.contains('@'), "a tick's claim name is a label: {s:?}");
            }
        }
    }

    let (theirs, reference) = (shape(&theirs), shape(&reference));
    let every: BTreeSet<&str> = tenure::metrics::METRICS.iter().map(|m| m.name).collect();
    let recorded: BTreeSet<&str> = reference.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(
        recorded, every,
        "the scenario on memory:// records every metric"
    );
    // A store without shared entries refuses groups: no shard metrics.
    let refused = |m: &String| !t.store.capabilities().shared && m.starts_with("tenure_shard");
    let missing: Vec<_> = reference
        .difference(&theirs)
        .filter(|(m, _)| !refused(m))
        .collect();
    let extra: Vec<_> = theirs.difference(&reference).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{backend} records other metrics than memory://: missing {missing:?}, extra {extra:?}"
    );
}
