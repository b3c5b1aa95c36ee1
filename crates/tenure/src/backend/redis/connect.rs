//! Connecting: the URL's options (`prefix`, `tls_ca`), the client (with
//! TLS), the connection, and what the client's errors mean.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::layout::sessions_key;
use super::cluster::Clustered;
use super::master::{Followed, Master};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use super::pubsub::Wakeups;
use super::script::SCRIPT;
use super::{capabilities, Inner, RedisStore, Replicas, BACKEND, URL};
use crate::backend::url::{mask_password, StoreUrl};
use crate::error::{Error, Result};
use crate::store::Capabilities;

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
    if e.to_string().contains("non local key") {
        // A script that met a key already moved to another node: Redis
        // stopped it there (see the docs on resharding).
        return Error::unavailable(
            BACKEND,
            format!("the cluster is moving tenure's slot to another node: {e}"),
        );
    }
    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) {
        return Error::backend(BACKEND, format!("{e}: {CLUSTER_HINT}"));
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

/// What a node of a Redis Cluster reached by `redis://` says.
const CLUSTER_HINT: &str = "the server is a node of a Redis Cluster, which keeps tenure's keys on \
     whichever node holds their slot: name one or more of its nodes in a redis+cluster://host:port[,host:port…] URL";

/// What a `redis://` or `rediss://` URL asks for.
struct Parsed {
    /// The URL for the client, without our options.
    base: String,
    /// The key prefix, as a hash tag.
    prefix: String,
    /// A CA certificate file (PEM) to trust for `rediss://`.
    tls_ca: Option<String>,
    /// For `redis+sentinel://`: the sentinels and what to ask them.
    sentinel: Option<SentinelUrl>,
    /// `replicas=N[&replicas_timeout=D]`.
    replicas: Option<Replicas>,
    /// For `redis+cluster://`: the nodes to start from (`host:port`).
    cluster: Option<Vec<String>>,
    /// `max_ttl=D`: the longest session TTL, and how long a keyspace found
    /// empty grants nothing.
    max_ttl: Duration,
}

/// How long a session's TTL may be on Redis unless `max_ttl` says
/// otherwise, and so how long a keyspace found empty (new, or lost) grants
/// nothing: four times the default TTL.
pub(crate) const DEFAULT_MAX_TTL: Duration = Duration::from_secs(60);

/// `max_ttl=D` (shared by Redlock, whose nodes are Redis servers).
pub(crate) fn parse_max_ttl(url: &StoreUrl) -> Result<Duration> {
    let Some(v) = url.option("max_ttl") else {
        return Ok(DEFAULT_MAX_TTL);
    };
    let most = Duration::from_secs(7 * 24 * 3600);
    humantime::parse_duration(v)
        .ok()
        .filter(|d| *d >= Duration::from_secs(1) && *d <= most)
        .ok_or_else(|| url.invalid(format!("max_ttl={v:?} is not a duration from 1s to 7days")))
}

/// How long a grant, a renewal or a fence waits for its replicas unless
/// `replicas_timeout` says otherwise: replicas on one network acknowledge
/// in a millisecond or so, and the wait must end well within a TTL (and
/// within the answer timeout, which bounds the call that carries it).
const REPLICAS_TIMEOUT: Duration = Duration::from_secs(1);

fn parse_replicas(url: &StoreUrl) -> Result<Option<Replicas>> {
    let within = match url.option("replicas_timeout") {
        None => REPLICAS_TIMEOUT,
        Some(d) => {
            let d = humantime::parse_duration(d)
                .map_err(|e| url.invalid(format!("replicas_timeout={d:?}: {e}")))?;
            if d.is_zero() || d >= RESPONSE_TIMEOUT {
                return Err(url.invalid(format!(
                    "replicas_timeout must be more than zero and under {}",
                    humantime::format_duration(RESPONSE_TIMEOUT)
                )));
            }
            d
        }
    };
    match url.option("replicas") {
        None if url.option("replicas_timeout").is_some() => {
            Err(url.invalid("replicas_timeout goes with replicas=N"))
        }
        None | Some("0") => Ok(None),
        Some(n) => match n.parse::<u32>() {
            Ok(count) if count <= 16 => Ok(Some(Replicas { count, within })),
            _ => Err(url.invalid(format!("replicas={n:?} must be a number from 0 to 16"))),
        },
    }
}

/// `redis+sentinel://[[user]:password@]host:port[,host:port…]/SERVICE[/DB]`.
struct SentinelUrl {
    sentinels: Vec<(String, u16)>,
    service: String,
    db: i64,
    /// The sentinels' own, when they differ (`sentinel_username`,
    /// `sentinel_password`).
    sentinel_user: Option<String>,
    sentinel_password: Option<String>,
}

fn parse_sentinel(url: &StoreUrl) -> Result<SentinelUrl> {
    let sentinels = url.servers("sentinel")?;
    let mut parts = url.path().trim_start_matches('/').split('/');
    let service = parts.next().unwrap_or_default().to_string();
    if service.is_empty() {
        return Err(url.invalid(
            "name the master's service after the sentinels: redis+sentinel://host:26379/mymaster[/DB]",
        ));
    }
    let db = match parts.next() {
        None | Some("") => 0,
        Some(db) => db
            .parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or_else(|| url.invalid(format!("database {db:?} is not a number")))?,
    };
    if parts.next().is_some() {
        return Err(url.invalid("the path is /SERVICE or /SERVICE/DB"));
    }
    Ok(SentinelUrl {
        sentinels,
        service,
        db,
        sentinel_user: url.option("sentinel_username").map(str::to_string),
        sentinel_password: url.option("sentinel_password").map(str::to_string),
    })
}

/// `redis+cluster://[[user]:password@]host:port[,host:port…][/0]`: the
/// nodes to start from (any nodes of the cluster; tenure finds the one
/// that holds its slot).
fn parse_cluster(url: &StoreUrl) -> Result<Vec<String>> {
    if url.scheme() == "rediss+cluster" {
        return Err(Error::Unsupported {
            backend: BACKEND,
            what: "TLS to a Redis Cluster (rediss+cluster://) in this build; use \
                   redis+cluster:// on a trusted network",
        });
    }
    if url.option("sentinel_username").is_some() || url.option("sentinel_password").is_some() {
        return Err(url.invalid("sentinel_username and sentinel_password go with redis+sentinel://"));
    }
    if !matches!(url.path(), "" | "/" | "/0") {
        return Err(url.invalid("a Redis Cluster has only database 0: end the URL with the nodes, or /0"));
    }
    Ok(url
        .servers("node")?
        .into_iter()
        .map(|(host, port)| format!("{host}:{port}"))
        .collect())
}

/// Our options (`prefix`, `tls_ca`) and the URL for the client without them.
fn parse_url(url: &StoreUrl) -> Result<Parsed> {
    let tls = url.scheme().starts_with("rediss");
    if tls && !cfg!(feature = "tls") {
        return Err(Error::Unsupported {
            backend: BACKEND,
            what: "TLS (rediss://) without the cargo feature `tls`",
        });
    }
    let cluster = if url.scheme().ends_with("+cluster") {
        Some(parse_cluster(url)?)
    } else {
        None
    };
    let sentinel = if url.scheme().ends_with("+sentinel") {
        Some(parse_sentinel(url)?)
    } else if cluster.is_some() {
        None
    } else {
        if url.option("sentinel_username").is_some() || url.option("sentinel_password").is_some()
        {
            return Err(url.invalid("sentinel_username and sentinel_password go with redis+sentinel://"));
        }
        if url.authority().contains(',') {
            return Err(url.invalid(
                "redis:// takes one server; use redis+sentinel:// for sentinels, redis+cluster:// for the nodes of a Redis Cluster, redlock:// for independent nodes",
            ));
        }
        None
    };
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
        sentinel,
        replicas: parse_replicas(url)?,
        cluster,
        max_ttl: parse_max_ttl(url)?,
    })
}

/// How to reach a node known by its address (a sentinel, the master a
/// sentinel names): in plain text or by TLS (`rediss+…`), trusting the
/// URL's `tls_ca` (or the system's roots), skipping the checks with
/// `#insecure` as redis-rs does.
#[derive(Clone)]
pub(super) struct Reach {
    tls: bool,
    ca: Option<Vec<u8>>,
    insecure: bool,
}

impl Reach {
    fn of(url: &StoreUrl, tls_ca: Option<&str>) -> Result<Reach> {
        let ca = match tls_ca {
            Some(path) => {
                Some(std::fs::read(path).map_err(|e| url.invalid(format!("tls_ca={path}: {e}")))?)
            }
            None => None,
        };
        Ok(Reach {
            tls: url.scheme().starts_with("rediss"),
            ca,
            insecure: url.fragment() == Some("insecure"),
        })
    }

    /// A client for the node at `at` (`host:port`), with `userinfo`
    /// (percent-encoded, ending in `@`, or empty) and database `db`.
    pub(super) fn client(
        &self,
        userinfo: &str,
        at: &str,
        db: Option<i64>,
    ) -> redis::RedisResult<redis::Client> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let db = db.map(|d| format!("/{d}")).unwrap_or_default();
        let fragment = if self.insecure { "#insecure" } else { "" };
        self.open(&format!("{scheme}://{userinfo}{at}{db}{fragment}"))
    }

    /// A client for a whole `redis://` or `rediss://` URL, trusting the CA.
    fn open(&self, url: &str) -> redis::RedisResult<redis::Client> {
        match &self.ca {
            #[cfg(feature = "tls")]
            Some(pem) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            _ => redis::Client::open(url),
        }
    }
}

/// The sentinels to ask, each with the sentinels' credentials.
fn sentinels(
    url: &StoreUrl,
    s: &SentinelUrl,
    reach: &Reach,
) -> Result<Vec<(String, redis::Client)>> {
    let credentials = match (&s.sentinel_user, &s.sentinel_password) {
        (None, None) => String::new(),
        (user, password) => format!(
            "{}:{}@",
            utf8_percent_encode(user.as_deref().unwrap_or(""), NON_ALPHANUMERIC),
            utf8_percent_encode(password.as_deref().unwrap_or(""), NON_ALPHANUMERIC)
        ),
    };
    s.sentinels
        .iter()
        .map(|(host, port)| {
            let at = format!("{host}:{port}");
            reach
                .client(&credentials, &at, None)
                .map(|client| (at, client))
                .map_err(|e| url.invalid(e.to_string()))
        })
        .collect()
}

/// A client for the parsed URL, trusting `tls_ca` if given.
fn client_for(url: &StoreUrl, parsed: &Parsed) -> Result<redis::Client> {
    let bad = |e: redis::RedisError| {
        url.invalid(
            e.to_string()
                .replace(&parsed.base, &mask_password(&parsed.base)),
        )
    };
    Reach::of(url, parsed.tls_ca.as_deref())?
        .open(&parsed.base)
        .map_err(bad)
}

/// A single server (`redis://`, `rediss://`), through a connection manager
/// that reconnects to it; a node of a Redis Cluster is refused.
async fn fixed(
    url: &StoreUrl,
    parsed: &Parsed,
    connect: Duration,
    respond: Duration,
) -> Result<(Master, String)> {
    let client = client_for(url, parsed)?;
    let db = client
        .get_connection_info()
        .redis_settings()
        .db()
        .to_string();
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
    refuse_cluster_node(url, conn.clone()).await?;
    Ok((Master::Fixed { conn, client }, db))
}

/// A node of a Redis Cluster named by `redis://` is refused, even one
/// that holds tenure's slot now: a resharding or a failover would move the
/// keys away from it.
async fn refuse_cluster_node(url: &StoreUrl, mut conn: ConnectionManager) -> Result<()> {
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut conn)
        .await
        .map_err(redis_err)?;
    if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
        return Err(url.invalid(CLUSTER_HINT));
    }
    Ok(())
}

impl RedisStore {
    /// Opens a store from a `redis://` URL, typed, for this crate's own
    /// tests (they read the store's counters). Not part of the API: open a
    /// store with [`crate::open`], whose errors name the URL's servers,
    /// at open and on every later call.
    #[doc(hidden)]
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
        let (master, db) = match (&parsed.sentinel, &parsed.cluster) {
            (_, Some(seeds)) => {
                let reach = Reach::of(url, None)?;
                let cluster = Clustered::new(
                    seeds.clone(),
                    reach,
                    url.userinfo_encoded(),
                    connect,
                    respond,
                );
                (Master::Cluster(Arc::new(cluster)), "0".to_string())
            }
            (Some(s), None) => {
                let reach = Reach::of(url, parsed.tls_ca.as_deref())?;
                let followed = Followed::new(
                    sentinels(url, s, &reach)?,
                    reach,
                    s.service.clone(),
                    url.userinfo_encoded(),
                    s.db,
                    connect,
                    respond,
                );
                (Master::sentinel(followed).await?, s.db.to_string())
            }
            (None, None) => fixed(url, &parsed, connect, respond).await?,
        };
        let prefix = parsed.prefix;
        let store = RedisStore {
            inner: Arc::new(Inner {
                master,
                replicas: parsed.replicas,
                script: redis::Script::new(SCRIPT),
                db,
                sessions_key: sessions_key(&prefix),
                moving_key: format!("{prefix}:moving"),
                prefix,
                url: url.masked().to_string(),
                caps: Capabilities {
                    max_ttl: parsed.max_ttl,
                    ..capabilities()
                },
                round_trips: Default::default(),
                wakeups: Wakeups::default(),
            }),
        };
        store.check_layout(false).await?;
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> Result<Parsed> {
        parse_url(&StoreUrl::parse(url, &URL)?)
    }

    #[test]
    fn sentinel_urls() {
        let p = parsed("redis+sentinel://:pw@h1:26379,h2:26380/mymaster/3?sentinel_password=sp")
            .unwrap();
        let s = p.sentinel.unwrap();
        assert_eq!(s.sentinels, vec![("h1".into(), 26379), ("h2".into(), 26380)]);
        assert_eq!((s.service.as_str(), s.db), ("mymaster", 3));
        assert_eq!(s.sentinel_password.as_deref(), Some("sp"));
        let s = parsed("redis+sentinel://h1:26379/mymaster").unwrap().sentinel.unwrap();
        assert_eq!(s.db, 0);
        for (url, says) in [
            ("redis+sentinel://h1:26379", "name the master's service"),
            ("redis+sentinel://h1:26379/", "name the master's service"),
            ("redis+sentinel://h1:26379/m/x", "is not a number"),
            ("redis+sentinel://h1:26379/m/1/2", "/SERVICE or /SERVICE/DB"),
            ("redis+sentinel://h1/m", "host:port"),
            ("redis://h:1/0?sentinel_password=x", "go with redis+sentinel://"),
            ("redis://h1:1,h2:2/0", "use redis+sentinel:// for sentinels"),
        ] {
            let e = parsed(url).err().unwrap_or_else(|| panic!("{url} parsed"));
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
        let tls = parsed("rediss+sentinel://h1:26379/m?tls_ca=/ca.pem").unwrap();
        assert_eq!(tls.tls_ca.as_deref(), Some("/ca.pem"));
    }

    #[test]
    fn cluster_urls() {
        let p = parsed("redis+cluster://:pw@h1:7000,h2:7001?prefix=jobs&replicas=1").unwrap();
        assert_eq!(p.cluster.unwrap(), vec!["h1:7000".to_string(), "h2:7001".to_string()]);
        assert_eq!(p.prefix, "{jobs}");
        assert!(p.replicas.is_some());
        assert!(parsed("redis+cluster://h1:7000/0").unwrap().cluster.is_some());
        for (url, says) in [
            ("redis+cluster://h1:7000/1", "only database 0"),
            ("redis+cluster://h1/", "host:port"),
            ("redis+cluster://h1:1?sentinel_password=x", "go with redis+sentinel://"),
        ] {
            let e = parsed(url).err().unwrap_or_else(|| panic!("{url} parsed"));
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
        assert!(matches!(
            parsed("rediss+cluster://h1:7000"),
            Err(Error::Unsupported { .. })
        ));
    }

    #[test]
    fn replicas_option() {
        let r = parsed("redis://h:1/0?replicas=2").unwrap().replicas.unwrap();
        assert_eq!((r.count, r.within), (2, REPLICAS_TIMEOUT));
        let r = parsed("redis+sentinel://h:1/m?replicas=1&replicas_timeout=250ms")
            .unwrap()
            .replicas
            .unwrap();
        assert_eq!((r.count, r.within), (1, Duration::from_millis(250)));
        assert!(parsed("redis://h:1/0?replicas=0").unwrap().replicas.is_none());
        for (url, says) in [
            ("redis://h:1/0?replicas=x", "from 0 to 16"),
            ("redis://h:1/0?replicas=17", "from 0 to 16"),
            ("redis://h:1/0?replicas=1&replicas_timeout=0s", "more than zero"),
            ("redis://h:1/0?replicas=1&replicas_timeout=3s", "under 3s"),
            ("redis://h:1/0?replicas=1&replicas_timeout=soon", "replicas_timeout"),
            ("redis://h:1/0?replicas_timeout=1s", "goes with replicas=N"),
        ] {
            let e = parsed(url).err().unwrap_or_else(|| panic!("{url} parsed"));
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
    }
}
