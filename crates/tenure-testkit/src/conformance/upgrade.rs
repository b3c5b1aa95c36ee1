//! Conformance: what a rolling upgrade reads from the store — every
//! session not yet ended, with the build and format that opened it.

use super::*;

/// A session lists itself with this build's release and the store's format
/// from the moment it opens, and is gone from the list once closed; the
/// other sessions of the store stay listed.
pub async fn check_session_builds(t: &Target) {
    let backend = t.store.capabilities().backend;
    let format = tenure::backends()
        .iter()
        .find(|b| b.name == backend)
        .and_then(|b| b.format())
        .unwrap_or("");
    let a = Session::new(&t.store).await.unwrap();
    let b = Session::new(&t.store).await.unwrap();
    let listed = match t.store.session_builds().await {
        // A store of your own may keep no builds; tenure's own all do.
        Err(Error::Unsupported { .. }) if !tenure::backends().iter().any(|b| b.name == backend) => {
            eprintln!("{backend}: sessions' builds are not listed (Unsupported)");
            return;
        }
        other => other.unwrap(),
    };
    for s in [&a, &b] {
        let mine = listed
            .iter()
            .find(|l| l.tag == s.tag())
            .unwrap_or_else(|| panic!("{backend}: session {} not listed: {listed:?}", s.tag()));
        let build = mine.build.as_ref().expect("a build recorded");
        assert_eq!(build.release, env!("CARGO_PKG_VERSION"), "{mine:?}");
        assert_eq!(build.format, format, "{mine:?}");
        assert_eq!(mine.label, s.label(), "{mine:?}");
    }
    a.close().await.unwrap();
    let listed = t.store.session_builds().await.unwrap();
    assert!(
        !listed.iter().any(|l| l.tag == a.tag()),
        "{backend}: a closed session is still listed: {listed:?}"
    );
    assert!(listed.iter().any(|l| l.tag == b.tag()), "{listed:?}");
    b.close().await.unwrap();
}

/// With every session of this build, an upgrade finishes (and finishing
/// again changes nothing more); the store then opens and grants as before,
/// to a new connection too.
pub async fn check_upgrade_finish(t: &Target) {
    let backend = t.store.capabilities().backend;
    let a = Session::new(&t.store).await.unwrap();
    let finished = match tenure::upgrade::finish(&t.store).await {
        Err(Error::Unsupported { .. }) if !tenure::backends().iter().any(|b| b.name == backend) => {
            eprintln!("{backend}: upgrades are not finished here (Unsupported)");
            a.close().await.unwrap();
            return;
        }
        other => other.unwrap(),
    };
    assert_eq!(
        finished.format,
        tenure::upgrade::this_format(t.store.as_ref())
    );
    tenure::upgrade::finish(&t.store).await.unwrap();
    // A new connection (the in-process store has no other).
    let again = if t.store.capabilities().multi_process {
        tenure::open(&t.url).await.unwrap()
    } else {
        t.store.clone()
    };
    let b = Session::new(&again).await.unwrap();
    let name = unique("finished");
    let g = Mutex::new(&b, &name).unwrap().lock().await.unwrap();
    assert!(Mutex::new(&a, &name)
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .is_none());
    g.release().await.unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Sessions open and close while builds are listed and the upgrade is
/// finished: no session of this build is ever taken for an older one (an
/// upgrade is not refused for it, nor is its record lost), and every
/// session kept open is listed with its build at the end.
pub async fn check_upgrade_finish_while_sessions_open(t: &Target) {
    const OPENERS: usize = 3;
    const EACH: usize = 12;
    let backend = t.store.capabilities().backend;
    if !tenure::backends().iter().any(|b| b.name == backend) {
        eprintln!("{backend}: a store of your own; the upgrade checks above say what it keeps");
        return;
    }
    let done = Arc::new(AtomicUsize::new(0));
    let mut openers = Vec::new();
    for _ in 0..OPENERS {
        let (store, done) = (t.store.clone(), done.clone());
        openers.push(tokio::spawn(async move {
            // Every other session is kept to the end, the rest closed at once.
            let mut kept = Vec::new();
            for i in 0..EACH {
                let s = Session::new(&store).await.unwrap();
                if i % 2 == 0 {
                    kept.push(s);
                } else {
                    s.close().await.unwrap();
                }
            }
            done.fetch_add(1, Ordering::SeqCst);
            kept
        }));
    }
    // Bounded: the openers end after OPENERS × EACH sessions, or the
    // deadline fails the check.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut looks = 0;
    while done.load(Ordering::SeqCst) < OPENERS || looks < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "openers did not finish in 60 s"
        );
        t.store.session_builds().await.unwrap();
        let finished = tenure::upgrade::finish(&t.store).await;
        assert!(
            finished.is_ok(),
            "{backend}: finishing refused while only this build opens sessions: {finished:?}"
        );
        looks += 1;
    }
    let mut kept = Vec::new();
    for opener in openers {
        kept.extend(opener.await.unwrap());
    }
    let listed = t.store.session_builds().await.unwrap();
    for s in &kept {
        let mine = listed
            .iter()
            .find(|l| l.tag == s.tag())
            .unwrap_or_else(|| panic!("{backend}: session {} not listed", s.tag()));
        assert!(
            mine.build.is_some(),
            "{backend}: a session of this build lost its build record: {mine:?}"
        );
    }
    tenure::upgrade::finish(&t.store).await.unwrap();
    for s in kept {
        s.close().await.unwrap();
    }
    eprintln!(
        "{backend}: {looks} looks while {} sessions opened",
        OPENERS * EACH
    );
}
