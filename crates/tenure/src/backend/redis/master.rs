//! The server tenure writes to: one fixed server (`redis://`), the
//! master a set of Sentinels names (`redis+sentinel://`), or the node of a
//! Redis Cluster that holds the prefix's slot (`redis+cluster://`, see
//! [`super::cluster`]).
//!
//! Behind Sentinel, no connection is ever made again to an address by
//! itself: after a call fails on its connection, or a node answers that it
//! is not (or no longer) the master, the connection is dropped and the
//! next call asks the sentinels which node is master now (checking that
//! node's `ROLE`). So a failover is followed, and an old master restarted
//! empty at its old address is not written to, unless the sentinels name
//! it again.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::cluster::{ClusterConn, Clustered};
use super::connect::{redis_err, Reach};
use super::BACKEND;
use crate::error::{Error, Result};

/// Where a store's calls go.
// One per store, made once and never moved after: the variants' sizes do
// not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Master {
    /// `redis://`: one server, which the connection manager reconnects to.
    Fixed {
        conn: ConnectionManager,
        client: redis::Client,
    },
    /// `redis+sentinel://`: the master the sentinels name.
    Sentinel(Followed),
    /// `redis+cluster://`: the node that holds the prefix's slot.
    Cluster(std::sync::Arc<Clustered>),
}

/// The master the sentinels named last, while its connection works.
pub(super) struct Followed {
    /// One client per sentinel (with the sentinels' credentials).
    pub(super) sentinels: Vec<(String, redis::Client)>,
    /// How to reach the master they name (TLS or not).
    reach: Reach,
    pub(super) service: String,
    /// `user:password@` for the master, percent-encoded, or empty.
    pub(super) userinfo: String,
    pub(super) db: i64,
    pub(super) connect: Duration,
    pub(super) respond: Duration,
    current: std::sync::Mutex<Option<(MultiplexedConnection, redis::Client)>>,
}

/// A connection for one call.
#[derive(Clone)]
pub(super) enum Conn {
    Managed(ConnectionManager),
    Direct(MultiplexedConnection),
    /// Boxed: a node's client is large beside a connection.
    Cluster(Box<ClusterConn>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Managed(c) => c.req_packed_command(cmd),
            Conn::Direct(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Managed(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Direct(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Managed(c) => c.get_db(),
            Conn::Direct(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Master {
    /// Follows the master the sentinels name; the first is connected to
    /// now, so that a URL whose sentinels name no master fails to open.
    pub(super) async fn sentinel(followed: Followed) -> Result<Master> {
        followed.conn().await?;
        Ok(Master::Sentinel(followed))
    }

    /// A connection to the master.
    pub(super) async fn conn(&self) -> Result<Conn> {
        match self {
            Master::Fixed { conn, .. } => Ok(Conn::Managed(conn.clone())),
            Master::Sentinel(f) => f.conn().await.map(Conn::Direct),
            Master::Cluster(c) => Ok(Conn::Cluster(Box::new(ClusterConn {
                cluster: c.clone(),
                node: c.node().await?,
            }))),
        }
    }

    /// A client for the master (for the pub/sub connection, which is made
    /// again, to the master of the moment, whenever it is lost).
    pub(super) async fn client(&self) -> Result<redis::Client> {
        match self {
            Master::Fixed { client, .. } => Ok(client.clone()),
            Master::Cluster(c) => c.client().await,
            Master::Sentinel(f) => {
                f.conn().await?;
                f.current
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_ref()
                    .map(|(_, client)| client.clone())
                    .ok_or_else(|| Error::unavailable(BACKEND, "the master's connection was lost"))
            }
        }
    }

    /// A call failed with `e`: behind Sentinel, a connection that failed or
    /// a node that is not the master is let go, and the next call asks the
    /// sentinels again. The error as tenure's.
    pub(super) fn failed(&self, e: RedisError) -> Error {
        let lost = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_timeout()
            || e.is_connection_refusal();
        // Named before a lost connection is given up below.
        let server = if lost { self.server() } else { None };
        match self {
            Master::Fixed { .. } => {}
            Master::Sentinel(f) => {
                let not_master = e
                    .code()
                    .is_some_and(|c| matches!(c, "READONLY" | "MASTERDOWN" | "LOADING"));
                if not_master || lost {
                    *f.current
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                }
            }
            Master::Cluster(c) => {
                if lost || e.code().is_some_and(|c| c == "LOADING") {
                    c.lost();
                }
            }
        }
        match server {
            // Which node did not answer, with the client's words.
            Some(server) => Error::unavailable(BACKEND, format!("{server}: {e}")),
            None => redis_err(e),
        }
    }

    /// The node calls go to now, for an error to name, where it is not the
    /// URL's server (which [`crate::open`]'s errors name): the master the
    /// sentinels named, the cluster node that holds the slot.
    fn server(&self) -> Option<String> {
        Some(match self {
            Master::Fixed { .. } => return None,
            Master::Sentinel(f) => match f
                .current
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
            {
                Some((_, client)) => format!(
                    "the master of {} at {}",
                    f.service,
                    client.get_connection_info().addr()
                ),
                None => format!("the master of {}", f.service),
            },
            Master::Cluster(c) => c.server(),
        })
    }
}

/// Whether a sentinel answered that it watches no service of that name.
fn watches_no_such(e: &RedisError) -> bool {
    e.to_string().contains("No such master with that name")
}

/// A call to the master at `at` failed: a refusal for good (a database
/// the server does not have, credentials it refuses) as such, anything
/// else as the master not answering.
fn at_master(at: &str, e: RedisError) -> Error {
    match redis_err(e) {
        e @ (Error::InvalidArgument { .. } | Error::Auth { .. }) => e,
        e => Error::unavailable(BACKEND, format!("master {at}: {}", unwrapped(&e))),
    }
}

/// An error's own words, without the backend's name in front again.
fn unwrapped(e: &Error) -> String {
    match e {
        Error::Unavailable { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

impl Followed {
    pub(super) fn new(
        sentinels: Vec<(String, redis::Client)>,
        reach: Reach,
        service: String,
        userinfo: String,
        db: i64,
        connect: Duration,
        respond: Duration,
    ) -> Followed {
        Followed {
            sentinels,
            reach,
            service,
            userinfo,
            db,
            connect,
            respond,
            current: std::sync::Mutex::new(None),
        }
    }

    async fn conn(&self) -> Result<MultiplexedConnection> {
        if let Some((conn, _)) = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            return Ok(conn.clone());
        }
        let (host, port) = self.ask_sentinels().await?;
        let at = format!("{host}:{port}");
        let client = self
            .reach
            .client(&self.userinfo, &at, Some(self.db))
            .map_err(redis_err)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect))
            .set_response_timeout(Some(self.respond));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| at_master(&at, e))?;
        // The node itself must say it is master: one the sentinels have
        // not yet turned into a replica is not written to.
        let role: Vec<Value> = redis::cmd("ROLE")
            .query_async(&mut conn)
            .await
            .map_err(|e| at_master(&at, e))?;
        if role.first() != Some(&Value::BulkString(b"master".to_vec())) {
            return Err(Error::unavailable(
                BACKEND,
                format!("{at}, which the sentinels name as master, says it is not"),
            ));
        }
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((conn.clone(), client));
        Ok(conn)
    }

    /// Asks every sentinel, at once, which node is the service's master,
    /// and believes the answer of the latest configuration (the highest
    /// `config-epoch`, which each failover raises): right after a failover
    /// a sentinel that has not heard of it yet still names the old master,
    /// which may be back, empty, at its old address.
    async fn ask_sentinels(&self) -> Result<(String, u16)> {
        let asks: Vec<_> = self
            .sentinels
            .iter()
            .map(|(at, client)| {
                let (at, client, service) = (at.clone(), client.clone(), self.service.clone());
                let (connect, respond) = (self.connect, self.respond);
                tokio::spawn(async move {
                    let asked = async {
                        let config = redis::AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(connect))
                            .set_response_timeout(Some(respond));
                        let mut conn = client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await?;
                        redis::cmd("SENTINEL")
                            .arg("MASTER")
                            .arg(&service)
                            .query_async::<std::collections::HashMap<String, String>>(&mut conn)
                            .await
                    };
                    match tokio::time::timeout(connect + respond, asked).await {
                        Ok(Ok(master)) => Ok(master),
                        Ok(Err(e)) => Err((format!("sentinel {at}: {e}"), watches_no_such(&e))),
                        Err(_) => Err((format!("sentinel {at}: no answer in time"), false)),
                    }
                })
            })
            .collect();
        let mut best: Option<(u64, String, u16)> = None;
        let mut said = Vec::new();
        // Sentinels that answered that they watch no such service, and
        // those that answered about it.
        let (mut unknown, mut known) = (0, 0);
        for ask in asks {
            let master = match ask.await {
                Ok(Ok(master)) => master,
                Ok(Err((e, no_such))) => {
                    unknown += usize::from(no_such);
                    said.push(e);
                    continue;
                }
                Err(e) => {
                    said.push(e.to_string());
                    continue;
                }
            };
            known += 1;
            let flags = master.get("flags").map(String::as_str).unwrap_or_default();
            if flags.split(',').any(|f| matches!(f, "s_down" | "o_down")) {
                said.push(format!("a sentinel sees the master down ({flags})"));
                continue;
            }
            let (Some(ip), Some(port), Some(epoch)) = (
                master.get("ip"),
                master.get("port").and_then(|p| p.parse::<u16>().ok()),
                master.get("config-epoch").and_then(|e| e.parse::<u64>().ok()),
            ) else {
                said.push(format!("a sentinel's answer without ip, port and epoch: {master:?}"));
                continue;
            };
            if best.as_ref().is_none_or(|(e, _, _)| epoch > *e) {
                best = Some((epoch, ip.clone(), port));
            }
        }
        match best {
            Some((_, ip, port)) => Ok((ip, port)),
            // Every sentinel that answered said it watches no such service:
            // the URL is wrong, and asking again will not mend it.
            None if unknown > 0 && known == 0 => Err(Error::InvalidArgument {
                what: "master's service in the store URL",
                reason: format!(
                    "the sentinels watch no service {:?} (see `sentinel monitor` in their configuration): {}",
                    self.service,
                    said.join("; ")
                ),
            }),
            None => Err(Error::unavailable(
                BACKEND,
                format!(
                    "sentinels: no master of {:?} named: {}",
                    self.service,
                    said.join("; ")
                ),
            )),
        }
    }
}
