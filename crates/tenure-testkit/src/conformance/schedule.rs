//! Conformance: Cron schedules, per tick and on the leader only.

use super::*;

/// Three instances on a one-second schedule: every tick runs exactly once.
pub async fn check_schedule_per_tick(t: &Target) {
    use tenure::{Schedule, ScheduleMode};
    let name = unique("cron");
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for instance in 0..3 {
        let schedule = Schedule::new(&t.store, &name, "* * * * * *")
            .unwrap()
            .mode(ScheduleMode::PerTick);
        let runs = runs.clone();
        tasks.push(tokio::spawn(schedule.run(
            move |tick| {
                let runs = runs.clone();
                async move { runs.lock().unwrap().push((tick.at, instance)) }
            },
            tokio::time::sleep(Duration::from_millis(3500)),
        )));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    let mut ticks: Vec<_> = runs.iter().map(|r| r.0).collect();
    ticks.sort();
    let before = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), before, "a tick ran twice: {runs:?}");
    // Every tick runs where the store tells a first claim exactly; where it
    // does not (`exact_first` false), a tick may be skipped, never run twice.
    if t.store.capabilities().exact_first {
        assert!(ticks.len() >= 2, "too few ticks ran: {runs:?}");
    }
}

/// Only the leader runs ticks; pausing it hands the schedule to another.
pub async fn check_schedule_leader(t: &Target) {
    use tenure::{Schedule, ScheduleMode};
    let name = unique("cron-leader");
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for instance in 0..2 {
        let schedule = Schedule::new(&t.store, &name, "* * * * * *")
            .unwrap()
            .mode(ScheduleMode::Leader);
        handles.push(schedule.pause_handle());
        let runs = runs.clone();
        tasks.push(tokio::spawn(schedule.run(
            move |tick| {
                let runs = runs.clone();
                async move {
                    runs.lock()
                        .unwrap()
                        .push((tick.at, instance, tick.leader_token))
                }
            },
            tokio::time::sleep(Duration::from_millis(5000)),
        )));
    }
    // Let one lead for a while, then pause whoever ran the first tick.
    let deadline = Instant::now() + Duration::from_secs(4);
    let first = loop {
        if let Some(r) = runs.lock().unwrap().first() {
            break r.1;
        }
        assert!(Instant::now() < deadline, "no tick ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    handles[first].pause();
    let paused_at = chrono::Utc::now();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    let mut ticks: Vec<_> = runs.iter().map(|r| r.0).collect();
    ticks.dedup();
    assert_eq!(ticks.len(), runs.len(), "a tick ran twice: {runs:?}");
    // Before the pause only the first leader ran; after it only the other.
    for (at, instance, token) in &runs {
        assert!(token.is_some());
        if *at < paused_at - chrono::Duration::milliseconds(1) {
            assert_eq!(*instance, first, "a follower ran a tick: {runs:?}");
        }
    }
    assert!(
        runs.iter().any(|r| r.1 != first && r.0 > paused_at),
        "nobody took over after the pause: {runs:?}"
    );
}

/// A cluster-wide pause (`ScheduleBoard`): while paused no instance runs a
/// tick; once resumed they do; the board lists the job and its last run; a
/// pause with an end lifts by itself. A store without cells refuses a pause
/// and runs schedules all the same.
pub async fn check_schedule_paused_cluster_wide(t: &Target) {
    use tenure::{Schedule, ScheduleBoard, ScheduleMode};
    let name = unique("cron-pause");
    let board = ScheduleBoard::new(&t.store, &name).unwrap();
    let cells = t.store.capabilities().cells;
    let paused = board.pause(None, "conformance", "a test").await;
    if cells {
        let p = paused.unwrap();
        assert_eq!(
            (p.by.as_str(), p.reason.as_str()),
            ("conformance", "a test")
        );
        assert_eq!(board.paused().await.unwrap(), Some(p));
    } else {
        let e = paused.unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        assert_eq!(board.paused().await.unwrap(), None);
    }
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for instance in 0..2 {
        let schedule = Schedule::new(&t.store, &name, "* * * * * *")
            .unwrap()
            .mode(ScheduleMode::PerTick);
        let runs = runs.clone();
        tasks.push(tokio::spawn(schedule.run(
            move |tick| {
                let runs = runs.clone();
                async move { runs.lock().unwrap().push((tick.at, instance)) }
            },
            tokio::time::sleep(Duration::from_millis(5500)),
        )));
    }
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let while_paused = runs.lock().unwrap().clone();
    if cells {
        assert!(
            while_paused.is_empty(),
            "ran while paused: {while_paused:?}"
        );
        assert!(board.resume().await.unwrap(), "the pause was not in force");
        assert!(!board.resume().await.unwrap(), "resumed twice");
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the schedules stopped")
            .unwrap()
            .unwrap();
    }
    let all = runs.lock().unwrap().clone();
    // Where a first claim is not exact, a tick may be skipped;
    // some still run.
    assert!(!all.is_empty(), "no tick ran after resuming");
    if t.store.capabilities().exact_first {
        assert!(all.len() >= 2, "too few ticks ran after resuming: {all:?}");
    }
    if !cells {
        assert!(ScheduleBoard::jobs(&t.store).await.unwrap().is_empty());
        return;
    }
    // The board lists the job and shows its last run.
    assert!(ScheduleBoard::jobs(&t.store).await.unwrap().contains(&name));
    let info = board.info().await.unwrap().expect("the job is described");
    assert_eq!(
        (info.job.as_str(), info.expr.as_str(), info.mode.as_str()),
        (name.as_str(), "* * * * * *", "per-tick")
    );
    assert_eq!(info.time_zone, "UTC");
    let last = info.last_run.clone().expect("the last run is recorded");
    let latest = all.iter().map(|r| r.0).max().unwrap();
    assert_eq!(
        last.tick_ms,
        latest.timestamp_millis(),
        "{last:?} vs {all:?}"
    );
    assert!(last.token > 0 && last.outcome == "finished", "{last:?}");
    assert!(
        !last.by.is_empty() && !last.session_tag.is_empty(),
        "{last:?}"
    );
    assert_eq!(info.next_ticks(chrono::Utc::now(), 3).len(), 3);

    // A pause with an end lifts by itself; one that ends in the past is refused.
    let until = chrono::Utc::now() + chrono::Duration::milliseconds(800);
    board
        .pause(Some(until), "conformance", "short")
        .await
        .unwrap();
    assert!(board.paused().await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        board.paused().await.unwrap(),
        None,
        "the pause did not lift"
    );
    let past = chrono::Utc::now() - chrono::Duration::seconds(1);
    let e = board
        .pause(Some(past), "conformance", "past")
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    board.resume().await.unwrap();
}
