//! Conformance: The idempotency guard (`tenure::once`).

use super::*;

pub async fn check_once(t: &Target) {
    use tenure::{once, JobError, OnceOutcome, WhileRunning};
    let key = unique("once");
    let runs = Arc::new(AtomicUsize::new(0));
    let ttl = Duration::from_secs(10);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (store, key, runs) = (t.store.clone(), key.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            once(
                &store,
                &key,
                ttl,
                WhileRunning::Wait(Duration::from_secs(10)),
                || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok(b"result".to_vec())
                },
            )
            .await
            .unwrap()
        }));
    }
    let mut ran = 0;
    for task in tasks {
        match task.await.unwrap() {
            OnceOutcome::Ran(r) => {
                ran += 1;
                assert_eq!(r, b"result");
            }
            OnceOutcome::Recorded(r) => assert_eq!(r, b"result"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((ran, runs.load(Ordering::SeqCst)), (1, 1));

    // A duplicate that will not wait is told the job is in progress.
    let busy = unique("once-busy");
    let (store, k) = (t.store.clone(), busy.clone());
    let first = tokio::spawn(async move {
        once(&store, &k, ttl, WhileRunning::Fail, || async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(vec![])
        })
        .await
    });
    wait_queue_len(&t.store, &format!("once/{busy}"), 1).await;
    let dup = once(&t.store, &busy, ttl, WhileRunning::Fail, || async {
        Ok(vec![])
    })
    .await;
    assert!(matches!(dup, Err(Error::InProgress(_))), "{dup:?}");
    assert_eq!(first.await.unwrap().unwrap(), OnceOutcome::Ran(vec![]));

    // A retryable failure is not recorded; a final one is.
    let k = unique("once-fail");
    let r = once(&t.store, &k, ttl, WhileRunning::Fail, || async {
        Err(JobError::Retryable("later".into()))
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Retry("later".into()));
    let r = once(&t.store, &k, ttl, WhileRunning::Fail, || async {
        Err(JobError::Final("no".into()))
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Failed("no".into()));
    let r = once(&t.store, &k, ttl, WhileRunning::Fail, || async {
        Ok(vec![1])
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Failed("no".into()));

    // The record lives its TTL after the job, then the job may run again.
    let k = unique("once-ttl");
    let short = short_ttl(t, Duration::from_millis(300));
    let r = once(&t.store, &k, short, WhileRunning::Fail, || async {
        Ok(vec![1])
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Ran(vec![1]));
    let r = once(&t.store, &k, short, WhileRunning::Fail, || async {
        Ok(vec![2])
    })
    .await;
    assert_eq!(r.unwrap(), OnceOutcome::Recorded(vec![1]));
    // After the TTL the record goes (by the store's clock, which may act a
    // little late: a store may revoke expired leases in rounds).
    tokio::time::sleep(short).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = once(&t.store, &k, short, WhileRunning::Fail, || async {
            Ok(vec![3])
        })
        .await;
        match r.unwrap() {
            OnceOutcome::Ran(v) => {
                assert_eq!(v, vec![3]);
                break;
            }
            OnceOutcome::Recorded(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("the record outlived its TTL by 3 s: {other:?}"),
        }
    }
}
