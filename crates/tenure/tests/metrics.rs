//! The metrics tenure records, as a recorder sees them: the series of a
//! scenario that drives every recipe, their names and labels, the name-label
//! settings, and the metrics page that lists them.
#![cfg(feature = "metrics")]
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

use tenure::metrics::*;
use tenure::{Election, Error, Mutex, Name, RwLock, Semaphore, Session, SessionOptions, Store};

/// The tests here that record, or change the name-label setting, one at
/// a time: the setting is process-wide.
static SETTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One recorded series.
#[derive(Debug)]
struct Series {
    name: String,
    kind: MetricKind,
    labels: BTreeMap<String, String>,
    unit: Option<metrics::Unit>,
    described: bool,
    value: DebugValue,
}

fn snapshot(recorder: &DebuggingRecorder) -> Vec<Series> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, description, value)| {
            let (kind, key) = key.into_parts();
            Series {
                name: key.name().to_string(),
                kind,
                labels: key
                    .labels()
                    .map(|l| (l.key().to_string(), l.value().to_string()))
                    .collect(),
                unit,
                described: description.is_some(),
                value,
            }
        })
        .collect()
}

/// The value of the one series of `name` whose labels include `labels`
/// (a counter or gauge as f64; a histogram's observation count).
fn value(all: &[Series], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<&Series> = all
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
    found.first().map(|s| match &s.value {
        DebugValue::Counter(n) => *n as f64,
        DebugValue::Gauge(g) => g.into_inner(),
        DebugValue::Histogram(h) => h.len() as f64,
    })
}

fn ten_seconds() -> SessionOptions {
    SessionOptions::new().ttl(Duration::from_secs(10))
}

/// The scenario: a lock, a contended lock, a release, a timeout, the two
/// sides of a read-write lock, a semaphore, an election, `once`, a
/// schedule's tick, an evicted session and a shard group's handover.
async fn scenario(store: &Arc<dyn Store>) -> u64 {
    let a = Session::with_options(store, ten_seconds()).await.unwrap();
    let b = Session::with_options(store, ten_seconds()).await.unwrap();
    a.renew().await.unwrap();
    let held = Mutex::new(&a, "metrics-lock")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let mb = Mutex::new(&b, "metrics-lock").unwrap();
    assert!(mb.try_lock().await.unwrap().is_none());
    assert!(matches!(
        mb.lock_timeout(Duration::from_millis(20)).await,
        Err(Error::Timeout(_))
    ));
    let waiter = tokio::spawn(async move { mb.lock().await });
    let name = Name::new("metrics-lock").unwrap();
    while store.queue(&name).await.unwrap().entries.len() < 2 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    let token = next.token();
    next.release().await.unwrap();

    let read = RwLock::new(&a, "metrics-rw").unwrap().read().await.unwrap();
    read.release().await.unwrap();
    let permit = Semaphore::new(&a, "metrics-pool", 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    permit.release().await.unwrap();

    let term = Election::new(&a, "metrics-election")
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    term.proclaim("a2").await.unwrap();
    term.resign().await.unwrap();

    let job = || async { Ok(b"done".to_vec()) };
    let ttl = Duration::from_secs(10);
    let ran = tenure::once(store, "unbounded-key-1", ttl, WhileRunning::Fail, job);
    assert!(matches!(ran.await.unwrap(), OnceOutcome::Ran(_)));
    let again = tenure::once(store, "unbounded-key-1", ttl, WhileRunning::Fail, job);
    assert!(matches!(again.await.unwrap(), OnceOutcome::Recorded(_)));

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tenure::Schedule::new(store, "metrics-cron", "* * * * * *")
        .unwrap()
        .run(
            move |_| {
                let _ = tx.send(());
                async {}
            },
            async move {
                let _ = rx.recv().await;
            },
        )
        .await
        .unwrap();

    let evicted = Mutex::new(&b, "metrics-evict")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let name = Name::new("metrics-evict").unwrap();
    assert_eq!(store.evict(&name).await.unwrap(), 1);
    assert!(matches!(b.renew().await, Err(Error::SessionLost(_))));
    drop(evicted);
    tenure_testkit::conformance::shards_scenario(store, "metrics-shards").await;
    a.close().await.unwrap();
    token
}

use tenure::{OnceOutcome, WhileRunning};

/// A lost lease ends the held and leader gauges at once, not when the
/// guard or term is dropped (which then changes nothing): no "two
/// leaders" while a stale process still holds its `Term`.
#[tokio::test]
async fn a_lost_lease_ends_the_held_and_leader_gauges() {
    let _setting = SETTING.lock().await;
    set_name_label(NameLabel::Full);
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = tenure::open("memory://").await.unwrap();
    let s = Session::with_options(&store, ten_seconds()).await.unwrap();
    let guard = Mutex::new(&s, "tied-lock").unwrap().lock().await.unwrap();
    let term = Election::new(&s, "tied-election")
        .unwrap()
        .campaign("v")
        .await
        .unwrap();
    let held = [("kind", "mutex"), ("name", "tied-lock")];
    let leader = [("name", "tied-election")];
    let all = snapshot(&recorder);
    assert_eq!(value(&all, HELD, &held), Some(1.0));
    assert_eq!(value(&all, LEADER, &leader), Some(1.0));
    assert_eq!(
        store.evict(&Name::new("tied-lock").unwrap()).await.unwrap(),
        1
    );
    assert!(matches!(s.renew().await, Err(Error::SessionLost(_))));
    // The debugging recorder's snapshots take what changed since the
    // last one (gauges start again from 0): each figure is a change.
    let all = snapshot(&recorder);
    assert_eq!(
        value(&all, HELD, &held),
        Some(-1.0),
        "held not ended by the loss"
    );
    assert_eq!(
        value(&all, LEADER, &leader),
        Some(-1.0),
        "leader not ended by the loss"
    );
    assert_eq!(value(&all, MASTER_STATUS, &leader), Some(-1.0));
    assert_eq!(value(&all, HOLD, &held), Some(1.0), "one hold time");
    drop(guard);
    drop(term);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let all = snapshot(&recorder);
    assert_eq!(value(&all, HELD, &held), Some(0.0), "ended twice");
    assert_eq!(value(&all, LEADER, &leader), Some(0.0), "ended twice");
    assert_eq!(value(&all, HOLD, &held), Some(0.0), "a second hold time");
}

#[tokio::test]
async fn the_memory_scenario_records_every_metric_with_its_labels() {
    let _setting = SETTING.lock().await;
    set_name_label(NameLabel::Full);
    let recorder = DebuggingRecorder::new();
    let all = {
        let _local = metrics::set_default_local_recorder(&recorder);
        let store = tenure::open("memory://").await.unwrap();
        let token = tokio::time::timeout(Duration::from_secs(20), scenario(&store))
            .await
            .expect("the scenario finished in time");
        // Everything dropped: background clean-up runs here, still
        // recorded locally.
        drop(store);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let all = snapshot(&recorder);
        assert_eq!(
            value(&all, FENCING_TOKEN, &[("name", "metrics-lock")]),
            Some(token as f64)
        );
        all
    };

    // Every metric of the table, with exactly its labels, its unit and
    // its description; nothing else.
    let table: BTreeMap<&str, &MetricInfo> = METRICS.iter().map(|m| (m.name, m)).collect();
    for s in &all {
        let m = table
            .get(s.name.as_str())
            .unwrap_or_else(|| panic!("{} is not in METRICS", s.name));
        let keys: BTreeSet<&str> = s.labels.keys().map(String::as_str).collect();
        let want: BTreeSet<&str> = m.labels.iter().copied().collect();
        assert_eq!(keys, want, "labels of {}", s.name);
        let kind = match m.kind {
            MetricType::Counter => MetricKind::Counter,
            MetricType::Gauge => MetricKind::Gauge,
            MetricType::Histogram => MetricKind::Histogram,
        };
        assert_eq!(s.kind, kind, "{}", s.name);
        assert!(s.described, "{} is not described", s.name);
        let unit = if m.unit == "seconds" {
            metrics::Unit::Seconds
        } else {
            metrics::Unit::Count
        };
        assert_eq!(s.unit, Some(unit), "{}", s.name);
        assert!(
            s.labels
                .values()
                .all(|v| !v.contains('@') && !v.contains("unbounded-key")),
            "a claim name or a once key became a label value: {s:?}"
        );
    }
    let recorded: BTreeSet<&str> = all.iter().map(|s| s.name.as_str()).collect();
    for m in METRICS {
        assert!(recorded.contains(m.name), "{} was not recorded", m.name);
    }

    // And the values the scenario implies.
    let lock = [("kind", "mutex"), ("name", "metrics-lock")];
    let with = |extra: (&'static str, &'static str)| {
        let mut v = lock.to_vec();
        v.push(extra);
        v
    };
    assert_eq!(
        value(&all, ACQUISITIONS, &with(("outcome", "acquired"))),
        Some(2.0)
    );
    assert_eq!(
        value(&all, ACQUISITIONS, &with(("outcome", "busy"))),
        Some(1.0)
    );
    assert_eq!(
        value(&all, ACQUISITIONS, &with(("outcome", "timeout"))),
        Some(1.0)
    );
    assert_eq!(value(&all, ACQUIRE_WAIT, &lock), Some(2.0));
    assert_eq!(value(&all, HOLD, &lock), Some(2.0));
    assert_eq!(value(&all, HELD, &lock), Some(0.0));
    assert_eq!(value(&all, WAITING, &lock), Some(0.0));
    for (kind, name) in [("read", "metrics-rw"), ("semaphore", "metrics-pool")] {
        let labels = [("kind", kind), ("name", name), ("outcome", "acquired")];
        assert_eq!(value(&all, ACQUISITIONS, &labels), Some(1.0), "{kind}");
    }
    let election = [("name", "metrics-election")];
    assert_eq!(value(&all, LEADER, &election), Some(0.0));
    assert_eq!(value(&all, MASTER_STATUS, &election), Some(0.0));
    for to in ["leader", "follower"] {
        let labels = [("name", "metrics-election"), ("to", to)];
        assert_eq!(value(&all, LEADER_TRANSITIONS, &labels), Some(1.0), "{to}");
    }
    let shards = [("name", "metrics-shards")];
    assert_eq!(value(&all, SHARDS_OWNED, &shards), Some(0.0));
    let taken = [("name", "metrics-shards"), ("side", "taken")];
    let given = [("name", "metrics-shards"), ("side", "given")];
    // Two first grants and the moved shard's, taken; the moved shard and
    // the two given back at the leaves, given.
    assert_eq!(value(&all, SHARD_HANDOVERS, &taken), Some(3.0));
    assert_eq!(value(&all, SHARD_HANDOVERS, &given), Some(3.0));
    assert_eq!(value(&all, SHARD_HANDOVER, &taken), Some(3.0));
    assert_eq!(value(&all, SHARDS_SETTLED, &shards), Some(0.0));
    assert_eq!(value(&all, ONCE, &[("outcome", "ran")]), Some(1.0));
    assert_eq!(value(&all, ONCE, &[("outcome", "recorded")]), Some(1.0));
    let cron = [("name", "metrics-cron")];
    assert_eq!(
        value(
            &all,
            CRON_TICKS,
            &[("name", "metrics-cron"), ("outcome", "succeeded")]
        ),
        Some(1.0)
    );
    assert_eq!(value(&all, CRON_RUN, &cron), Some(1.0));
    let now = chrono::Utc::now().timestamp() as f64;
    let last = value(&all, CRON_LAST_SUCCESS, &cron).unwrap();
    assert!((now - 5.0..=now + 1.0).contains(&last), "{last} vs {now}");
    assert!(value(&all, CRON_NEXT_TICK, &cron).unwrap() >= last - 1.0);
    let memory = [("backend", "memory")];
    assert_eq!(value(&all, SESSIONS_OPEN, &memory), Some(0.0));
    assert_eq!(
        value(
            &all,
            SESSIONS_LOST,
            &[("backend", "memory"), ("reason", "evicted")]
        ),
        Some(1.0)
    );
    let renewed = [("backend", "memory"), ("outcome", "ok")];
    assert!(value(&all, SESSION_RENEWALS, &renewed).unwrap() >= 1.0);
    let refused = [("backend", "memory"), ("outcome", "lost")];
    assert_eq!(value(&all, SESSION_RENEWALS, &refused), Some(1.0));
    let join = [("backend", "memory"), ("op", "join")];
    assert!(value(&all, STORE_OPERATION, &join).unwrap() >= 8.0);
    let lost = [
        ("backend", "memory"),
        ("op", "keep_alive"),
        ("kind", "session_lost"),
    ];
    assert_eq!(value(&all, STORE_ERRORS, &lost), Some(1.0));
    // Waits are not timed.
    assert!(all
        .iter()
        .all(|s| s.name != STORE_OPERATION || s.labels["op"] != "await_grant"));
}

#[tokio::test]
async fn the_name_label_can_be_cut_or_left_out() {
    let _setting = SETTING.lock().await;
    let mut seen = Vec::new();
    for setting in [NameLabel::Prefix(7), NameLabel::Off] {
        set_name_label(setting);
        let recorder = DebuggingRecorder::new();
        {
            let _local = metrics::set_default_local_recorder(&recorder);
            let store = tenure::open("memory://").await.unwrap();
            let work = async {
                let s = Session::with_options(&store, ten_seconds()).await.unwrap();
                for name in ["metrics-a", "metrics-b"] {
                    let g = Mutex::new(&s, name).unwrap().lock().await.unwrap();
                    g.release().await.unwrap();
                }
                s.close().await.unwrap();
            };
            tokio::time::timeout(Duration::from_secs(10), work)
                .await
                .expect("in time");
        }
        seen.push(snapshot(&recorder));
    }
    set_name_label(NameLabel::Full);
    let (prefix, off) = (&seen[0], &seen[1]);
    // Both names share the prefix "metrics": one series for the two.
    let acquired = [
        ("kind", "mutex"),
        ("name", "metrics"),
        ("outcome", "acquired"),
    ];
    assert_eq!(value(prefix, ACQUISITIONS, &acquired), Some(2.0));
    assert!(prefix
        .iter()
        .filter_map(|s| s.labels.get("name"))
        .all(|v| v == "metrics"));
    // Off: no name label, and no per-name token gauge.
    assert!(
        off.iter().all(|s| !s.labels.contains_key("name")),
        "{off:?}"
    );
    assert_eq!(
        value(
            off,
            ACQUISITIONS,
            &[("kind", "mutex"), ("outcome", "acquired")]
        ),
        Some(2.0)
    );
    assert!(off.iter().all(|s| s.name != FENCING_TOKEN));
}

#[tokio::test]
async fn turned_off_nothing_is_recorded() {
    let _setting = SETTING.lock().await;
    set_enabled(false);
    let recorder = DebuggingRecorder::new();
    {
        let _local = metrics::set_default_local_recorder(&recorder);
        let work = async {
            let store = tenure::open("memory://").await.unwrap();
            let s = Session::with_options(&store, ten_seconds()).await.unwrap();
            let g = Mutex::new(&s, "metrics-off").unwrap().lock().await.unwrap();
            g.release().await.unwrap();
            let term = Election::new(&s, "metrics-off-election")
                .unwrap()
                .campaign("a")
                .await
                .unwrap();
            term.resign().await.unwrap();
            s.close().await.unwrap();
        };
        tokio::time::timeout(Duration::from_secs(10), work)
            .await
            .expect("in time");
    }
    set_recording(Recording::Auto);
    let all = snapshot(&recorder);
    assert!(all.is_empty(), "{all:?}");
}

/// Auto records into a recorder that keeps series, not into `metrics`'
/// no-op (nothing timed or keyed then); On records into either.
#[tokio::test]
async fn auto_records_only_into_a_real_recorder() {
    let _setting = SETTING.lock().await;
    let recorder = DebuggingRecorder::new();
    let noop = metrics::NoopRecorder;
    assert_eq!(recording(), Recording::Auto);
    assert!(metrics::with_local_recorder(&recorder, enabled));
    assert!(!metrics::with_local_recorder(&noop, enabled));
    set_recording(Recording::On);
    assert!(metrics::with_local_recorder(&noop, enabled));
    set_recording(Recording::Off);
    assert!(!metrics::with_local_recorder(&recorder, enabled));
    set_recording(Recording::Auto);
}

#[test]
fn name_label_settings() {
    assert_eq!(NameLabel::Full.apply("jobs/report"), Some("jobs/report"));
    assert_eq!(NameLabel::Off.apply("jobs/report"), None);
    assert_eq!(NameLabel::Prefix(0).apply("jobs/report"), None);
    assert_eq!(NameLabel::Prefix(4).apply("jobs/report"), Some("jobs"));
    assert_eq!(
        NameLabel::Prefix(40).apply("jobs/report"),
        Some("jobs/report")
    );
    // Cut on characters, never inside one.
    assert_eq!(NameLabel::Prefix(2).apply("ééé"), Some("éé"));
}

#[test]
fn the_table_follows_prometheus_conventions() {
    let mut names = BTreeSet::new();
    for m in METRICS {
        assert!(names.insert(m.name), "{} twice", m.name);
        assert!(
            m.name.starts_with("tenure_") || m.name == MASTER_STATUS,
            "{}",
            m.name
        );
        assert_eq!(
            m.name.ends_with("_total"),
            m.kind == MetricType::Counter,
            "{}",
            m.name
        );
        assert_eq!(
            m.unit == "seconds",
            m.name.ends_with("_seconds"),
            "{}",
            m.name
        );
        assert!(!m.help.is_empty());
    }
}

#[test]
fn the_metrics_page_lists_every_metric() {
    let readme = include_str!("../../../docs/operations/metrics.md");
    for m in METRICS {
        assert!(
            readme.contains(&format!("`{}`", m.name)),
            "{} is not in docs/operations/metrics.md",
            m.name
        );
    }
}
