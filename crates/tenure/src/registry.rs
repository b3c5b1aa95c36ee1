//! URL → backend, in one table.
//!
//! Every backend is one row of [`backends`]: its schemes, its cargo feature,
//! the options its URL takes, its capabilities and its opener. The rows are
//! written in `backend/mod.rs`, where each row also declares its store's
//! module; [`open`], [`builtin_backends`] and `tenure backends` read them.

use std::sync::Arc;

use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};
use crate::store::{Capabilities, Store};

pub use crate::backend::Backend;

impl Backend {
    /// Whether this build includes the backend.
    pub fn is_built_in(&self) -> bool {
        self.built.is_some()
    }

    /// The version of what this build keeps in the store — its tables and
    /// routines, script, or key and node layout — when built in and the
    /// store keeps anything across processes (`tenure --version` lists
    /// them). Two builds that share a store speak formats that the upgrade
    /// rule lets live side by side (docs/operations/upgrades.md).
    pub fn format(&self) -> Option<&'static str> {
        self.built.map(|b| b.format).filter(|f| !f.is_empty())
    }

    /// What the backend can do, when built in.
    pub fn capabilities(&self) -> Option<Capabilities> {
        self.built.map(|b| (b.capabilities)())
    }

    /// The options its URL takes, when built in.
    pub fn url_options(&self) -> Option<&'static [&'static str]> {
        self.built.map(|b| b.url.options)
    }

    /// Opens a store of this backend. The URL is parsed (and refused, with
    /// [`Error::InvalidUrl`] naming the fault) before any connection is tried.
    ///
    /// With the `metrics` feature the store comes wrapped in `Metered` (see
    /// [`metrics`](crate::metrics)), which records every operation's latency
    /// and errors: the only place store metrics come from, so they are the
    /// same on every backend.
    pub async fn open(&self, url: &str) -> Result<Arc<dyn Store>> {
        let built = self.built.ok_or(Error::BackendDisabled {
            backend: self.name,
            feature: self.feature,
        })?;
        let parsed = StoreUrl::parse(url, built.url)?;
        let servers = parsed.authority().to_string();
        let strangers = match built.greeting {
            Some(g) if !g.tls_schemes.contains(&parsed.scheme()) => {
                parsed.servers("server").unwrap_or_default()
            }
            _ => Vec::new(),
        };
        // Opening is one call: it fails by the store's call deadline, the
        // look at who answers on the servers' ports included.
        let deadline = (built.capabilities)().call_deadline;
        let until = tokio::time::Instant::now() + deadline;
        let opening = match built.greeting {
            Some(_) => deadline.saturating_sub(crate::backend::probe::WAIT),
            None => deadline,
        };
        let opened = tokio::time::timeout(opening, (built.open)(parsed))
            .await
            .unwrap_or_else(|_| {
                Err(Error::unavailable(
                    self.name,
                    format!("no answer within {opening:?}"),
                ))
            });
        let store = match opened {
            Ok(store) => store,
            Err(e @ Error::Unavailable { .. }) => {
                return Err(match built.greeting {
                    Some(g) if !strangers.is_empty() => {
                        let found = tokio::time::timeout_at(until, strangers_found(g, strangers))
                            .await
                            .unwrap_or_default();
                        with_strangers(e, found, &servers)
                    }
                    _ => e.at_servers(&servers),
                })
            }
            Err(e) => return Err(e.at_servers(&servers)),
        };
        let store = crate::addressed::Addressed::wrap(store, &servers);
        #[cfg(feature = "metrics")]
        let store = crate::metered::Metered::wrap(store);
        Ok(store)
    }
}

/// Each of the servers that listens but does not speak the store's
/// protocol, said as such (the client alone says "broken pipe" or "connect
/// timed out").
async fn strangers_found(
    greeting: &'static crate::backend::probe::Greeting,
    servers: Vec<(String, u16)>,
) -> Vec<String> {
    // All at once: each probe may wait a second or two.
    let probes: Vec<_> = servers
        .into_iter()
        .map(|(host, port)| {
            let probe = tokio::spawn(crate::backend::probe::stranger(
                greeting,
                host.clone(),
                port,
            ));
            (host, port, probe)
        })
        .collect();
    let mut found = Vec::new();
    for (host, port, probe) in probes {
        if let Ok(Some(what)) = probe.await {
            found.push(format!(
                "at {host}:{port}: the server there does not speak {}: {what}",
                greeting.protocol
            ));
        }
    }
    found
}

/// An unavailable store's error, with the strangers found among its
/// servers named first.
fn with_strangers(e: Error, found: Vec<String>, authority: &str) -> Error {
    match e {
        Error::Unavailable { backend, source } if !found.is_empty() => Error::Unavailable {
            backend,
            source: format!(
                "{}; the client said: {}",
                found.join("; "),
                crate::error::said_once(source.as_ref())
            )
            .into(),
        },
        e => e.at_servers(authority),
    }
}

/// The backends tenure knows, built in or not, in the order `tenure
/// backends` shows them: the table of stores in `backend/mod.rs`.
pub fn backends() -> &'static [Backend] {
    crate::backend::STORES
}

/// The backend a URL's scheme names.
///
/// # Errors
///
/// [`Error::InvalidUrl`] for a URL without `SCHEME://` or with a scheme no
/// backend has (whether built in or not).
pub fn backend_for(url: &str) -> Result<&'static Backend> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: crate::backend::url::mask_password(url),
        reason,
    };
    let (scheme, _) = url.split_once("://").ok_or_else(|| {
        invalid("expected SCHEME://…, such as sqlite:///var/lib/app/locks.db or memory://".into())
    })?;
    let scheme = scheme.to_ascii_lowercase();
    backends()
        .iter()
        .find(|b| b.schemes.contains(&scheme.as_str()))
        .ok_or_else(|| {
            let known: Vec<&str> = backends().iter().map(|b| b.schemes[0]).collect();
            invalid(format!(
                "unknown scheme {scheme:?}; known: {}",
                known.join(", ")
            ))
        })
}

/// Opens a store from a URL, such as `memory://` or `sqlite:///tmp/locks.db`.
///
/// An unknown scheme, an option the backend does not take or a malformed URL
/// is [`Error::InvalidUrl`], found before any connection is tried; a known
/// backend whose cargo feature is off is [`Error::BackendDisabled`].
///
/// With the `metrics` feature (on by default) the store records its
/// operations' latency and errors; see [`metrics`](crate::metrics).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// assert_eq!(store.capabilities().backend, "memory");
/// assert!(tenure::open("nosuch://x").await.is_err());
/// # Ok(()) }
/// ```
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    backend_for(url)?.open(url).await
}

/// The capabilities of every backend built into this binary.
pub fn builtin_backends() -> Vec<Capabilities> {
    backends()
        .iter()
        .filter_map(Backend::capabilities)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_pick_rows() {
        assert_eq!(backend_for("sqlite:///a.db").unwrap().name, "sqlite");
        assert_eq!(backend_for("MEMORY://").unwrap().name, "memory");
        assert_eq!(backend_for("rediss://h:1").unwrap().name, "redis");
        assert!(backend_for("localhost:6379").is_err());
        let err = backend_for("ftp://u:pw@h/").unwrap_err().to_string();
        assert!(!err.contains("pw@"), "{err}");
    }

    #[test]
    fn every_scheme_picks_its_row() {
        for b in backends() {
            for scheme in b.schemes {
                let url = format!("{scheme}://h:1");
                assert_eq!(backend_for(&url).unwrap().name, b.name, "{url}");
            }
        }
    }

    #[test]
    fn names_are_unique_and_match_capabilities() {
        let mut seen = std::collections::HashSet::new();
        for b in backends() {
            assert!(seen.insert(b.name), "{} twice", b.name);
            if let Some(caps) = b.capabilities() {
                assert_eq!(caps.backend, b.name);
            }
        }
    }
}
