//! Connecting to a cluster: what an `etcd://` URL asks for (endpoints, the
//! user, the prefix, the layout, TLS), the store and its client, and how a
//! call is bounded and its failures read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::layout::Layout;
use super::rpc::{self, Client, ConnectOptions, Txn, TxnResponse};
use super::session::Keeper;
use super::{capabilities_of, BACKEND, CALL_TIMEOUT, URL};
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};
use crate::store::Capabilities;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// What an `etcd://` URL asks for.
pub(super) struct Parsed {
    pub(super) endpoints: Vec<String>,
    pub(super) user: Option<(String, String)>,
    pub(super) prefix: String,
    pub(super) layout: Layout,
    /// `etcds://`: TLS, trusting the system's roots or this CA file. Read
    /// only with the `tls` feature (without it, `etcds://` is refused).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: Option<Option<String>>,
}

pub(super) fn parse_url(url: &StoreUrl) -> Result<Parsed> {
    let tls = url.scheme() == "etcds";
    if tls && !cfg!(feature = "tls") {
        return Err(Error::Unsupported {
            backend: BACKEND,
            what: "TLS (etcds://) without the cargo feature `tls`",
        });
    }
    if !url.path().trim_end_matches('/').is_empty() {
        return Err(url.invalid("etcd:// takes no path; use ?prefix=NAME"));
    }
    let scheme = if tls { "https" } else { "http" };
    let endpoints = url
        .servers("endpoint")?
        .iter()
        .map(|(h, p)| format!("{scheme}://{h}:{p}"))
        .collect();
    let user = url
        .user()
        .map(|u| (u.to_string(), url.password().unwrap_or("").to_string()));
    let prefix = match url.option("prefix") {
        None => "tenure",
        Some(p) if !p.is_empty() && !p.contains('\0') => p,
        Some(p) => return Err(url.invalid(format!("prefix={p:?} must be non-empty"))),
    };
    let layout = match url.option("layout") {
        None | Some("tenure") => Layout::Tenure,
        Some("etcd") => Layout::Etcd,
        Some(other) => {
            return Err(url.invalid(format!(
                "layout={other:?}: the layouts are `tenure` (the default) and `etcd`"
            )))
        }
    };
    let ca = match url.option("tls_ca") {
        Some(path) if !tls || path.is_empty() => {
            return Err(url.invalid("tls_ca=PATH goes with etcds:// only"))
        }
        other => other.map(str::to_string),
    };
    Ok(Parsed {
        endpoints,
        user,
        prefix: prefix.to_string(),
        layout,
        tls: tls.then_some(ca),
    })
}

/// A store in one etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    client: Client,
    pub(super) prefix: String,
    pub(super) layout: Layout,
    url: String,
    pub(super) caps: Capabilities,
    pub(super) keepers: tokio::sync::Mutex<HashMap<i64, Arc<tokio::sync::Mutex<Keeper>>>>,
    pub(super) wakeups: AtomicU64,
    pub(super) looks: AtomicU64,
    calls: AtomicU64,
}

store_debug!(EtcdStore: url, prefix);

impl EtcdStore {
    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let parsed = parse_url(&url)?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3));
        if let Some((name, password)) = &parsed.user {
            options = options.with_user(name.clone(), password.clone());
        }
        #[cfg(feature = "tls")]
        if let Some(ca) = &parsed.tls {
            let mut config = rpc::TlsOptions::new();
            match ca {
                Some(path) => {
                    let pem = std::fs::read(path)
                        .map_err(|e| url.invalid(format!("tls_ca={path}: {e}")))?;
                    config = config.ca_certificate(rpc::Certificate::from_pem(pem));
                }
                None => config = config.with_native_roots(),
            }
            options = options.with_tls(config);
        }
        let client = tokio::time::timeout(
            CONNECT_TIMEOUT + Duration::from_secs(1),
            Client::connect(parsed.endpoints.clone(), Some(options)),
        )
        .await
        .map_err(|_| Error::unavailable(BACKEND, "connect timed out"))?
        .map_err(|e| match etcd_err(e) {
            // Connecting authenticates: a refusal there is about the user.
            Error::Backend { source, .. } if parsed.user.is_some() => Error::Auth {
                backend: BACKEND,
                reason: source.to_string(),
            },
            other => other,
        })?;
        let store = EtcdStore {
            inner: Arc::new(Inner {
                client,
                prefix: parsed.prefix,
                layout: parsed.layout,
                url: url.masked().to_string(),
                caps: capabilities_of(parsed.layout),
                keepers: tokio::sync::Mutex::new(HashMap::new()),
                wakeups: AtomicU64::new(0),
                looks: AtomicU64::new(0),
                calls: AtomicU64::new(0),
            }),
        };
        // Fail now, not at the first lock, if the cluster does not answer.
        let mut client = store.client();
        call(client.get(store.key("meta"), None)).await?;
        Ok(store)
    }

    /// Opens a store from a `etcd://` URL, typed, for this crate's own
    /// tests (they read the store's counters). Not part of the API: open a
    /// store with [`crate::open`], whose errors name the URL's servers,
    /// at open and on every later call.
    #[doc(hidden)]
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    /// How many times waiters of this store were woken to look at their
    /// queue again (for the no-thundering-herd test).
    pub fn wakeups(&self) -> u64 {
        self.inner.wakeups.load(Ordering::Relaxed)
    }

    /// How many times a waiter has read its queue to learn its turn (a read
    /// etcd answers in `O(n)`). A waiter behind an entry that left marked
    /// granted reads nothing: in a run of handoffs only the first reads.
    pub fn queue_looks(&self) -> u64 {
        self.inner.looks.load(Ordering::Relaxed)
    }

    /// The client for one call (counted by [`Self::calls`]).
    pub(super) fn client(&self) -> Client {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.client.clone()
    }

    /// How many calls this store has started: transactions, reads, watches
    /// opened, lease grants and revocations. Renewals, sent on each lease's
    /// keep-alive stream, are not counted.
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    /// One transaction, bounded by [`CALL_TIMEOUT`].
    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let mut client = self.client();
        call(client.txn(txn)).await
    }
}

pub(super) fn etcd_err(e: rpc::Error) -> Error {
    use tonic::Code;
    match e {
        rpc::Error::Status(status) => {
            let message = status.message().to_string();
            let auth = message.contains("authentication failed")
                || message.contains("invalid auth token")
                || message.contains("user name is empty");
            match status.code() {
                _ if auth => Error::Auth {
                    backend: BACKEND,
                    reason: message,
                },
                Code::Unauthenticated | Code::PermissionDenied => Error::Auth {
                    backend: BACKEND,
                    reason: message,
                },
                // Connection failures come as Unavailable or Unknown.
                Code::Unavailable
                | Code::Unknown
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::ResourceExhausted
                | Code::Cancelled => Error::unavailable(BACKEND, message),
                _ => Error::backend(BACKEND, message),
            }
        }
        rpc::Error::Transport(e) => Error::unavailable(BACKEND, e),
        rpc::Error::Stream(e) if e.contains("not found") => lost(),
        rpc::Error::Stream(e) => Error::unavailable(BACKEND, e),
    }
}

/// Whether a call failed because the lease it names does not exist.
pub(super) fn lease_not_found(e: &rpc::Error) -> bool {
    matches!(e, rpc::Error::Status(s) if s.code() == tonic::Code::NotFound)
}

pub(super) fn bad(what: impl std::fmt::Display) -> Error {
    Error::backend(BACKEND, format!("unexpected answer from etcd: {what}"))
}

/// Bounds a unary call.
pub(super) async fn call<T>(
    fut: impl std::future::Future<Output = std::result::Result<T, rpc::Error>>,
) -> Result<T> {
    tokio::time::timeout(CALL_TIMEOUT, fut)
        .await
        .map_err(|_| Error::unavailable(BACKEND, format!("no answer within {CALL_TIMEOUT:?}")))?
        .map_err(etcd_err)
}

pub(super) fn lost() -> Error {
    Error::SessionLost(crate::error::LostReason::Expired)
}
