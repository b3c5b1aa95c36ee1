//! Redis Cluster (`redis+cluster://`): every key of a prefix shares one
//! hash tag, so one slot, so one master at a time. tenure talks to the node
//! the cluster says holds that slot, and follows the cluster when it says
//! otherwise:
//!
//! - `MOVED slot host:port`: the slot has a new master (a failover, or a
//!   resharding that finished). The call is sent there, and that node is
//!   the one used from then on.
//! - `ASK` or `TRYAGAIN`: the slot is being migrated. tenure waits and asks
//!   again (it does not send `ASKING` to the importing node: a script run
//!   there would read the keys not yet moved as absent), until the
//!   migration ends, within the answer timeout.
//! - `CLUSTERDOWN`: the cluster has no master for the slot (between a
//!   master's failure and its replica's promotion): waited out the same
//!   way.
//!
//! None of these replies means the command ran, so sending it again is
//! safe.

use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value};

use super::connect::Reach;
use super::BACKEND;
use crate::error::{Error, Result};

/// How long a call waits between two tries while the slot migrates or the
/// cluster has no master for it (doubling from the first).
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_millis(200);
/// How many `MOVED` one call follows (a slot that moves more often than
/// this within one call is not being followed, it is being chased).
const MOVES_MAX: usize = 5;

/// The nodes tenure knows of and the one that holds the prefix's slot.
pub(super) struct Clustered {
    /// `host:port` of the nodes the URL names, then of those a `MOVED`
    /// named: where to start again when the current node is lost.
    known: std::sync::Mutex<Vec<String>>,
    /// How to reach a node (plain text: TLS to a cluster is refused).
    reach: Reach,
    /// `user:password@` for every node, percent-encoded, or empty.
    userinfo: String,
    connect: Duration,
    respond: Duration,
    current: std::sync::Mutex<Option<Node>>,
}

/// A connection to one node of the cluster.
#[derive(Clone)]
pub(super) struct Node {
    at: String,
    conn: MultiplexedConnection,
    client: redis::Client,
}

/// What a reply says to do about the call.
enum Next {
    Done,
    /// Send it to this node, and use that node from now on.
    Moved(String),
    /// The slot migrates, or has no master: wait, then send it again.
    Wait(String),
}

fn next_of(kind: Option<ServerErrorKind>, code: Option<&str>, detail: Option<&str>) -> Next {
    let detail = detail.unwrap_or_default();
    match kind {
        Some(ServerErrorKind::Moved) => match detail.split_ascii_whitespace().nth(1) {
            Some(at) => Next::Moved(at.to_string()),
            None => Next::Done,
        },
        Some(ServerErrorKind::Ask) => Next::Wait(format!("the slot is migrating ({detail})")),
        Some(ServerErrorKind::TryAgain) => Next::Wait("the slot is migrating (TRYAGAIN)".into()),
        Some(ServerErrorKind::ClusterDown) => Next::Wait(format!("CLUSTERDOWN {detail}")),
        _ if code == Some("ASK") => Next::Wait(format!("the slot is migrating ({detail})")),
        _ => Next::Done,
    }
}

fn next_of_error(e: &RedisError) -> Next {
    match e.kind() {
        ErrorKind::Server(kind) => next_of(Some(kind), e.code(), e.detail()),
        _ => Next::Done,
    }
}

fn next_of_value(v: &Value) -> Next {
    match v {
        Value::ServerError(e) => next_of(e.kind(), Some(e.code()), e.details()),
        _ => Next::Done,
    }
}

impl Clustered {
    pub(super) fn new(
        seeds: Vec<String>,
        reach: Reach,
        userinfo: String,
        connect: Duration,
        respond: Duration,
    ) -> Clustered {
        Clustered {
            known: std::sync::Mutex::new(seeds),
            reach,
            userinfo,
            connect,
            respond,
            current: std::sync::Mutex::new(None),
        }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Node>> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node in use, or the first of the known nodes that answers.
    pub(super) async fn node(&self) -> Result<Node> {
        if let Some(node) = self.current().as_ref() {
            return Ok(node.clone());
        }
        let known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut said = Vec::new();
        for at in known {
            match self.connect_to(&at).await {
                Ok(node) => {
                    *self.current() = Some(node.clone());
                    return Ok(node);
                }
                Err(e) => said.push(e.to_string()),
            }
        }
        Err(Error::unavailable(
            BACKEND,
            format!("no node of the cluster answered: {}", said.join("; ")),
        ))
    }

    async fn connect_to(&self, at: &str) -> RedisResult<Node> {
        let client = self.reach.client(&self.userinfo, at, None)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect))
            .set_response_timeout(Some(self.respond));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| {
                RedisError::from((
                    ErrorKind::Io,
                    "node of the cluster",
                    format!("{at}: {e}"),
                ))
            })?;
        Ok(Node {
            at: at.to_string(),
            conn,
            client,
        })
    }

    /// The cluster said the slot's master is at `at`: that node is used
    /// from now on (and remembered, should the others be lost).
    async fn moved(&self, at: &str) -> RedisResult<Node> {
        if let Some(node) = self.current().as_ref().filter(|n| n.at == at) {
            return Ok(node.clone());
        }
        let node = self.connect_to(at).await?;
        *self.current() = Some(node.clone());
        let mut known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !known.iter().any(|k| k == at) {
            known.push(at.to_string());
        }
        Ok(node)
    }

    /// The node in use, for an error to name.
    pub(super) fn server(&self) -> String {
        match self.current().as_ref() {
            Some(node) => format!("the cluster node at {}", node.at),
            None => "the cluster node that holds the prefix's slot".to_string(),
        }
    }

    /// Lets the node in use go (a call on it failed): the next call starts
    /// again from the known nodes.
    pub(super) fn lost(&self) {
        *self.current() = None;
    }

    /// The client of the node in use (for the pub/sub connection: Redis
    /// Cluster delivers a `PUBLISH` to subscribers on every node).
    pub(super) async fn client(&self) -> Result<redis::Client> {
        self.node().await.map(|n| n.client)
    }
}

/// A call's connection to the cluster, following it as the module says.
#[derive(Clone)]
pub(super) struct ClusterConn {
    pub(super) cluster: std::sync::Arc<Clustered>,
    pub(super) node: Node,
}

impl ClusterConn {
    /// Sends the call to the slot's node until the cluster stops
    /// redirecting it, within the answer timeout.
    async fn follow(&mut self, call: Call<'_>) -> RedisResult<Vec<Value>> {
        let deadline = Instant::now() + self.cluster.respond;
        let (mut moves, mut pause) = (0, RETRY_FIRST);
        loop {
            let conn = &mut self.node.conn;
            let answer = match call {
                Call::One(cmd) => conn.req_packed_command(cmd).await.map(|v| vec![v]),
                Call::Many(pipeline, offset, count) => {
                    conn.req_packed_commands(pipeline, offset, count).await
                }
            };
            let next = match &answer {
                // The first redirected reply decides: none of the commands
                // ran where they were sent (every key is in the one slot).
                Ok(values) => values
                    .iter()
                    .map(next_of_value)
                    .find(|n| !matches!(n, Next::Done))
                    .unwrap_or(Next::Done),
                Err(e) => next_of_error(e),
            };
            match next {
                Next::Done => return answer,
                Next::Moved(at) if moves < MOVES_MAX => {
                    moves += 1;
                    self.node = self.cluster.moved(&at).await?;
                }
                Next::Moved(_) => return answer,
                Next::Wait(why) => {
                    if Instant::now() + pause > deadline {
                        return Err(RedisError::from((
                            ErrorKind::Io,
                            "the cluster did not settle",
                            format!(
                                "{why}, still after {}",
                                humantime::format_duration(self.cluster.respond)
                            ),
                        )));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                    // The slot may have a new master by now.
                    if let Ok(node) = self.cluster.node().await {
                        self.node = node;
                    }
                }
            }
        }
    }
}

/// One command, or a pipeline's commands from `offset`, `count` of them.
#[derive(Clone, Copy)]
enum Call<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize, usize),
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut values = self.follow(Call::One(cmd)).await?;
            values
                .pop()
                .ok_or_else(|| RedisError::from((ErrorKind::Client, "no reply")))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.follow(Call::Many(pipeline, offset, count)))
    }

    fn get_db(&self) -> i64 {
        0
    }
}
