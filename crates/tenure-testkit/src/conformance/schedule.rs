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
    // does not (Redlock), a tick may be skipped, never run twice.
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
