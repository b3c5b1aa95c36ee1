//! Connecting: the URL's options (`prefix`, `tls_ca`), the client (with
//! TLS), the connection, and what the client's errors mean.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::layout::sessions_key;
use super::pubsub::Wakeups;
use super::script::SCRIPT;
use super::{capabilities, Inner, RedisStore, BACKEND, URL};
use crate::backend::url::{mask_password, StoreUrl};
use crate::error::{Error, Result};

pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) fn redis_err(e: redis::RedisError) -> Error {
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || e.code().is_some_and(|c| c == "WRONGPASS" || c == "NOAUTH")
    {
        return Error::Auth {
            backend: BACKEND,
            reason: e.to_string(),
        };
    }
    if e.to_string().contains("DB index is out of range") {
        // The URL's /N names a database the server does not have.
        return Error::InvalidArgument {
            what: "database number in the store URL",
            reason: "the Redis server has no such database (see `databases` in its configuration)"
                .into(),
        };
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_connection_refusal() {
        return Error::unavailable(BACKEND, e);
    }
    Error::backend(BACKEND, e)
}

/// What a `redis://` or `rediss://` URL asks for.
struct Parsed {
    /// The URL for the client, without our options.
    base: String,
    /// The key prefix, as a hash tag.
    prefix: String,
    /// A CA certificate file (PEM) to trust for `rediss://`.
    tls_ca: Option<String>,
}

/// Our options (`prefix`, `tls_ca`) and the URL for the client without them.
fn parse_url(url: &StoreUrl) -> Result<Parsed> {
    let tls = url.scheme() == "rediss";
    if tls && !cfg!(feature = "tls") {
        return Err(Error::Unsupported {
            backend: BACKEND,
            what: "TLS (rediss://) without the cargo feature `tls`",
        });
    }
    if url.authority().contains(',') {
        return Err(url.invalid("redis:// takes one server; use redlock:// for several"));
    }
    let prefix = match url.option("prefix") {
        None => "tenure",
        Some(p) if !p.is_empty() && !p.contains(['{', '}']) => p,
        Some(p) => {
            return Err(url.invalid(format!("prefix={p:?} must be non-empty, without braces")))
        }
    };
    let tls_ca = match url.option("tls_ca") {
        Some(path) if !tls || path.is_empty() => {
            return Err(url.invalid("tls_ca=PATH goes with rediss:// only"))
        }
        other => other.map(str::to_string),
    };
    // redis-rs reads `#insecure` (no certificate checks) from the fragment.
    let fragment = url.fragment().map(|f| format!("#{f}")).unwrap_or_default();
    Ok(Parsed {
        base: format!(
            "{}://{}{}{}{fragment}",
            url.scheme(),
            url.userinfo_encoded(),
            url.authority(),
            url.path()
        ),
        prefix: format!("{{{prefix}}}"),
        tls_ca,
    })
}

/// A client for the parsed URL, trusting `tls_ca` if given.
fn client_for(url: &StoreUrl, parsed: &Parsed) -> Result<redis::Client> {
    let bad = |e: redis::RedisError| {
        url.invalid(
            e.to_string()
                .replace(&parsed.base, &mask_password(&parsed.base)),
        )
    };
    match &parsed.tls_ca {
        #[cfg(feature = "tls")]
        Some(path) => {
            let pem =
                std::fs::read(path).map_err(|e| url.invalid(format!("tls_ca={path}: {e}")))?;
            let certs = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            redis::Client::build_with_tls(parsed.base.as_str(), certs).map_err(bad)
        }
        _ => redis::Client::open(parsed.base.as_str()).map_err(bad),
    }
}

impl RedisStore {
    /// Opens a store from a `redis://` URL (as [`crate::open`] does), typed.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        Self::open_with(&url, CONNECT_TIMEOUT, RESPONSE_TIMEOUT).await
    }

    /// One node of a Redlock store: every answer bounded by the node
    /// timeout, connecting by `connect`.
    #[cfg(feature = "redlock")]
    pub(crate) async fn open_node(url: &str, connect: Duration, timeout: Duration) -> Result<Self> {
        Self::open_with(&StoreUrl::parse(url, &URL)?, connect, timeout).await
    }

    async fn open_with(url: &StoreUrl, connect: Duration, respond: Duration) -> Result<Self> {
        let parsed = parse_url(url)?;
        let client = client_for(url, &parsed)?;
        let db = client
            .get_connection_info()
            .redis_settings()
            .db()
            .to_string();
        let prefix = parsed.prefix;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(respond))
            .set_number_of_retries(1);
        let conn = tokio::time::timeout(
            connect + Duration::from_secs(1),
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        .map_err(|_| Error::unavailable(BACKEND, "connect timed out"))?
        .map_err(redis_err)?;
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn,
                client,
                script: redis::Script::new(SCRIPT),
                db,
                sessions_key: sessions_key(&prefix),
                prefix,
                url: url.masked().to_string(),
                caps: capabilities(),
                round_trips: Default::default(),
                wakeups: Wakeups::default(),
            }),
        };
        store.check_layout().await?;
        Ok(store)
    }
}
