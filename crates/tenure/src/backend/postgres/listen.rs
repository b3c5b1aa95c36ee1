//! The LISTEN connection: the schema's notifications wake this process's
//! waiters and observers, and a release's announced grant, with its proof,
//! is taken by its waiter without a look.

use futures_util::StreamExt;
use tokio_postgres::AsyncMessage;

use super::{Postgres, RECONNECT_AFTER};
use crate::backend::poll;

impl Postgres {
    /// Listens for this schema's notifications on a connection of its own,
    /// started on first use and restarted if it drops (tried at most once a
    /// second). When it drops, every waiter looks again.
    pub(super) async fn listen_for_notifications(&self) -> bool {
        let mut listening = self.inner.listener.lock().await;
        if listening.as_ref().is_some_and(|c| !c.is_closed()) {
            return true;
        }
        if self.inner.listen_failed.failed_within(RECONNECT_AFTER) {
            return false;
        }
        let failed = || {
            self.inner.listen_failed.failed();
            false
        };
        let (client, mut connection) = match self.connect_raw().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "no LISTEN connection; waiters poll");
                return failed();
            }
        };
        let listeners = self.inner.listeners.clone();
        let wake = format!("{}_wake", self.inner.schema);
        let grant = format!("{}_grant", self.inner.schema);
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            // Payload: name TAB token.
            let key_of = |payload: &str| {
                payload.rsplit_once('\t').and_then(|(name, seq)| {
                    seq.parse::<u64>()
                        .ok()
                        .map(|seq| poll::grant_key(name, seq))
                })
            };
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) if n.channel() == wake => {
                        // Only a wake-up: the waiter looks before it takes the
                        // grant. A transaction may grant an entry and then
                        // end it (`evict` ends every holder its first settle
                        // finds, a waiter it just granted included), and the
                        // NOTIFY still goes out.
                        if let Some(key) = key_of(n.payload()) {
                            listeners.wake(&key);
                        }
                    }
                    Ok(AsyncMessage::Notification(n)) if n.channel() == grant => {
                        // A release's grant, sent by a transaction that ends
                        // nothing after it and delivered once it committed:
                        // the grant itself, if it carries the proof only
                        // the store could make (any role that can connect
                        // may NOTIFY on any channel). Payload: name TAB
                        // token TAB proof.
                        if let Some((rest, proof)) = n.payload().rsplit_once('\t') {
                            if let Some(key) = key_of(rest) {
                                listeners.announced(&key, proof);
                            }
                        }
                    }
                    Ok(AsyncMessage::Notification(n)) => {
                        listeners.wake(&poll::change_key(n.payload()));
                        // A change may make a waiter the next in line
                        // (a grant ahead of it), which then watches the
                        // holders every quarter TTL, not once per TTL.
                        listeners.maybe_made_next(n.payload());
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            // No more notifications: close the connection first (so the
            // client reads closed and `listen` opens a new one), then every
            // waiter looks again, and polls until a new LISTEN connection is up.
            drop(messages);
            listeners.wake_all();
        });
        let s = &self.inner.schema;
        let listen = format!("LISTEN {s}_grant; LISTEN {s}_wake; LISTEN {s}_change;");
        let answer = crate::backend::sql::answered(
            super::BACKEND,
            client.batch_execute(&listen),
        )
        .await;
        match answer.and_then(|listened| listened.map_err(super::connect::pg_err)) {
            // Kept here: the connection lives as long as its client.
            Ok(()) => {
                *listening = Some(client);
                // Whatever was notified while nobody listened.
                self.inner.listeners.wake_all();
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "LISTEN failed; waiters poll");
                failed()
            }
        }
    }
}

/// SHA-256 of the entry's session secret, a tab and its token, in hex,
/// as `settle` computes it: a role that can NOTIFY but cannot read the
/// sessions' secrets cannot make it, and a token is never reused, so a
/// proof heard once proves nothing more.
pub(super) fn grant_proof(secret: &str, seq: u64) -> Option<String> {
    use sha2::Digest;
    use std::fmt::Write;
    let digest = sha2::Sha256::digest(format!("{secret}\t{seq}").as_bytes());
    let mut hex = String::with_capacity(64);
    for byte in digest.iter() {
        let _ = write!(hex, "{byte:02x}");
    }
    Some(hex)
}
