//! URL → backend, in one table.
//!
//! Every backend is one row of [`backends`]: its schemes, its cargo feature,
//! the options its URL takes, its capabilities and its opener. [`open`],
//! [`builtin_backends`], `tenure backends`, the differential test and the
//! bench all read this table, so adding a backend is its module plus one row.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::backend::url::{StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{Capabilities, Store};

type Opening = Pin<Box<dyn Future<Output = Result<Arc<dyn Store>>> + Send>>;

/// One backend: how URLs name it and, when built in, how to open it.
#[derive(Clone, Copy)]
pub struct Backend {
    /// The backend's name, as [`Capabilities::backend`] gives it.
    pub name: &'static str,
    /// The URL schemes that pick it; the first is the usual one.
    pub schemes: &'static [&'static str],
    /// The cargo feature of the `tenure` crate that builds it in.
    pub feature: &'static str,
    /// An example URL.
    pub example: &'static str,
    built: Option<Built>,
}

#[derive(Clone, Copy)]
struct Built {
    capabilities: fn() -> Capabilities,
    url: &'static UrlRules,
    open: fn(StoreUrl) -> Opening,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .field("built_in", &self.is_built_in())
            .finish()
    }
}

impl Backend {
    /// Whether this build includes the backend.
    pub fn is_built_in(&self) -> bool {
        self.built.is_some()
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
        let store = (built.open)(parsed).await?;
        #[cfg(feature = "metrics")]
        let store = crate::metered::Metered::wrap(store);
        Ok(store)
    }
}

/// One row of the table; the opener, URL rules and capabilities exist only
/// when the backend's cargo feature is on.
macro_rules! backend {
    ($name:literal, $feature:literal, [$($scheme:literal),+], $example:literal, $module:ident :: $store:ident) => {
        Backend {
            name: $name,
            schemes: &[$($scheme),+],
            feature: $feature,
            example: $example,
            #[cfg(feature = $feature)]
            built: Some(Built {
                capabilities: crate::backend::$module::capabilities,
                url: &crate::backend::$module::URL,
                open: |url| {
                    Box::pin(async move {
                        let store = crate::backend::$module::$store::open_url(url).await?;
                        Ok(Arc::new(store) as Arc<dyn Store>)
                    })
                },
            }),
            #[cfg(not(feature = $feature))]
            built: None,
        }
    };
}

/// The backends tenure knows, built in or not, in the order `tenure
/// backends` shows them.
pub fn backends() -> &'static [Backend] {
    static BACKENDS: &[Backend] = &[
        Backend {
            name: "memory",
            schemes: &["memory", "mem"],
            feature: "",
            example: "memory://",
            built: Some(Built {
                capabilities: crate::backend::memory::capabilities,
                url: &crate::backend::memory::URL,
                open: |url| {
                    Box::pin(async move {
                        let store = crate::backend::memory::MemoryStore::open_url(url)?;
                        Ok(Arc::new(store) as Arc<dyn Store>)
                    })
                },
            }),
        },
        backend!(
            "sqlite",
            "sqlite",
            ["sqlite"],
            "sqlite:///var/lib/app/locks.db",
            sqlite::SqliteStore
        ),
        backend!(
            "redis",
            "redis",
            ["redis", "rediss"],
            "redis://:password@host:6379/0",
            redis::RedisStore
        ),
        backend!(
            "redlock",
            "redlock",
            ["redlock", "redlocks"],
            "redlock://h1:6379,h2:6379,h3:6379",
            redlock::RedlockStore
        ),
        backend!(
            "etcd",
            "etcd",
            ["etcd", "etcds"],
            "etcd://host:2379,host:2379",
            etcd::EtcdStore
        ),
        backend!(
            "zookeeper",
            "zookeeper",
            ["zk", "zookeeper", "zks"],
            "zk://host:2181,host:2181/app",
            zookeeper::ZkStore
        ),
        backend!(
            "postgres",
            "postgres",
            ["postgres", "postgresql"],
            "postgres://user:password@host:5432/db",
            postgres::PostgresStore
        ),
        backend!(
            "mysql",
            "mysql",
            ["mysql", "mariadb"],
            "mysql://user:password@host:3306/db",
            mysql::MysqlStore
        ),
    ];
    BACKENDS
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
        assert_eq!(backend_for("zks://h:1").unwrap().name, "zookeeper");
        assert!(backend_for("localhost:6379").is_err());
        let err = backend_for("ftp://u:pw@h/").unwrap_err().to_string();
        assert!(!err.contains("pw@"), "{err}");
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
