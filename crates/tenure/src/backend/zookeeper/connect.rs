//! What a `zk://` or `zks://` URL asks for, TLS, and connecting: the
//! store's own client, and one per session.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client as zk;

use super::call::{call, zk_err, ZkResult};
use super::nodes::Seen;
use super::session::REAP_EVERY;
use super::{capabilities, Inner, ZkStore, BACKEND, CONNECT_TIMEOUT, URL};
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

/// How many sessions a store opens at most unless its URL says otherwise
/// (`max_sessions=N`, 0 for no limit). Each session is a ZooKeeper
/// connection, and a server takes at most `maxClientCnxns` (60 by default)
/// from one address; this leaves room for the store's own connection and a
/// few others from the same host.
const DEFAULT_MAX_SESSIONS: usize = 50;

/// What a `zk://` URL asks for.
pub(super) struct Parsed {
    pub(super) hosts: String,
    pub(super) auth: Option<Vec<u8>>,
    pub(super) base: String,
    pub(super) max_sessions: usize,
    /// `zks://`: the CA file to trust.
    pub(super) tls_ca: Option<String>,
}

pub(super) fn parse_url(url: &StoreUrl) -> Result<Parsed> {
    url.servers("server")?;
    let tls = url.scheme() == "zks";
    if tls && !cfg!(feature = "tls") {
        return Err(Error::BackendDisabled {
            backend: "zookeeper over TLS (zks://)",
            feature: "tls",
        });
    }
    let tls_ca = match url.option("tls_ca") {
        Some(path) if !tls => {
            return Err(url.invalid(format!("tls_ca={path} goes with zks:// only")))
        }
        Some("") | None if tls => {
            return Err(url.invalid(
                "zks:// needs tls_ca=PATH: the ZooKeeper client trusts only the CA it is given",
            ))
        }
        other => other.map(str::to_string),
    };
    let base = match url.path().trim_end_matches('/') {
        "" => "/tenure".to_string(),
        p if p
            .split('/')
            .skip(1)
            .all(|s| !s.is_empty() && s != "." && s != "..") =>
        {
            p.to_string()
        }
        p => return Err(url.invalid(format!("bad path {p:?}"))),
    };
    // ZooKeeper's digest scheme takes `user:password`, decoded.
    let auth = url.user().map(|user| match url.password() {
        Some(password) => format!("{user}:{password}").into_bytes(),
        None => user.as_bytes().to_vec(),
    });
    let max_sessions = match url.option("max_sessions") {
        None => DEFAULT_MAX_SESSIONS,
        Some(v) => v.parse().map_err(|_| {
            url.invalid(format!(
                "max_sessions must be a whole number (0: no limit), not {v:?}"
            ))
        })?,
    };
    Ok(Parsed {
        hosts: url.authority().to_string(),
        auth,
        base,
        max_sessions,
        tls_ca,
    })
}

/// TLS to the servers' secure client port (`zks://`): the client library's
/// options, and the same trust for [`Tls::diagnose`].
#[derive(Clone)]
pub(super) struct Tls {
    #[cfg(feature = "tls")]
    options: zk::TlsOptions,
    #[cfg(feature = "tls")]
    probe: Arc<rustls::ClientConfig>,
    #[cfg(feature = "tls")]
    servers: Vec<(String, u16)>,
}

#[cfg(not(feature = "tls"))]
impl Tls {
    fn load(_url: &StoreUrl, _ca: &str) -> Result<Tls> {
        Err(Error::BackendDisabled {
            backend: "zookeeper over TLS (zks://)",
            feature: "tls",
        })
    }

    fn connector(&self, connector: zk::Connector) -> zk::Connector {
        connector
    }

    async fn connect(&self, connector: zk::Connector, hosts: &str) -> ZkResult<zk::Client> {
        connector.connect(hosts).await
    }

    async fn diagnose(&self) -> Option<Error> {
        None
    }
}

#[cfg(feature = "tls")]
impl Tls {
    /// Reads the CA file `ca` (a bad one is a bad URL).
    fn load(url: &StoreUrl, ca: &str) -> Result<Tls> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let pem =
            std::fs::read_to_string(ca).map_err(|e| url.invalid(format!("tls_ca={ca}: {e}")))?;
        let options = zk::TlsOptions::new()
            .with_pem_ca(&pem)
            .map_err(|e| url.invalid(format!("tls_ca={ca}: {e}")))?;
        // The library builds its rustls configuration with the process's
        // default crypto provider; with more than one compiled in (etcd's
        // TLS brings ring) there is none until someone installs one.
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = (*provider).clone().install_default();
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| url.invalid(format!("tls_ca={ca}: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| url.invalid(format!("tls_ca={ca}: {e}")))?;
        }
        let probe = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::backend(BACKEND, format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls {
            options,
            probe: Arc::new(probe),
            servers: url.servers("server")?,
        })
    }

    fn connector(&self, connector: zk::Connector) -> zk::Connector {
        connector.with_tls(self.options.clone())
    }

    async fn connect(&self, connector: zk::Connector, hosts: &str) -> ZkResult<zk::Client> {
        connector.secure_connect(hosts).await
    }

    /// Why no server could be reached over TLS, if a server answered but
    /// its certificate is not trusted (the client library reports only
    /// that no host could be reached): a handshake of our own with each
    /// server, with the same trust, each bounded by [`CONNECT_TIMEOUT`].
    async fn diagnose(&self) -> Option<Error> {
        for (host, port) in &self.servers {
            let config = self.probe.clone();
            let (host, port) = (host.clone(), *port);
            let shown = format!("{host}:{port}");
            let handshake = tokio::task::spawn_blocking(move || handshake(config, &host, port));
            if let Ok(Ok(Some(reason))) = tokio::time::timeout(CONNECT_TIMEOUT, handshake).await {
                return Some(Error::backend(BACKEND, format!("TLS: {shown}: {reason}")));
            }
        }
        None
    }
}

/// A TLS handshake with `host:port`: the reason the server's certificate
/// is refused, or `None` if it is accepted or the server cannot be reached.
#[cfg(feature = "tls")]
fn handshake(config: Arc<rustls::ClientConfig>, host: &str, port: u16) -> Option<String> {
    use std::net::ToSocketAddrs;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let mut socket = std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).ok()?;
    socket.set_read_timeout(Some(CONNECT_TIMEOUT)).ok()?;
    socket.set_write_timeout(Some(CONNECT_TIMEOUT)).ok()?;
    let mut conn = rustls::ClientConnection::new(config, name).ok()?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut socket) {
            // rustls's own refusals come as InvalidData; the rest is I/O.
            return match e.kind() {
                std::io::ErrorKind::InvalidData => Some(e.to_string()),
                _ => None,
            };
        }
    }
    None
}

impl ZkStore {
    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let parsed = parse_url(&url)?;
        let tls = match &parsed.tls_ca {
            Some(ca) => Some(Tls::load(&url, ca)?),
            None => None,
        };
        let admin = connect(
            &parsed.hosts,
            parsed.auth.as_deref(),
            tls.as_ref(),
            Duration::from_secs(10),
        )
        .await?;
        let store = ZkStore {
            inner: Arc::new(Inner {
                hosts: parsed.hosts,
                auth: parsed.auth,
                tls,
                base: parsed.base,
                url: url.masked().to_string(),
                caps: capabilities(),
                admin,
                sessions: std::sync::Mutex::new(HashMap::new()),
                opening: std::sync::atomic::AtomicUsize::new(0),
                max_sessions: parsed.max_sessions,
                wakeups: AtomicU64::new(0),
                waiter_listings: AtomicU64::new(0),
                seen: std::sync::Mutex::new(Seen::default()),
            }),
        };
        let acls = store.acls();
        let options = zk::CreateMode::Persistent.with_acls(acls);
        call(
            store
                .inner
                .admin
                .mkdir(&format!("{}/q", store.inner.base), &options),
        )
        .await?;
        let weak = Arc::downgrade(&store.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REAP_EVERY).await;
                let Some(inner) = weak.upgrade() else { return };
                ZkStore { inner }.reap().await;
            }
        });
        Ok(store)
    }

    /// Opens a store from a `zk://` URL, typed, for this crate's own
    /// tests (they read the store's counters). Not part of the API: open a
    /// store with [`crate::open`], whose errors name the URL's servers,
    /// at open and on every later call.
    #[doc(hidden)]
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }
}

pub(super) async fn connect(
    hosts: &str,
    auth: Option<&[u8]>,
    tls: Option<&Tls>,
    timeout: Duration,
) -> Result<zk::Client> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(timeout)
        .with_connection_timeout(CONNECT_TIMEOUT.min(timeout));
    if let Some(auth) = auth {
        connector = connector.with_auth("digest", auth);
    }
    let connector = connector.with_fail_eagerly();
    let connected = match tls {
        None => {
            tokio::time::timeout(
                CONNECT_TIMEOUT + Duration::from_secs(1),
                connector.connect(hosts),
            )
            .await
        }
        Some(tls) => {
            tokio::time::timeout(
                CONNECT_TIMEOUT + Duration::from_secs(1),
                tls.connect(tls.connector(connector), hosts),
            )
            .await
        }
    };
    let e = match connected {
        Ok(Ok(client)) => return Ok(client),
        Ok(Err(e)) => zk_err(e),
        Err(_) => Error::unavailable(BACKEND, "connect timed out"),
    };
    // Over TLS, an untrusted certificate is not worth retrying: say so.
    if let (true, Some(tls)) = (e.is_temporary(), tls) {
        if let Some(refused) = tls.diagnose().await {
            return Err(refused);
        }
    }
    Err(e)
}
