//! Sessions: a lease with the session's secret and info keys on it, its
//! keep-alive stream, its revocation, and ending sessions by name or by
//! tag.

use std::sync::Arc;

use super::layout::lease_of;
use super::queue::get_kvs;
use super::rpc::{self, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp};
use super::{call, etcd_err, lease_not_found, lost, split_key, EtcdStore, BACKEND, CALL_TIMEOUT};
use crate::backend::poll::retrying;
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::store::Store;
use crate::store::{Name, OpenedSession, SessionKey, SessionSpec};

/// Session info keys read per request when looking for a tag.
const SCAN_PAGE: i64 = 512;

/// A lease's keep-alive stream, made at its first renewal.
pub(super) struct Keeper {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl EtcdStore {
    /// [`Store::open_session`]: a lease, with the session's secret and info.
    pub(super) async fn grant_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        // The lease id is part of the key; the secret follows it.
        let OpenedSession { key, tag } = OpenedSession::random()?;
        let secret = key.secret().to_string();
        let ttl = i64::try_from(spec.ttl.as_millis().div_ceil(1000).max(1)).map_err(|_| {
            Error::InvalidArgument {
                what: "ttl",
                reason: "too long for etcd".into(),
            }
        })?;
        let mut client = self.client();
        let lease = retrying(|| async {
            let mut client = self.client();
            call(client.lease_grant(ttl, None)).await
        })
        .await?
        .id();
        let label = crate::backend::poll::printable(&spec.label);
        let on_lease = || Some(PutOptions::new().with_lease(lease));
        let txn = Txn::new().and_then(vec![
            TxnOp::put(self.secret_key(lease), secret.clone(), on_lease()),
            TxnOp::put(
                self.info_key(lease),
                format!("{tag}\t{}\t{label}", spec.ttl.as_millis()),
                on_lease(),
            ),
            TxnOp::put(
                self.build_key(lease),
                crate::store::Build::this(super::FORMAT).encode(),
                on_lease(),
            ),
        ]);
        if let Err(e) = retrying(|| self.txn(txn.clone())).await {
            let _ = call(client.lease_revoke(lease)).await;
            return Err(e);
        }
        Ok(OpenedSession {
            key: SessionKey::new(format!("{:016x}{secret}", lease as u64)),
            tag,
        })
    }

    /// [`Store::keep_alive`]: one renewal on the lease's keep-alive stream.
    pub(super) async fn renew_session(&self, session: &SessionKey) -> Result<()> {
        let (lease, _) = split_key(session)?;
        let known = self.inner.keepers.lock().await.get(&lease).cloned();
        let keeper = match known {
            Some(k) => k,
            None => {
                // Made outside the map's lock: making it may take a while
                // (a leader election), and other sessions renew meanwhile.
                let (keeper, stream) = call(self.client().lease_keep_alive(lease)).await?;
                let k = Arc::new(tokio::sync::Mutex::new(Keeper { keeper, stream }));
                self.inner
                    .keepers
                    .lock()
                    .await
                    .entry(lease)
                    .or_insert(k)
                    .clone()
            }
        };
        let mut k = keeper.lock().await;
        let answer = async {
            k.keeper.keep_alive().await?;
            k.stream.message().await
        };
        let answer = tokio::time::timeout(CALL_TIMEOUT, answer).await;
        drop(k);
        match answer {
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => Ok(()),
            Ok(Ok(Some(_))) => {
                self.inner.keepers.lock().await.remove(&lease);
                Err(lost())
            }
            other => {
                // A broken stream is made anew at the next renewal.
                self.inner.keepers.lock().await.remove(&lease);
                Err(match other {
                    Ok(Err(e)) => etcd_err(e),
                    _ => Error::unavailable(BACKEND, "the keep-alive stream ended"),
                })
            }
        }
    }

    /// [`Store::close_session`]: revokes the lease.
    pub(super) async fn revoke_session(&self, session: &SessionKey) -> Result<()> {
        let (lease, _) = split_key(session)?;
        self.inner.keepers.lock().await.remove(&lease);
        let mut client = self.client();
        match tokio::time::timeout(CALL_TIMEOUT, client.lease_revoke(lease)).await {
            Ok(Ok(_)) => Ok(()),
            // Already gone.
            Ok(Err(e)) if lease_not_found(&e) => Ok(()),
            Ok(Err(e)) => Err(etcd_err(e)),
            Err(_) => Err(Error::unavailable(BACKEND, "no answer to the revoke")),
        }
    }

    /// [`Store::evict`]: revokes the leases of the granted entries.
    pub(super) async fn evict_granted(&self, name: &Name) -> Result<usize> {
        self.check_recipe_name(name)?;
        let resp = call(
            self.client()
                .txn(Txn::new().and_then(vec![self.read_op(name)])),
        )
        .await?;
        let read = self.parse_read(name, &get_kvs(resp.op_responses().first())?, 0)?;
        let mut leases: Vec<i64> = read
            .rows
            .iter()
            .zip(&read.granted)
            .filter(|(_, g)| **g)
            .map(|(r, _)| r.lease)
            // A key on no lease (put by hand) has no session to end.
            .filter(|lease| *lease != 0)
            .collect();
        leases.dedup();
        for lease in &leases {
            let _ = call(self.client().lease_revoke(*lease)).await;
        }
        Ok(leases.len())
    }

    /// [`Store::evict_session`]: revokes the lease of the session tagged `tag`.
    pub(super) async fn evict_tagged(&self, tag: &str) -> Result<bool> {
        let Some(lease) = self.lease_tagged(tag).await? else {
            return Ok(false);
        };
        // Every key of the session (secret, info, entries, hold counts,
        // bound cells) is on its lease, in both layouts: revoking it ends
        // them all at once, wakes the watchers behind, and the owner's next
        // keep-alive hears TTL 0.
        let mut client = self.client();
        match tokio::time::timeout(CALL_TIMEOUT, client.lease_revoke(lease)).await {
            Ok(Ok(())) => Ok(true),
            // Expired or ended by someone else since it was found.
            Ok(Err(e)) if lease_not_found(&e) => Ok(false),
            Ok(Err(e)) => Err(etcd_err(e)),
            Err(_) => Err(Error::unavailable(BACKEND, "no answer to the revoke")),
        }
    }

    /// Every key under `PREFIX/<head>` that is exactly a lease id and on
    /// that lease (a key put by hand, or of a longer prefix, is none of
    /// ours), by lease, read a page at a time; all pages at `revision`
    /// (0: the first page's, returned), so that several reads see one
    /// moment.
    async fn on_leases(
        &self,
        head: &str,
        mut revision: i64,
    ) -> Result<(std::collections::HashMap<i64, Vec<u8>>, i64)> {
        let head = self.key(head);
        let end = rpc::prefix_end(&head);
        let mut from = head.clone();
        let mut found = std::collections::HashMap::new();
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(SCAN_PAGE)
                .with_revision(revision);
            let resp = retrying(|| {
                let (mut client, from, options) = (self.client(), from.clone(), options.clone());
                async move { call(client.get(from, Some(options))).await }
            })
            .await?;
            if revision == 0 {
                revision = resp.header().map_or(0, |h| h.revision());
            }
            let kvs = resp.kvs();
            for kv in kvs {
                let Some(hex) = kv.key().strip_prefix(head.as_slice()) else {
                    continue;
                };
                let Ok(lease) = lease_of(hex) else { continue };
                if hex.len() == 16 && lease != 0 && kv.lease() == lease {
                    found.insert(lease, kv.value().to_vec());
                }
            }
            match kvs.last() {
                Some(last) if kvs.len() as i64 >= SCAN_PAGE => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok((found, revision)),
            }
        }
    }

    /// [`Store::session_builds`]: every session's info key (on its lease,
    /// so gone once etcd ends the lease), with its build key.
    pub(super) async fn list_session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        // Both at one revision: a session that ended between two reads
        // would otherwise be listed without its build, as a 0.1.0 one.
        let (info, at) = self.on_leases("si/", 0).await?;
        let (builds, _) = self.on_leases("sb/", at).await?;
        let mut all: Vec<crate::store::SessionBuild> = info
            .into_iter()
            .map(|(lease, value)| {
                // "tag\tttl_ms\tlabel", as format 1 keeps it.
                let text = String::from_utf8_lossy(&value).into_owned();
                let mut fields = text.splitn(3, '\t');
                let tag = fields.next().unwrap_or_default().to_string();
                let label = fields.nth(1).unwrap_or_default().to_string();
                let build = builds
                    .get(&lease)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .and_then(crate::store::Build::decode);
                crate::store::SessionBuild::new(tag, label, build)
            })
            .collect();
        all.sort_by(|a, b| a.tag.cmp(&b.tag));
        Ok(all)
    }

    /// The lease of the live session tagged `tag`, if any. It is found
    /// among this prefix's session info keys (`PREFIX/si/<lease>`, each put
    /// on its session's lease), so a lease of another prefix, or of no
    /// tenure session at all, is never the answer.
    async fn lease_tagged(&self, tag: &str) -> Result<Option<i64>> {
        // Tags are hex; a tab could never be one (it ends the tag in the
        // info value), nor could nothing.
        if tag.is_empty() || tag.contains('\t') {
            return Ok(None);
        }
        let head = self.key("si/");
        let end = rpc::prefix_end(&head);
        let mut from = head.clone();
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(SCAN_PAGE);
            let resp = retrying(|| {
                let (mut client, from, options) = (self.client(), from.clone(), options.clone());
                async move { call(client.get(from, Some(options))).await }
            })
            .await?;
            let kvs = resp.kvs();
            for kv in kvs {
                let Some(hex) = kv.key().strip_prefix(head.as_slice()) else {
                    continue;
                };
                // Exactly a lease id: anything longer is the key of another
                // prefix that starts with this one's (`PREFIX/si/x/si/…`).
                if hex.len() != 16 {
                    continue;
                }
                let Ok(lease) = lease_of(hex) else { continue };
                // A key put by hand, on no lease or another one, is no
                // session of ours.
                if lease == 0 || kv.lease() != lease {
                    continue;
                }
                let own = kv.value().split(|b| *b == b'\t').next().unwrap_or_default();
                if own == tag.as_bytes() {
                    return Ok(Some(lease));
                }
            }
            match kvs.last() {
                Some(last) if kvs.len() as i64 >= SCAN_PAGE => {
                    // Just after the last key read.
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(None),
            }
        }
    }
}
