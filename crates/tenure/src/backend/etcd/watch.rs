//! Waiting: a waiter's look at its entry, the watch on the one key whose
//! deletion can grant it (and on its own entry), the granted mark that
//! spares the next in line a read, and the wait for any change of a queue.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::layout::{marked_granted, with_granted_mark, Layout};
use super::queue::{get_kvs, revision_of, Read};
use super::rpc::{self, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};
use super::{call, lost, split_key, EtcdStore};
use crate::backend::poll::retrying;
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::store::Store;
use crate::store::{EntryKind, Name, SessionKey};

/// What a waiter learned from one look at its entry.
struct Look {
    /// `None` if granted; else the key to watch (a prefix if so said) and
    /// the revision to watch from.
    wait: Option<(Vec<u8>, bool, i64)>,
    /// An exclusive entry of tenure's layout: its stored value and mod
    /// revision, to mark it granted with
    /// ([`GRANTED_MARK`](super::layout::GRANTED_MARK)).
    exclusive: Option<(Vec<u8>, i64)>,
}

impl EtcdStore {
    /// One look at the session's entry (`own`, created at `rev`). An
    /// exclusive entry reads only itself and the entry just ahead; the
    /// others read their queue.
    async fn look(&self, lease: i64, name: &Name, own: &[u8], rev: i64) -> Result<Look> {
        self.inner.looks.fetch_add(1, Ordering::Relaxed);
        let txn = Txn::new().and_then(vec![
            TxnOp::get(self.secret_key(lease), None),
            TxnOp::get(own.to_vec(), None),
            self.latest_op(name, 1, Some(rev)),
        ]);
        let resp = retrying(|| self.txn(txn.clone())).await?;
        let ops = resp.op_responses();
        if get_kvs(ops.first())?.is_empty() {
            return Err(lost());
        }
        let (mine, stored) = match get_kvs(ops.get(1))?.first() {
            Some(kv) if kv.create_revision() == rev => (
                self.decode_entry(kv.value())?.0,
                (kv.value().to_vec(), kv.mod_revision()),
            ),
            _ => return Err(Error::NotHeld("the entry is no longer in the queue")),
        };
        if mine == EntryKind::Exclusive {
            return Ok(Look {
                wait: get_kvs(ops.get(2))?
                    .first()
                    .map(|ahead| (ahead.key().to_vec(), false, revision_of(&resp) + 1)),
                exclusive: (self.inner.layout == Layout::Tenure).then_some(stored),
            });
        }
        let read = self.read(lease, name).await?;
        let i = match read.position(lease) {
            Some(i) if read.rows[i].seq as i64 == rev => i,
            _ => return Err(Error::NotHeld("the entry is no longer in the queue")),
        };
        let wait = (!read.granted[i]).then(|| {
            let (blocker, prefix) = self.blocker(name, &read, i);
            (blocker, prefix, read.revision + 1)
        });
        Ok(Look {
            wait,
            exclusive: None,
        })
    }

    /// Marks the session's exclusive entry `own` granted
    /// ([`GRANTED_MARK`](super::layout::GRANTED_MARK)), if the session and
    /// the entry are as last seen (`stored`: its value and mod revision).
    /// True if written.
    async fn mark_granted(
        &self,
        lease: i64,
        secret: &str,
        own: &[u8],
        stored: &(Vec<u8>, i64),
    ) -> Result<bool> {
        let Some(marked) = with_granted_mark(&stored.0) else {
            return Ok(false);
        };
        let txn = Txn::new()
            .when(vec![
                self.secret_matches(lease, secret),
                Compare::mod_revision(own.to_vec(), CompareOp::Equal, stored.1),
            ])
            .and_then(vec![TxnOp::put(
                own.to_vec(),
                marked,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        Ok(call(self.client().txn(txn)).await?.succeeded())
    }

    /// The key whose deletion may grant the entry at `i`, and whether it is
    /// a prefix (a semaphore waiter watches its whole queue).
    fn blocker(&self, name: &Name, read: &Read, i: usize) -> (Vec<u8>, bool) {
        let kinds: Vec<EntryKind> = read.rows.iter().map(|r| r.kind).collect();
        match crate::backend::poll::blocker(&kinds, i) {
            Some(j) => (read.rows[j].key.clone(), false),
            None => (self.queue_prefix(name), true),
        }
    }

    /// [`Store::await_grant`]: waits until the entry is granted, watching
    /// only what can grant it.
    pub(super) async fn await_turn(
        &self,
        session: &SessionKey,
        name: &Name,
        seq: u64,
    ) -> Result<()> {
        let (lease, secret) = split_key(session)?;
        let own = self.entry_key(name, lease);
        let rev = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
        // Set when the entry just ahead left marked granted: this entry is
        // then the head, which marking it (one conditional write that also
        // checks the session and the entry) confirms without a read.
        let mut told_granted: Option<(Vec<u8>, i64)> = None;
        loop {
            if let Some(stored) = told_granted.take() {
                match self.mark_granted(lease, secret, &own, &stored).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(e) => tracing::debug!(error = %e, "marking failed; looking again"),
                }
            }
            // The session's own deadline ends a wait that cannot reach etcd.
            let look = match self.look(lease, name, &own, rev).await {
                Err(e) if e.is_temporary() => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                other => other?,
            };
            let (blocker, prefix, from) = match look.wait {
                None => {
                    // Granted: mark it, so the next in line needs no read.
                    // Only speed depends on it, so a failure is not an error.
                    if let Some(stored) = &look.exclusive {
                        if let Err(e) = self.mark_granted(lease, secret, &own, stored).await {
                            tracing::debug!(error = %e, "marking a grant failed");
                        }
                    }
                    return Ok(());
                }
                Some(wait) => wait,
            };
            let options = |start: Option<i64>| {
                let mut options = WatchOptions::new();
                if let Some(start) = start {
                    options = options.with_start_revision(start);
                }
                if prefix {
                    options = options.with_prefix();
                } else if look.exclusive.is_some() {
                    options = options.with_prev_kv();
                }
                options
            };
            let mut client = self.client();
            let mut stream = match client
                .watch(blocker.clone(), Some(options(Some(from))))
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "watch failed; looking again shortly");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // The watch from the look's revision misses nothing, but when
            // etcd has moved past that revision it is an "unsynced" watcher,
            // which etcd catches up only every 100 ms: on a busy name every
            // handoff waited up to that long. A twin from now on is served
            // at once; the first covers what came between.
            let _ = stream.watch(blocker.clone(), Some(options(None))).await;
            // The waiter's own entry too: its deletion (lease expired,
            // evicted) must end the wait.
            let _ = stream
                .watch(
                    own.clone(),
                    Some(WatchOptions::new().with_start_revision(from)),
                )
                .await;
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        if resp.canceled() {
                            break;
                        }
                        let deleted = |ev: &&rpc::Event| {
                            ev.event_type() == EventType::Delete
                                && ev.kv().is_some_and(|kv| {
                                    kv.key() == own.as_slice()
                                        || (prefix && kv.key().starts_with(&blocker))
                                        || kv.key() == blocker.as_slice()
                                })
                        };
                        if let Some(ev) = resp.events().iter().find(deleted) {
                            let ahead_granted = !prefix
                                && ev.kv().is_some_and(|kv| kv.key() == blocker.as_slice())
                                && ev.prev_kv().is_some_and(|p| marked_granted(p.value()));
                            if ahead_granted {
                                told_granted = look.exclusive.clone();
                            }
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "watch ended; looking again");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        break;
                    }
                }
            }
            self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`Store::wait_changed`]: waits until the queue's version is not
    /// `version`.
    pub(super) async fn await_change(&self, name: &Name, version: u64) -> Result<u64> {
        loop {
            let (queue, revision) = self.queue_at(name).await?;
            if queue.version != version {
                return Ok(queue.version);
            }
            let mut client = self.client();
            let (mut first_pass, mut first_aux) = (true, true);
            let options = WatchOptions::new()
                .with_start_revision(revision + 1)
                .with_prefix();
            match client.watch(self.name_prefix(name), Some(options)).await {
                Ok(mut stream) => loop {
                    if first_pass {
                        first_pass = false;
                        // A twin from now on, served at once (see
                        // `await_grant`); the first covers what came between.
                        let twin = WatchOptions::new().with_prefix();
                        let _ = stream.watch(self.name_prefix(name), Some(twin)).await;
                    }
                    if self.inner.layout == Layout::Etcd && first_aux {
                        // Hold counts live apart in this layout.
                        first_aux = false;
                        let _ = stream
                            .watch(
                                self.aux_prefix(name),
                                Some(
                                    WatchOptions::new()
                                        .with_start_revision(revision + 1)
                                        .with_prefix(),
                                ),
                            )
                            .await;
                    }
                    match stream.message().await {
                        Ok(Some(resp)) if resp.events().is_empty() && !resp.canceled() => {}
                        Ok(_) => break,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            break;
                        }
                    }
                },
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}
