//! etcd beyond the conformance suite (`tests/conformance.rs`): clusters,
//! faults and `?layout=etcd`, against real etcd servers the kit starts.
#![cfg(feature = "etcd")]

use std::sync::OnceLock;

use tenure_testkit::EtcdCluster;

/// One single-member cluster for the whole test binary.
fn shared() -> Option<&'static EtcdCluster> {
    static SERVER: OnceLock<Option<EtcdCluster>> = OnceLock::new();
    SERVER
        .get_or_init(|| EtcdCluster::start_or_skip(1))
        .as_ref()
}

#[tokio::test]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let Some(server) = EtcdCluster::start_or_skip(1) else {
        return;
    };
    server.enable_auth("right-one");
    let hosts = server.url().trim_start_matches("etcd://").to_string();
    let e = tenure::open(&format!("etcd://root:hunter2@{hosts}"))
        .await
        .unwrap_err();
    assert!(matches!(e, tenure::Error::Auth { .. }), "{e:?}");
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
    let store = tenure::open(&format!("etcd://root:right-one@{hosts}"))
        .await
        .unwrap();
    let s = tenure::Session::new(&store).await.unwrap();
    let g = tenure::Mutex::new(&s, "auth")
        .unwrap()
        .lock()
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// 64 waiters on one mutex: each release wakes exactly one of them (each
/// waiter watches only the entry just ahead of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_thundering_herd() {
    let Some(server) = shared() else { return };
    let etcd = tenure::backend::etcd::EtcdStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(etcd.clone());
    tenure_testkit::conformance::check_no_thundering_herd(&store, || etcd.wakeups(), 1, 0).await;
    // And in calls to etcd: the release, then the next waiter's mark (the
    // first waiter behind the holder, granted at once and so unmarked,
    // reads its queue too; a waiter that reopens its watch adds one).
    tenure_testkit::conformance::check_no_thundering_herd(&store, || etcd.calls(), 4, 0).await;
}

/// A run of handoffs down a queue of 16 exclusive waiters: each waiter is
/// told by the watch event that the entry just ahead left granted, so only
/// the first (behind a holder granted at once, hence unmarked) reads its
/// queue; the grants still come in order with increasing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoffs_read_no_queue() {
    let Some(server) = shared() else { return };
    let etcd = tenure::backend::etcd::EtcdStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(etcd.clone());
    const WAITERS: usize = 16;
    let name = format!("marked-{}", std::process::id());
    let holder = tenure::Session::new(&store).await.unwrap();
    let held = tenure::Mutex::new(&holder, &name)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sessions = Vec::new();
    for i in 0..WAITERS {
        let s = tenure::Session::new(&store).await.unwrap();
        sessions.push(s.clone());
        let (tx, waiting_on) = (tx.clone(), name.clone());
        tokio::spawn(async move {
            let g = tenure::Mutex::new(&s, &waiting_on).unwrap().lock().await;
            let token = g.as_ref().map(|g| g.token()).map_err(|e| e.to_string());
            if let Ok(g) = g {
                let _ = g.release().await;
            }
            let _ = tx.send((i, token));
        });
        // Join one at a time, so the queue's order is the spawn order.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while store
            .queue(&tenure::Name::new(&name).unwrap())
            .await
            .unwrap()
            .entries
            .len()
            < i + 2
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "waiter {i} never joined"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    // Every waiter has looked once and watches the entry just ahead.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before = etcd.queue_looks();
    let first = held.token();
    held.release().await.unwrap();
    let mut last = first;
    for want in 0..WAITERS {
        let (i, token) = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("the next waiter was granted in time")
            .unwrap();
        let token = token.expect("granted");
        assert_eq!(i, want, "granted out of order");
        assert!(token > last, "tokens not increasing: {token} after {last}");
        last = token;
    }
    let looks = etcd.queue_looks() - before;
    assert!(
        looks <= 1,
        "{WAITERS} handoffs read the queue {looks} times (only the first may)"
    );
    for s in sessions.into_iter().chain([holder]) {
        let _ = s.close().await;
    }
}

/// The busy key that refuses an exclusive try-lock in one key's read never
/// outlives the entry that wrote it: after a waiter gives up, after a
/// handoff, and after a reentrant hold, a try-lock on the freed name wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_key_goes_with_its_entry() {
    let Some(server) = shared() else { return };
    let etcd = tenure::backend::etcd::EtcdStore::open(&server.url())
        .await
        .unwrap();
    let store: std::sync::Arc<dyn tenure::Store> = std::sync::Arc::new(etcd.clone());
    let name = format!("busy-{}", std::process::id());
    let (a, w, probe) = (
        tenure::Session::new(&store).await.unwrap(),
        tenure::Session::new(&store).await.unwrap(),
        tenure::Session::new(&store).await.unwrap(),
    );
    let try_probe = || async {
        let before = etcd.calls();
        let got = tenure::Mutex::new(&probe, &name)
            .unwrap()
            .try_lock()
            .await
            .unwrap();
        (got, etcd.calls() - before)
    };
    // A waiter that gives up (the busy key was its own).
    let held = tenure::Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let (got, calls) = try_probe().await;
    assert!(got.is_none(), "a held name was granted");
    assert_eq!(calls, 1, "a try on a busy name is one call");
    let gave_up = tenure::Mutex::new(&w, &name)
        .unwrap()
        .lock_timeout(std::time::Duration::from_millis(300))
        .await;
    assert!(
        matches!(gave_up, Err(tenure::Error::Timeout(_))),
        "{gave_up:?}"
    );
    assert!(try_probe().await.0.is_none(), "still held by a");
    held.release().await.unwrap();
    let got = try_probe().await.0.expect("free after the waiter gave up");
    got.release().await.unwrap();
    // A handoff, then a reentrant hold released twice.
    let held = tenure::Mutex::new(&a, &name).unwrap().lock().await.unwrap();
    let waiter = {
        let (w, name) = (w.clone(), name.clone());
        tokio::spawn(async move { tenure::Mutex::new(&w, &name).unwrap().lock().await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
        .await
        .expect("handed over in time")
        .unwrap()
        .unwrap();
    let again = tenure::Mutex::new(&w, &name).unwrap().lock().await.unwrap();
    next.release().await.unwrap();
    assert!(try_probe().await.0.is_none(), "one hold is left");
    again.release().await.unwrap();
    let got = try_probe().await.0.expect("free after the last hold");
    got.release().await.unwrap();
    for s in [a, w, probe] {
        let _ = s.close().await;
    }
}

/// A 3-member cluster: the raft leader killed while a lock is held and two
/// waiters wait, then a follower: the holder keeps its lease, no two
/// holders at once, waiters proceed in order, tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_leader_and_member_killed() {
    let Some(mut cluster) = EtcdCluster::start_or_skip(3) else {
        return;
    };
    let leader = cluster
        .wait_leader(std::time::Duration::from_secs(20))
        .expect("a leader");
    tenure_testkit::conformance::check_cluster_failover(&mut cluster, leader).await;
}

/// `etcds://` against a member that serves clients only over TLS: locks
/// work with the test CA trusted, and are refused without it.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls() {
    let Some(server) = EtcdCluster::start_tls_or_skip() else {
        return;
    };
    let store = tenure::open(&server.url()).await.unwrap();
    let s = tenure::Session::new(&store).await.unwrap();
    let g = tenure::Mutex::new(&s, "tls").unwrap().lock().await.unwrap();
    assert!(g.token() > 0);
    g.release().await.unwrap();
    let untrusted = server.url().split_once('?').unwrap().0.to_string();
    assert!(tenure::open(&untrusted).await.is_err());
    let plain = untrusted.replace("etcds://", "etcd://");
    assert!(tenure::open(&plain).await.is_err());
}

/// A queue of more entries than etcd takes operations in one transaction
/// (128 by default) reads whole, with every session's tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_longer_than_one_transaction_reads_whole() {
    let Some(server) = shared() else { return };
    let store = tenure::open(&server.url()).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..150 {
        let session = tenure::Session::new(&store).await.unwrap();
        let guard = tenure::RwLock::new(&session, "long-queue")
            .unwrap()
            .read()
            .await
            .unwrap();
        held.push((guard, session));
    }
    let queue = store
        .queue(&tenure::Name::new("long-queue").unwrap())
        .await
        .unwrap();
    assert_eq!(queue.entries.len(), 150);
    assert!(queue
        .entries
        .iter()
        .all(|e| e.granted && !e.session_tag.is_empty()));
    for (guard, session) in held {
        guard.release().await.unwrap();
        session.close().await.unwrap();
    }
}

/// `?layout=etcd`: the whole suite again, on the keys of etcd's own
/// `concurrency` recipe (shared and permit entries are refused, typed).
mod recipe_layout {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use tenure::{Election, Mutex, Session};

    async fn target() -> Option<tenure_testkit::conformance::Target> {
        let server = super::shared()?;
        Some(tenure_testkit::conformance::Target::new(recipe_url(&server.url())).await)
    }

    fn recipe_url(url: &str) -> String {
        format!("{url}?layout=etcd")
    }

    tenure_testkit::conformance_tests!(target());

    /// An `etcdctl` child, killed when dropped; its stdout lines arrive on
    /// a channel.
    struct Etcdctl {
        child: Child,
        lines: mpsc::Receiver<String>,
    }

    impl Etcdctl {
        /// `etcdctl --endpoints=… ARGS`, or `None` (after the test kit's
        /// `missing`, which fails on CI) without `etcdctl`.
        fn start(url: &str, args: &[&str]) -> Option<Etcdctl> {
            if !std::path::Path::new("/usr/bin/etcdctl").is_file() {
                tenure_testkit::missing("etcdctl", "etcd-client");
                return None;
            }
            let endpoint = url.trim_start_matches("etcd://");
            let mut child = Command::new("/usr/bin/etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints=http://{endpoint}"))
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("etcdctl starts");
            let stdout = child.stdout.take().expect("a stdout");
            let (tx, lines) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            Some(Etcdctl { child, lines })
        }

        /// The next line, within `within`.
        fn line(&self, within: Duration) -> Option<String> {
            self.lines.recv_timeout(within).ok()
        }

        /// Lines until one equals `want`, within `within`.
        fn wait_for(&self, want: &str, within: Duration) -> bool {
            let deadline = Instant::now() + within;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match self.line(left) {
                    Some(l) if l == want => return true,
                    Some(_) => {}
                    None => return false,
                }
            }
            false
        }

        /// SIGINT: etcdctl unlocks (resigns) and closes its session.
        fn interrupt(&mut self) {
            let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }

        /// Waits for the exit, within `within`.
        fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
            let deadline = Instant::now() + within;
            while Instant::now() < deadline {
                if let Ok(Some(status)) = self.child.try_wait() {
                    return Some(status);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        }
    }

    impl Drop for Etcdctl {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Runs `f` on a blocking thread (etcdctl's output is read by blocking).
    async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        tokio::task::spawn_blocking(f).await.expect("joined")
    }

    /// `etcdctl lock NAME` and a tenure mutex on the same name exclude each
    /// other and hand over to each other, both ways; tenure's token is the
    /// key's create revision, above the etcdctl key's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcdctl_lock_and_tenure_exclude_each_other() {
        let Some(server) = super::shared() else {
            return;
        };
        let url = server.url();
        let store = tenure::open(&recipe_url(&url)).await.unwrap();
        let s = Session::new(&store).await.unwrap();
        let name = format!("interop-lock-{}", std::process::id());

        // tenure first: etcdctl waits, then gets it on release.
        let g = Mutex::new(&s, &name).unwrap().lock().await.unwrap();
        let Some(ctl) = Etcdctl::start(&url, &["lock", &name]) else {
            return;
        };
        let waiting = blocking(move || {
            let early = ctl.line(Duration::from_millis(1500));
            (ctl, early)
        })
        .await;
        let (ctl, early) = waiting;
        assert_eq!(early, None, "etcdctl got the lock while tenure held it");
        let token = g.token();
        g.release().await.unwrap();
        let (mut ctl, key) = blocking(move || {
            let key = ctl.line(Duration::from_secs(10));
            (ctl, key)
        })
        .await;
        let key = key.expect("etcdctl got the lock after tenure's release");
        assert!(key.starts_with(&format!("{name}/")), "{key}");

        // etcdctl holds: tenure's try fails, its wait ends when etcdctl
        // unlocks.
        assert!(Mutex::new(&s, &name)
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none());
        let s2 = s.clone();
        let name2 = name.clone();
        let waiter = tokio::spawn(async move {
            tokio::time::timeout(
                Duration::from_secs(20),
                Mutex::new(&s2, &name2).unwrap().lock(),
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(
            !waiter.is_finished(),
            "tenure got the lock while etcdctl held it"
        );
        ctl.interrupt();
        let g = waiter
            .await
            .unwrap()
            .expect("tenure got the lock after etcdctl's unlock")
            .unwrap();
        assert!(g.token() > token, "{} after {token}", g.token());
        assert!(ctl.exited(Duration::from_secs(10)).is_some());
        g.release().await.unwrap();
        s.close().await.unwrap();
    }

    /// `etcdctl elect NAME` and a tenure election see one leader, both ways;
    /// `etcdctl elect --listen` prints tenure's proclaimed value.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcdctl_elect_and_tenure_see_one_leader() {
        let Some(server) = super::shared() else {
            return;
        };
        let url = server.url();
        let store = tenure::open(&recipe_url(&url)).await.unwrap();
        let s = Session::new(&store).await.unwrap();
        let name = format!("interop-elect-{}", std::process::id());
        let election = Election::new(&s, &name).unwrap();

        // tenure leads; a listener sees its value, then its proclaim.
        let term = election.campaign("tenure-first").await.unwrap();
        let Some(listen) = Etcdctl::start(&url, &["elect", "--listen", &name]) else {
            return;
        };
        let listen = blocking(move || {
            assert!(
                listen.wait_for("tenure-first", Duration::from_secs(10)),
                "etcdctl elect --listen did not print tenure's value"
            );
            listen
        })
        .await;
        term.proclaim("tenure-proclaimed").await.unwrap();
        let listen = blocking(move || {
            assert!(
                listen.wait_for("tenure-proclaimed", Duration::from_secs(10)),
                "etcdctl elect --listen did not print tenure's proclaim"
            );
            listen
        })
        .await;

        // etcdctl campaigns: it waits while tenure leads, wins on resign.
        let Some(candidate) = Etcdctl::start(&url, &["elect", &name, "from-etcdctl"]) else {
            return;
        };
        let candidate = blocking(move || {
            assert_eq!(
                candidate.line(Duration::from_millis(1500)),
                None,
                "etcdctl was elected while tenure led"
            );
            candidate
        })
        .await;
        assert_eq!(
            election.leader().await.unwrap().map(|l| l.value),
            Some(b"tenure-proclaimed".to_vec())
        );
        term.resign().await.unwrap();
        let (mut candidate, listen) = blocking(move || {
            assert!(
                candidate.wait_for("from-etcdctl", Duration::from_secs(10)),
                "etcdctl was not elected after tenure resigned"
            );
            assert!(
                listen.wait_for("from-etcdctl", Duration::from_secs(10)),
                "the listener did not see etcdctl's term"
            );
            (candidate, listen)
        })
        .await;
        drop(listen);

        // etcdctl leads: tenure sees it, cannot win, and wins once it
        // resigns.
        let leader = election.leader().await.unwrap().expect("a leader");
        assert_eq!(leader.value, b"from-etcdctl".to_vec());
        assert!(election
            .try_campaign("tenure-again")
            .await
            .unwrap()
            .is_none());
        candidate.interrupt();
        let term = tokio::time::timeout(Duration::from_secs(20), election.campaign("tenure-again"))
            .await
            .expect("tenure elected after etcdctl resigned")
            .unwrap();
        assert!(term.token() > leader.token);
        assert!(candidate.exited(Duration::from_secs(10)).is_some());
        term.resign().await.unwrap();
        s.close().await.unwrap();
    }

    /// What etcd's recipe cannot hold is refused, typed; tenure's own keys
    /// (sessions, fences, cells) stay under its prefix.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_and_permits_are_unsupported() {
        let Some(server) = super::shared() else {
            return;
        };
        let store = tenure::open(&recipe_url(&server.url())).await.unwrap();
        let caps = store.capabilities();
        assert!(!caps.shared && !caps.permits && caps.fencing && caps.fifo);
        let s = Session::new(&store).await.unwrap();
        let r = tenure::Semaphore::new(&s, "recipe-sem", 2)
            .unwrap()
            .try_acquire()
            .await;
        assert!(matches!(r, Err(tenure::Error::Unsupported { .. })), "{r:?}");
        // A name over tenure's own keys (sessions' secrets) is refused.
        for name in ["tenure", "tenure/sk", "tenure/si/x"] {
            let r = Mutex::new(&s, name).unwrap().try_lock().await;
            assert!(
                matches!(r, Err(tenure::Error::InvalidName { .. })),
                "{name}: {r:?}"
            );
        }
        let bad = tenure::open(&format!("{}?layout=zk", server.url())).await;
        assert!(
            matches!(bad, Err(tenure::Error::InvalidUrl { .. })),
            "{bad:?}"
        );
    }
}
