//! `redis://[:password@]host:port/db[?prefix=NAME]`: one Lua script per
//! operation (`EVALSHA`), so every operation is atomic, one round trip, and
//! judged by Redis's own clock.
//!
//! All keys share the hash tag `{NAME}` (default `{tenure}`): one cluster slot,
//! so a script may touch sessions and queues together. Waiters are woken by
//! pub/sub on a channel of their own entry (a release wakes only the next
//! waiter); a holder that expires silently is noticed by polling no later
//! than its expiry. Fencing counters are seeded from Redis's `TIME` in
//! microseconds when missing, so they do not go back even if Redis loses its
//! data (as long as a name saw fewer than a million changes per second on
//! average: the counter also counts versions).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

use super::codec;
use super::poll::{self, Listeners, Listening, Look, Watch};
use super::url::{mask_password, StoreUrl, UrlRules};
use crate::error::{Error, Result};
use crate::store::{
    Capabilities, CellWrite, Entry, EntryKind, Expect, FenceOp, FenceState, JoinMode, JoinRequest,
    Joined, Name, OpenedSession, Queue, SessionKey, SessionSpec, Store, Versioned, Wake,
};

const BACKEND: &str = "redis";
const SCRIPT: &str = include_str!("redis.lua");
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);
/// A pub/sub connection that failed to open is tried again after this long.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// The script's key layout (see the top of `redis.lua`); kept in the
/// prefix's `sessions` key, so that clients of different layouts never share
/// a prefix.
const KEY_LAYOUT: &str = "4";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
/// A channel nobody listens on any more is unsubscribed with others, in one
/// `UNSUBSCRIBE`: when this many wait, or this long after the first of them.
/// (A waiter's grant channel is used once, so one `UNSUBSCRIBE` each was a
/// command per grant.)
const UNSUBSCRIBE_BATCH: usize = 64;
const UNSUBSCRIBE_AFTER: Duration = Duration::from_millis(200);

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::servers(&["prefix", "tls_ca"]).with_fragment();

/// The Redis backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // The server's wall clock only hints; a watcher confirms expiry.
        watched_expiry: true,
        wake: Wake::pub_sub(POLL_MAX),
        ..Capabilities::durable_store(
            BACKEND,
            "the watching client's monotonic clock (a holder renewed on it is watched for its TTL); Redis's TIME only hints",
            "acquire: 1 (EVALSHA), release: 1, renew: 1",
        )
    }
}

/// A store on one Redis server.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionManager,
    client: redis::Client,
    script: redis::Script,
    prefix: String,
    sessions_key: String,
    /// The database number the URL selects (in a release's grant message).
    db: String,
    url: String,
    caps: Capabilities,
    /// Script calls made so far (see [`RedisStore::round_trips`]).
    round_trips: std::sync::atomic::AtomicU64,
    wakeups: Wakeups,
}

store_debug!(RedisStore: url, prefix);

fn redis_err(e: redis::RedisError) -> Error {
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

/// The script's operations whose first argument is the name (the others
/// start with the session).
const NAME_FIRST_OPS: &[&str] = &["fence", "cellget", "cellput", "celldel", "expire"];

/// The fingerprint and TTL at `reply[at]` and `reply[at + 1]`, if any.
fn watch_at(reply: &[Value], at: usize) -> Result<Option<Watch>> {
    let blockers = reply.get(at).map(text).transpose()?.unwrap_or_default();
    if blockers.is_empty() {
        return Ok(None);
    }
    let ttl = reply.get(at + 1).map(unsigned).transpose()?.unwrap_or(0);
    Ok(Some(Watch {
        blockers,
        ttl: Duration::from_millis(ttl),
    }))
}

fn bad_reply(what: &str) -> Error {
    Error::backend(BACKEND, format!("unexpected reply from the script: {what}"))
}

fn text(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        Value::Okay => Ok("OK".into()),
        Value::Nil => Ok(String::new()),
        other => Err(bad_reply(&format!("{other:?}"))),
    }
}

fn bytes(v: &Value) -> Result<Vec<u8>> {
    match v {
        Value::BulkString(b) => Ok(b.clone()),
        Value::Nil => Ok(Vec::new()),
        other => text(other).map(String::into_bytes),
    }
}

fn number(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => text(other)?
            .parse()
            .map_err(|_| bad_reply(&format!("{other:?} is not a number"))),
    }
}

fn unsigned(v: &Value) -> Result<u64> {
    u64::try_from(number(v)?).map_err(|_| bad_reply("negative number"))
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
            url.userinfo_as_written(),
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
                sessions_key: format!("{prefix}:sessions"),
                prefix,
                url: url.masked().to_string(),
                caps: capabilities(),
                round_trips: Default::default(),
                wakeups: Wakeups::default(),
            }),
        };
        // Fail now, not at the first lock, if the server refuses us or the
        // prefix holds another layout's keys. The answer is the keyspace's
        // id, which a release's grant message carries.
        let candidate = crate::store::random_hex(16)?;
        let reply = store
            .call("layout", &[KEY_LAYOUT.as_bytes(), candidate.as_bytes()])
            .await?;
        if let Some(Value::BulkString(id)) = reply.get(1) {
            // The id travels with the data (a copy of the keys into another
            // database, SWAPDB): a grant message names the database too.
            let mut ours = id.clone();
            ours.push(b':');
            ours.extend_from_slice(store.inner.db.as_bytes());
            let _ = store.inner.wakeups.keyspace.set(ours);
        }
        Ok(store)
    }

    /// How many script calls (round trips) this store has made so far: what
    /// the no-thundering-herd check counts per handoff, and while waiters
    /// wait.
    pub fn round_trips(&self) -> u64 {
        self.inner
            .round_trips
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs one operation of the script: one round trip. Errors the script
    /// reports (`lost`, `notheld`, `conflict`) become typed errors.
    async fn call(&self, op: &str, args: &[&[u8]]) -> Result<Vec<Value>> {
        match self.call_fast(op, args).await? {
            Reply::Table(reply) => Ok(reply),
            Reply::Fast(n) => Err(bad_reply(&format!("{op} answered {n}"))),
        }
    }

    /// [`Self::call`] for the operations whose fast paths answer with a bare
    /// integer (building a reply table costs the script more than the
    /// commands it saves).
    async fn call_fast(&self, op: &str, args: &[&[u8]]) -> Result<Reply> {
        self.inner
            .round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut invocation = self.inner.script.key(&self.inner.sessions_key);
        invocation.arg(&self.inner.prefix).arg(op);
        for a in args {
            invocation.arg(*a);
        }
        let mut conn = self.inner.conn.clone();
        match invocation
            .invoke_async(&mut conn)
            .await
            .map_err(redis_err)?
        {
            Value::Int(n) => Ok(Reply::Fast(n)),
            Value::Array(reply) => self.status(reply, op, args).map(Reply::Table),
            other => Err(bad_reply(&format!("{other:?}"))),
        }
    }

    /// Turns the script's status word (`reply[0]`) into a result.
    fn status(&self, reply: Vec<Value>, op: &str, args: &[&[u8]]) -> Result<Vec<Value>> {
        match reply.first().map(text).transpose()?.as_deref() {
            Some("ok") | Some("none") | Some("granted") | Some("wait") | Some("behind")
            | Some("ahead") | Some("stale") | Some("mismatch") => Ok(reply),
            Some("layout") => Err(Error::SchemaMismatch {
                backend: BACKEND,
                url: self.inner.url.clone(),
                found: format!(
                    "prefix {} holds tenure keys of layout {}",
                    self.inner.prefix,
                    reply.get(1).map(text).transpose()?.unwrap_or_default()
                ),
                expected: format!(
                    "layout {KEY_LAYOUT} (use another prefix=, or stop the other clients and \
                     delete the prefix's keys)"
                ),
            }),
            Some(word @ ("lost" | "notheld" | "conflict")) => {
                // The name is the first argument of some operations and the
                // second (after the session) of the others.
                let at = usize::from(!NAME_FIRST_OPS.contains(&op));
                let name = args
                    .get(at)
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .unwrap_or_default();
                let detail = reply.get(1).map(text).transpose()?;
                Err(codec::status_error(BACKEND, word, detail, &name))
            }
            _ => Err(bad_reply(&format!("{reply:?}"))),
        }
    }

    fn channel(&self, kind: &str, name: &Name) -> String {
        format!("{}:{kind}:{name}", self.inner.prefix)
    }
}

/// Routes pub/sub messages to the tasks waiting on their channels, over one
/// dedicated connection that is opened on first use and again after it
/// drops.
#[derive(Default)]
struct Wakeups {
    sink: tokio::sync::Mutex<Option<redis::aio::PubSubSink>>,
    listeners: Listeners,
    /// Whether the current connection is subscribed and delivering.
    up: Arc<std::sync::atomic::AtomicBool>,
    /// Which connection is current (an old one's end must not mark a new
    /// one down).
    generation: Arc<std::sync::atomic::AtomicU64>,
    /// When connecting last failed: tried again at most once a second.
    failed: poll::ReconnectGate,
    /// The keyspace's id (the script's `P:id`), as read at open, and the
    /// database's number (`id:db`): a grant message that carries it is the
    /// grant itself.
    keyspace: Arc<std::sync::OnceLock<Vec<u8>>>,
    /// What the joins of queued entries said a first look would.
    joined: poll::JoinedLooks,
    /// Channels whose last listener went, to unsubscribe in one batch.
    unheard: std::sync::Mutex<Unheard>,
    /// The task that reads the current connection's messages: stopped when
    /// the connection is given up, which closes it (the driver runs while
    /// the reader holds its stream).
    reader: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl RedisStore {
    /// Listens on `channel`, subscribing if it is the channel's first
    /// listener. If pub/sub is down, waiters poll.
    async fn listen(&self, channel: String) -> Listening {
        let (listening, first) = self.inner.wakeups.listeners.listen(channel.clone());
        let store = self.clone();
        let listening = listening.on_last(move |channel| store.unsubscribe_later(channel));
        if first || !self.pubsub_up() {
            self.subscribe(Some(&channel)).await;
        }
        listening
    }

    /// Queues `channel` to be unsubscribed with others: at once when
    /// [`UNSUBSCRIBE_BATCH`] wait, else at most [`UNSUBSCRIBE_AFTER`] after
    /// the first of them.
    fn unsubscribe_later(&self, channel: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to send it from: the next channel queued in one
            // takes this one along.
            self.unheard().channels.push(channel);
            return;
        };
        let (flush_now, arm) = {
            let mut unheard = self.unheard();
            unheard.channels.push(channel);
            let flush_now = unheard.channels.len() >= UNSUBSCRIBE_BATCH && !unheard.flushing;
            let arm = !flush_now && !unheard.timer;
            unheard.flushing |= flush_now;
            unheard.timer |= arm;
            (flush_now, arm)
        };
        // The tasks hold the store weakly: one dropped meanwhile closes its
        // connection, and its subscriptions with it. Each clears its flag
        // when done, or when dropped, run or not (a runtime shutting down
        // drops what is spawned on it), so a channel queued later is sent.
        let inner = Arc::downgrade(&self.inner);
        if flush_now {
            let done = Disarm(inner.clone(), |u| u.flushing = false);
            runtime.spawn(async move {
                let _done = done;
                if let Some(inner) = inner.upgrade() {
                    RedisStore { inner }.unsubscribe_unheard().await;
                }
            });
        } else if arm {
            let disarm = Disarm(inner.clone(), |u| u.timer = false);
            runtime.spawn(async move {
                tokio::time::sleep(UNSUBSCRIBE_AFTER).await;
                // Cleared before sending: a channel queued from now on arms
                // a timer of its own.
                drop(disarm);
                if let Some(inner) = inner.upgrade() {
                    RedisStore { inner }.unsubscribe_unheard().await;
                }
            });
        }
    }

    fn unheard(&self) -> std::sync::MutexGuard<'_, Unheard> {
        let unheard = &self.inner.wakeups.unheard;
        unheard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Unsubscribes, in one command, the queued channels that still have no
    /// listener. Under the connection's lock, as every subscribe is: a
    /// channel listened on again before this reads the listeners is kept,
    /// and one listened on after it is subscribed again after this. A
    /// connection that does not answer is dropped, as when a subscribe
    /// fails: its waiters look, and poll until a new one is up.
    async fn unsubscribe_unheard(&self) {
        let w = &self.inner.wakeups;
        let mut sink = w.sink.lock().await;
        let channels: Vec<String> = std::mem::take(&mut self.unheard().channels)
            .into_iter()
            .filter(|channel| !w.listeners.is_listened(channel))
            .collect();
        let (Some(s), false) = (sink.as_mut(), channels.is_empty()) else {
            return;
        };
        match tokio::time::timeout(RESPONSE_TIMEOUT, s.unsubscribe(&channels)).await {
            Ok(Ok(())) => {}
            failed => {
                tracing::debug!(?failed, "unsubscribe failed; waiters poll");
                self.give_up_pubsub(&mut sink);
            }
        }
    }

    /// Closes the pub/sub connection that failed (its sink, held locked by
    /// the caller, and its reader): every waiter looks again, and polls
    /// until a new connection is up.
    fn give_up_pubsub(&self, sink: &mut Option<redis::aio::PubSubSink>) {
        let w = &self.inner.wakeups;
        w.up.store(false, std::sync::atomic::Ordering::Release);
        *sink = None;
        if let Some(reader) = w.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            reader.abort();
        }
        w.listeners.wake_all();
    }

    fn pubsub_up(&self) -> bool {
        self.inner
            .wakeups
            .up
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Makes sure the pub/sub connection is up and subscribed to `channel`;
    /// a new connection subscribes to every channel listened on, and then
    /// every listener looks again (what it missed is in the store). Returns
    /// whether notifications arrive.
    async fn subscribe(&self, channel: Option<&str>) -> bool {
        use std::sync::atomic::Ordering;
        let w = &self.inner.wakeups;
        let mut sink = w.sink.lock().await;
        if sink.is_some() && self.pubsub_up() {
            if let (Some(s), Some(channel)) = (sink.as_mut(), channel) {
                match tokio::time::timeout(RESPONSE_TIMEOUT, s.subscribe(channel)).await {
                    Ok(Ok(())) => {}
                    failed => {
                        tracing::debug!(?failed, "subscribe failed; waiters poll");
                        self.give_up_pubsub(&mut sink);
                    }
                }
            }
            return self.pubsub_up();
        }
        if w.failed.failed_within(RECONNECT_AFTER) {
            return false;
        }
        let fail = |e: &dyn std::fmt::Debug| {
            tracing::debug!(error = ?e, "no pub/sub connection; waiters poll");
            w.failed.failed();
            false
        };
        let pubsub =
            match tokio::time::timeout(CONNECT_TIMEOUT, self.inner.client.get_async_pubsub()).await
            {
                Ok(Ok(pubsub)) => pubsub,
                Ok(Err(e)) => return fail(&e),
                Err(e) => return fail(&e),
            };
        let (mut new_sink, mut stream) = pubsub.split();
        for key in w.listeners.keys() {
            match tokio::time::timeout(RESPONSE_TIMEOUT, new_sink.subscribe(&key)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return fail(&e),
                Err(e) => return fail(&e),
            }
        }
        let generation = w.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let (listeners, up, current) = (w.listeners.clone(), w.up.clone(), w.generation.clone());
        let keyspace = w.keyspace.clone();
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                // A release's grant, published with this keyspace's id
                // after nothing in its script could end it, is the grant:
                // the waiter takes it without looking again. Anything else
                // only wakes it to look: pub/sub ignores the database
                // number, so a message may come from another database's
                // store with the same prefix, name and token, whose id is
                // another.
                let ours = keyspace
                    .get()
                    .is_some_and(|id| !id.is_empty() && msg.get_payload_bytes() == id.as_slice());
                if ours {
                    listeners.granted(msg.get_channel_name());
                } else {
                    listeners.wake(msg.get_channel_name());
                }
            }
            // The connection is gone: waiters look again and poll until a
            // new one is up.
            if current.load(Ordering::Acquire) == generation {
                up.store(false, Ordering::Release);
            }
            listeners.wake_all();
        });
        let old_reader =
            (w.reader.lock().unwrap_or_else(|e| e.into_inner())).replace(reader.abort_handle());
        if let Some(old) = old_reader {
            old.abort();
        }
        *sink = Some(new_sink);
        w.up.store(true, Ordering::Release);
        // Whatever was published while no connection listened.
        w.listeners.wake_all();
        true
    }
}

/// The channels whose last listener went, to unsubscribe in one command,
/// and which task is due to send it.
#[derive(Default)]
struct Unheard {
    channels: Vec<String>,
    /// A task waits [`UNSUBSCRIBE_AFTER`] to send it.
    timer: bool,
    /// A task sends it now ([`UNSUBSCRIBE_BATCH`] waited).
    flushing: bool,
}

/// Clears a flag of [`Unheard`] when dropped (also when its task is), if
/// the store is still there.
struct Disarm(std::sync::Weak<Inner>, fn(&mut Unheard));

impl Drop for Disarm {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            let unheard = &inner.wakeups.unheard;
            (self.1)(&mut unheard.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}

/// What one call of the script answered.
enum Reply {
    /// A fast path's bare integer (its meaning depends on the operation).
    Fast(i64),
    /// A reply table whose status word was a success.
    Table(Vec<Value>),
}

/// What one node answered to a join (see [`RedisStore::join_at`]).
#[derive(Debug, Clone)]
pub(crate) enum NodeJoin {
    /// The entry is in the node's queue.
    Placed(Joined),
    /// `JoinMode::IfGranted` and it would not be granted: nothing changed.
    /// With what to watch when only holders that lapsed by the server's
    /// clock stand in the way.
    NotGranted(Option<Watch>),
    /// The proposed seq is not above this one, which the node has already
    /// seen for the name: nothing changed.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    Behind(u64),
    /// The proposed seq is further ahead of the node's clock than it takes;
    /// this is the highest it would take now: nothing changed.
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    Ahead(u64),
}

impl RedisStore {
    /// One fence operation on this node (Redis's `fence`, and each node's
    /// vote of Redlock's).
    pub(crate) async fn fence_on_node(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let token = match op {
            FenceOp::Read => String::new(),
            FenceOp::Admit { token, .. } => format!("{token:020}"),
        };
        let value = match op {
            FenceOp::Admit { value: Some(v), .. } => v,
            _ => &[],
        };
        let write: &[u8] = if value.is_empty() { b"" } else { b"1" };
        let args: [&[u8]; 4] = [name.as_str().as_bytes(), token.as_bytes(), write, value];
        let reply = self.call("fence", &args).await?;
        let highest = text(reply.get(1).ok_or_else(|| bad_reply("short fence reply"))?)?;
        Ok(FenceState {
            admitted: reply.first().map(text).transpose()?.as_deref() == Some("ok"),
            highest: highest
                .parse()
                .map_err(|_| bad_reply(&format!("fence highest {highest:?}")))?,
            value: match reply.get(2) {
                None | Some(Value::Nil) => None,
                Some(v) => Some(bytes(v)?),
            },
        })
    }

    /// Opens a session whose secret and tag the caller chose (Redlock opens
    /// the same session on every node).
    pub(crate) async fn open_session_as(
        &self,
        opened: &OpenedSession,
        spec: &SessionSpec,
    ) -> Result<()> {
        let ttl = spec.ttl.as_millis().to_string();
        // Tabs and newlines separate fields in the script's records.
        let label = poll::printable(&spec.label);
        self.call(
            "open",
            &[
                opened.key.secret().as_bytes(),
                opened.tag.as_bytes(),
                ttl.as_bytes(),
                label.as_bytes(),
            ],
        )
        .await
        .map(|_| ())
    }

    /// Joins with the seq the node picks (`proposed` = `None`) or with
    /// `proposed`, which the node takes only if it is above every seq it has
    /// seen for the name.
    pub(crate) async fn join_at(
        &self,
        session: &SessionKey,
        name: &Name,
        kind: EntryKind,
        value: &[u8],
        mode: JoinMode,
        proposed: Option<u64>,
    ) -> Result<NodeJoin> {
        let (_, count, limit) = codec::kind_code(kind);
        let (count, limit) = (count.to_string(), limit.to_string());
        let k = codec::kind_letter(kind);
        let mode = match mode {
            JoinMode::Wait => "wait",
            JoinMode::IfGranted => "ifgranted",
        };
        let proposed = proposed.map(|p| p.to_string()).unwrap_or_default();
        let reply = self
            .call_fast(
                "join",
                &[
                    session.secret().as_bytes(),
                    name.as_str().as_bytes(),
                    k.as_bytes(),
                    count.as_bytes(),
                    limit.as_bytes(),
                    value,
                    mode.as_bytes(),
                    proposed.as_bytes(),
                ],
            )
            .await?;
        let reply = match reply {
            Reply::Table(reply) => reply,
            // The fast path's answer: granted, one hold; negative if the
            // name's counter was new.
            Reply::Fast(n) => {
                return Ok(NodeJoin::Placed(Joined {
                    seq: n.unsigned_abs(),
                    granted: true,
                    holds: 1,
                    first: n < 0,
                }))
            }
        };
        let field = |i: usize| reply.get(i).ok_or_else(|| bad_reply("short join reply"));
        match text(field(0)?)?.as_str() {
            "none" => Ok(NodeJoin::NotGranted(
                match reply.get(3).map(number).transpose()? {
                    // Every holder lapsed by the server's clock: worth watching.
                    Some(1) => watch_at(&reply, 1)?,
                    _ => None,
                },
            )),
            "behind" => Ok(NodeJoin::Behind(unsigned(field(1)?)?)),
            "ahead" => Ok(NodeJoin::Ahead(unsigned(field(1)?)?)),
            _ => {
                let joined = Joined {
                    seq: unsigned(field(1)?)?,
                    granted: number(field(2)?)? == 1,
                    holds: u32::try_from(number(field(3)?)?).map_err(|_| bad_reply("holds"))?,
                    first: number(field(4)?)? == 1,
                };
                // A queued entry's join also says what a first look would
                // (not a Redlock node's: Redlock waits its own way).
                if reply.len() > 5 && proposed.is_empty() {
                    let wait = Look::Wait {
                        until: poll::next_expiry(Some(number(field(5)?)?)),
                        next: number(field(6)?)? == 1,
                        watch: watch_at(&reply, 7)?,
                    };
                    self.inner.wakeups.joined.keep(name, joined.seq, wait);
                }
                Ok(NodeJoin::Placed(joined))
            }
        }
    }

    /// Whether the entry `seq` of `name` is still queued and not granted,
    /// read with one plain `HGET` of its record (the last field is when it
    /// was granted, empty while it waits): the check behind a waiter's
    /// first look skipped ([`Self::await_grant`]).
    async fn still_queued(&self, name: &Name, seq: u64) -> Result<bool> {
        self.inner
            .round_trips
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("{}:e:{}", self.inner.prefix, name.as_str());
        let mut conn = self.inner.conn.clone();
        let record: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&key)
            .arg(seq.to_string())
            .query_async(&mut conn)
            .await
            .map_err(redis_err)?;
        Ok(record.is_some_and(|r| r.ends_with(b"\t")))
    }

    /// Watches `name`'s entries named in `watch` (a queue where nobody was
    /// alive by Redis's clock) for [`poll::confirm_after`] their TTL, then
    /// ends those still exactly so (not renewed); says whether it ended any.
    pub(crate) async fn confirm_expired(&self, name: &Name, watch: &Watch) -> Result<bool> {
        poll::confirm_lapsed(watch, || async {
            let args = [name.as_str().as_bytes(), watch.blockers.as_bytes()];
            let reply = self.call("expire", &args).await?;
            Ok(reply.get(1).map(number).transpose()?.unwrap_or(0) > 0)
        })
        .await
    }

    /// Listens for any change of `name`'s queue on this node (Redlock's).
    #[cfg_attr(not(feature = "redlock"), allow(dead_code))]
    pub(crate) async fn listen_changes(&self, name: &Name) -> Listening {
        self.listen(self.channel("ch", name)).await
    }
}

#[async_trait]
impl Store for RedisStore {
    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let opened = OpenedSession::random()?;
        self.open_session_as(&opened, spec).await?;
        Ok(opened)
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        self.call("keepalive", &[session.secret().as_bytes()])
            .await
            .map(|_| ())
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        self.call("close", &[session.secret().as_bytes()])
            .await
            .map(|_| ())
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let (name, kind, value, mode) = (request.name, request.kind, request.value, request.mode);
        let mut confirmed = false;
        loop {
            match self.join_at(session, name, kind, value, mode, None).await? {
                NodeJoin::Placed(joined) => return Ok(Some(joined)),
                // A try-lock held only by holders that lapsed by the
                // server's clock: that clock alone is not trusted, so watch
                // them for their TTL, then end them if none renewed, and try
                // once more.
                NodeJoin::NotGranted(Some(watch)) if !confirmed => {
                    confirmed = true;
                    if !self.confirm_expired(name, &watch).await? {
                        return Ok(None);
                    }
                }
                NodeJoin::NotGranted(_) => return Ok(None),
                NodeJoin::Behind(_) | NodeJoin::Ahead(_) => {
                    return Err(bad_reply("a seq was refused that was not proposed"))
                }
            }
        }
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.inner.wakeups.joined.take(name, seq);
        let reply = self
            .call_fast(
                "leave",
                &[
                    session.secret().as_bytes(),
                    name.as_str().as_bytes(),
                    seq.to_string().as_bytes(),
                    self.inner.db.as_bytes(),
                ],
            )
            .await?;
        // The fast path answers 0: the last hold was given back.
        let Reply::Table(reply) = reply else {
            return Ok(0);
        };
        let holds = reply.get(1).ok_or_else(|| bad_reply("short leave reply"))?;
        u32::try_from(number(holds)?).map_err(|_| bad_reply("holds"))
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        // The script publishes to `P:w:NAME<TAB>SEQ` (20 digits), so a
        // name's channels sort in queue order: without pub/sub only the
        // first waiter of the name in this process polls.
        let channels = format!("{}\t", self.channel("w", name));
        let listening = self
            .listen(format!("{channels}{seq:020}"))
            .await
            .in_line(channels);
        // The join said what a first look would: once this waiter is
        // subscribed, only check that its entry was not granted before.
        let first = (self.inner.wakeups.joined.take(name, seq))
            .map(|joined| (joined, || self.still_queued(name, seq)));
        let seq = &seq.to_string();
        let pushed = || self.subscribe(None);
        poll::until_granted(
            &listening,
            POLL_MIN,
            POLL_MAX,
            pushed,
            |confirm| async move {
                let confirm = confirm.unwrap_or_default();
                let reply = self
                    .call(
                        "look",
                        &[
                            session.secret().as_bytes(),
                            name.as_str().as_bytes(),
                            seq.as_bytes(),
                            confirm.as_bytes(),
                        ],
                    )
                    .await?;
                match reply.first().map(text).transpose()?.as_deref() {
                    Some("granted") => Ok(Look::Granted),
                    Some("wait") => Ok(Look::Wait {
                        until: poll::next_expiry(reply.get(1).map(number).transpose()?),
                        next: reply.get(2).map(number).transpose()? == Some(1),
                        watch: watch_at(&reply, 3)?,
                    }),
                    _ => Err(bad_reply(&format!("{reply:?}"))),
                }
            },
            first,
        )
        .await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let seq = seq.to_string();
        self.call(
            "setvalue",
            &[
                key.secret().as_bytes(),
                name.as_str().as_bytes(),
                seq.as_bytes(),
                value,
            ],
        )
        .await
        .map(|_| ())
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        let reply = self.call("queue", &[name.as_str().as_bytes()]).await?;
        let version = unsigned(reply.get(1).ok_or_else(|| bad_reply("short queue reply"))?)?;
        let mut entries = Vec::new();
        for f in reply[2..].chunks(10) {
            if f.len() < 10 {
                return Err(bad_reply("truncated queue entry"));
            }
            let granted_ms = text(&f[7])?;
            let left = number(&f[8])?;
            entries.push(Entry {
                seq: unsigned(&f[0])?,
                kind: codec::kind_from_letter(
                    BACKEND,
                    &text(&f[1])?,
                    number(&f[2])?,
                    number(&f[3])?,
                )?,
                session_tag: text(&f[4])?,
                label: text(&f[5])?,
                value: bytes(&f[6])?,
                granted: !granted_ms.is_empty(),
                // Redis's clock is its wall clock: shown as-is.
                granted_at: granted_ms
                    .parse::<u64>()
                    .ok()
                    .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
                expires_in: Duration::from_millis(u64::try_from(left.max(0)).unwrap_or(0)),
                holds: u32::try_from(number(&f[9])?).map_err(|_| bad_reply("holds"))?,
            });
        }
        Ok(Queue { version, entries })
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let listening = self.listen(self.channel("ch", name)).await;
        let pushed = || self.subscribe(None);
        poll::until_changed(
            self,
            name,
            version,
            listening.notify(),
            POLL_MIN,
            POLL_MAX,
            pushed,
        )
        .await
    }
    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        let reply = self.call("names", &[prefix.as_bytes()]).await?;
        let mut names = reply[1..]
            .iter()
            .map(|v| text(v).and_then(Name::new))
            .collect::<Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let reply = self.call("evict", &[name.as_str().as_bytes()]).await?;
        let n = number(reply.get(1).ok_or_else(|| bad_reply("short evict reply"))?)?;
        usize::try_from(n).map_err(|_| bad_reply("count"))
    }

    /// No key maps a tag to its session (that would need a layout change,
    /// or miss older clients' sessions): the script reads the session
    /// records one bounded HSCAN step per call (see `evictsession` in
    /// `redis.lua`), so a full look costs one round trip per 256 or so
    /// sessions, each call short; the session found is ended atomically in
    /// the call that finds it.
    async fn evict_session(&self, tag: &str) -> Result<bool> {
        let mut cursor = String::from("0");
        loop {
            let reply = self
                .call("evictsession", &[tag.as_bytes(), cursor.as_bytes()])
                .await?;
            let short = || bad_reply("short evictsession reply");
            if number(reply.get(1).ok_or_else(short)?)? == 1 {
                return Ok(true);
            }
            cursor = text(reply.get(2).ok_or_else(short)?)?;
            if cursor == "0" {
                return Ok(false);
            }
        }
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        self.fence_on_node(name, op).await
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        let reply = self.call("cellget", &[name.as_str().as_bytes()]).await?;
        match (reply.get(1), reply.get(2)) {
            (Some(version), Some(value)) => Ok(Some(Versioned {
                value: bytes(value)?,
                version: unsigned(version)?,
            })),
            _ => Ok(None),
        }
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let expected = match expect {
            Expect::Absent => "0".to_string(),
            Expect::Version(v) => v.to_string(),
        };
        let owner = owner.map_or("", SessionKey::secret);
        let args: [&[u8]; 4] = [
            name.as_str().as_bytes(),
            value,
            expected.as_bytes(),
            owner.as_bytes(),
        ];
        cell_write(self.call("cellput", &args).await?)
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let version = version.to_string();
        let args: [&[u8]; 2] = [name.as_str().as_bytes(), version.as_bytes()];
        cell_write(self.call("celldel", &args).await?)
    }
}

/// A cell write's reply: `ok` and the new version, or `mismatch` and the
/// current one (nil: no value).
fn cell_write(reply: Vec<Value>) -> Result<CellWrite> {
    let version = match reply.get(1) {
        None | Some(Value::Nil) => None,
        Some(v) => Some(unsigned(v)?),
    };
    let status = reply.first().map(text).transpose()?;
    codec::cell_write(BACKEND, status.as_deref(), version)
}
