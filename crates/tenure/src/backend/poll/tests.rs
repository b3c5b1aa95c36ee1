//! The waiting loop's own tests: stand-in first looks, announced grants,
//! and who polls when.

use std::time::Duration;

use tokio::time::Instant;

use super::listeners::UNHEARD_FOR;
use super::{
    grant_key, grant_prefix, until_granted, JoinedLook, Listeners, Listening, Look, NoStandIn,
};
use crate::error::Result;

type Looks = std::sync::Arc<std::sync::Mutex<Vec<Duration>>>;

fn waiting(next: bool) -> Look {
    Look::Wait {
        until: None,
        next,
        watch: None,
    }
}

fn still_queued() -> std::future::Ready<Result<bool>> {
    std::future::ready(Ok(true))
}

/// Waits on `listening` with nothing pushed; each look is recorded (by
/// when, from `start`) and answers from `answers` in turn, then granted.
async fn wait(
    listening: &Listening,
    first: Option<NoStandIn>,
    answers: Vec<Look>,
    start: Instant,
    looks: &Looks,
) {
    let answers = std::sync::Mutex::new(answers.into_iter());
    until_granted(
        listening,
        Duration::from_millis(5),
        Duration::from_millis(100),
        || async { false },
        |_| {
            looks.lock().unwrap().push(start.elapsed());
            let answer = answers.lock().unwrap().next().unwrap_or(Look::Granted);
            async move { Ok(answer) }
        },
        first,
    )
    .await
    .unwrap();
}

fn joined(without_push: bool) -> NoStandIn {
    let look = JoinedLook {
        at: Instant::now(),
        look: waiting(true),
        without_push: false,
    };
    let look = if without_push {
        look.without_push()
    } else {
        look
    };
    (
        look,
        still_queued as fn() -> std::future::Ready<Result<bool>>,
    )
}

#[tokio::test(start_paused = true)]
async fn a_joins_answer_stands_in_for_the_first_look_where_grants_are_heard_here() {
    for (without_push, first_look) in [(true, Duration::from_millis(5)), (false, Duration::ZERO)] {
        let listeners = Listeners::default();
        let (listening, _) = listeners.listen(grant_key("n", 7));
        let looks = Looks::default();
        let start = Instant::now();
        wait(
            &listening,
            Some(joined(without_push)),
            vec![],
            start,
            &looks,
        )
        .await;
        // Without push, only a store that hears every grant here takes
        // the answer: its waiter's first look is its first poll.
        assert_eq!(
            *looks.lock().unwrap(),
            vec![first_look],
            "without push: {without_push}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_announced_before_its_waiter_listens_is_kept_for_it() {
    let listeners = Listeners::default();
    listeners.granted(&grant_key("n", 7));
    let looks = Looks::default();
    let (other, _) = listeners.listen(grant_key("n", 8));
    let (listening, _) = listeners.listen(grant_key("n", 7));
    wait(
        &listening,
        Some(joined(true)),
        vec![],
        Instant::now(),
        &looks,
    )
    .await;
    assert!(looks.lock().unwrap().is_empty(), "looked: {looks:?}");
    // Only for its own key, and only once.
    assert!(!other.announced_granted());
    drop(listening);
    let (again, _) = listeners.listen(grant_key("n", 7));
    assert!(!again.announced_granted());
    // Nor once it is older than a join's answer may be.
    listeners.granted(&grant_key("n", 9));
    tokio::time::sleep(UNHEARD_FOR + Duration::from_millis(1)).await;
    let (late, _) = listeners.listen(grant_key("n", 9));
    assert!(!late.announced_granted());
}

/// Two waiters of one name in this process, in line (ahead, behind).
fn two_in_line() -> (Listening, Listening) {
    let listeners = Listeners::default();
    let prefix = grant_prefix("n");
    let (ahead, _) = listeners.listen(grant_key("n", 7));
    let (behind, _) = listeners.listen(grant_key("n", 8));
    (ahead.in_line(prefix.clone()), behind.in_line(prefix))
}

/// The looks of a waiter behind another of its name in this process,
/// not next, answered `waits` times "wait", when the one ahead goes at
/// `handed_over`.
async fn looks_when_handed_over(waits: usize, handed_over: Duration) -> Vec<Duration> {
    let (ahead, behind) = two_in_line();
    let looks = Looks::default();
    let start = Instant::now();
    let waiter = wait(&behind, None, vec![waiting(false); waits], start, &looks);
    let handing = async {
        tokio::time::sleep(handed_over).await;
        drop(ahead);
    };
    tokio::join!(waiter, handing);
    let looks = looks.lock().unwrap().clone();
    looks
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_comes_next_in_line_polls_from_the_shortest_interval() {
    let (_ahead, behind) = two_in_line();
    let looks = Looks::default();
    let mut answers = vec![waiting(false); 5];
    answers.extend([waiting(true), waiting(true)]);
    wait(&behind, None, answers, Instant::now(), &looks).await;
    let ms = Duration::from_millis;
    // Behind another, not polling: a look after each longest sleep.
    // Next in line at its sixth look: polls 5 ms later, then 10.
    assert_eq!(
        *looks.lock().unwrap(),
        vec![
            ms(0),
            ms(100),
            ms(200),
            ms(300),
            ms(400),
            ms(500),
            ms(505),
            ms(515)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_handed_polling_on_polls_without_a_look_at_once() {
    let ms = Duration::from_millis;
    // Looked when it came, then not at the hand-over (10 ms) but at its
    // first poll after it (10 + 5 ms), not the longest sleep (100 ms).
    assert_eq!(looks_when_handed_over(1, ms(10)).await, vec![ms(0), ms(15)]);
    // After long sleeps (not next, not first: a look after each longest
    // sleep, 100 ms, the backoff doubling up to the longest meanwhile),
    // handed polling on, it polls 5 ms later, then 10 ms after that.
    assert_eq!(
        looks_when_handed_over(6, ms(450)).await,
        vec![ms(0), ms(100), ms(200), ms(300), ms(400), ms(455), ms(465)]
    );
}
