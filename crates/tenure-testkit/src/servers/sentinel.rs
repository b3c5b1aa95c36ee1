//! Redis behind Sentinel: a master, one replica, and three sentinels
//! (`redis-server --sentinel`) that watch the master as `mymaster`, with a
//! quorum of two, and fail over two seconds after it stops answering (a
//! shorter wait saw a loaded machine fail a healthy master over).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::*;
use crate::servers::{redis_cli_tls, wait_until, RedisServer};
use crate::{free_port, missing, TlsFiles};

/// The service name the sentinels watch.
pub const SERVICE: &str = "mymaster";

/// A master, its replica and three sentinels, each of its own.
pub struct RedisSentinel {
    /// The two data nodes; which one is master changes with a failover.
    pub nodes: [RedisServer; 2],
    sentinels: Vec<(u16, Child)>,
    /// For the TLS set: every node and sentinel speaks only TLS.
    tls: Option<TlsFiles>,
    dir: tempfile::TempDir,
}

impl RedisSentinel {
    /// Starts them and waits until every sentinel knows the replica and
    /// the other sentinels (so that a failover can happen); fails on CI
    /// and skips elsewhere without `redis-server`.
    pub fn start_or_skip() -> Option<RedisSentinel> {
        Self::start_with(None, tempfile::tempdir().expect("temp dir"))
    }

    /// [`RedisSentinel::start_or_skip`], everything by TLS only (data
    /// nodes, replication, sentinels), with a test CA (fails on CI and
    /// skips elsewhere without `openssl`).
    pub fn start_tls_or_skip() -> Option<RedisSentinel> {
        let dir = tempfile::tempdir().expect("temp dir");
        let tls = TlsFiles::make(dir.path())?;
        Self::start_with(Some(tls), dir)
    }

    /// Starts the set, its sentinels' files in `dir` (with the TLS files).
    fn start_with(tls: Option<TlsFiles>, dir: tempfile::TempDir) -> Option<RedisSentinel> {
        let master = match &tls {
            Some(tls) => RedisServer::start_tls_with(tls.clone()),
            None => RedisServer::start(),
        };
        let Some(master) = master else {
            missing("redis-server", "redis-server");
            return None;
        };
        let replica = match &tls {
            Some(tls) => RedisServer::start_tls_replica_of(master.port(), tls.clone())?,
            None => RedisServer::start_replica_of(master.port())?,
        };
        let mut set = RedisSentinel {
            sentinels: Vec::new(),
            tls,
            dir,
            nodes: [master, replica],
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !set
            .ask(set.nodes[1].port(), &["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        for i in 0..3 {
            let port = free_port();
            let conf = set.dir.path().join(format!("sentinel-{i}.conf"));
            let listen = match &set.tls {
                None => format!("port {port}\n"),
                Some(tls) => format!(
                    "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                     tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
                    tls.cert.display(),
                    tls.key.display(),
                    tls.ca.display()
                ),
            };
            std::fs::write(
                &conf,
                format!(
                    "{listen}bind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 2000\n\
                     sentinel failover-timeout {SERVICE} 4000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    dir = set.dir.path().display(),
                    master = set.nodes[0].port(),
                ),
            )
            .expect("write sentinel.conf");
            let mut cmd = Command::new("redis-server");
            cmd.arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = spawn_tied(cmd).expect("spawn redis-server --sentinel");
            assert!(
                wait_for_port(port, Duration::from_secs(10)),
                "sentinel did not start"
            );
            set.sentinels.push((port, child));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !set.sentinels.iter().all(|(port, _)| {
            set.ask(*port, &["SENTINEL", "REPLICAS", SERVICE])
                .contains("slave")
                && set
                    .ask(*port, &["SENTINEL", "SENTINELS", SERVICE])
                    .matches("127.0.0.1")
                    .count()
                    >= 2
        }) {
            assert!(
                Instant::now() < deadline,
                "the sentinels did not learn of the replica and of each other"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Some(set)
    }

    /// `redis-cli`'s answer from the node or sentinel on `port` (by TLS
    /// for the TLS set).
    fn ask(&self, port: u16, args: &[&str]) -> String {
        redis_cli_tls(port, self.tls.as_ref(), args)
    }

    /// `redis+sentinel://` for the three sentinels and the service
    /// (`rediss+sentinel://…?tls_ca=` for the TLS set).
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|(port, _)| format!("127.0.0.1:{port}"))
            .collect();
        match &self.tls {
            None => format!("redis+sentinel://{}/{SERVICE}/0", sentinels.join(",")),
            Some(tls) => format!(
                "rediss+sentinel://{}/{SERVICE}/0?tls_ca={}",
                sentinels.join(","),
                tls.ca.display()
            ),
        }
    }

    /// The port of the node the sentinels name as master now.
    pub fn master_port(&self) -> Option<u16> {
        let (port, _) = self.sentinels.first()?;
        self.ask(*port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])
            .lines()
            .nth(1)?
            .trim()
            .parse()
            .ok()
    }

    /// What sentinel `i` says of the master (ip, port, flags, epoch).
    pub fn sentinel_view(&self, i: usize) -> String {
        let Some((port, _)) = self.sentinels.get(i) else {
            return String::new();
        };
        self.ask(*port, &["SENTINEL", "MASTER", SERVICE])
            .replace('\n', " ")
    }

    /// The highest configuration epoch the sentinels report (each
    /// failover raises it).
    pub fn config_epoch(&self) -> u64 {
        (0..self.sentinels.len())
            .filter_map(|i| {
                let view = self.sentinel_view(i);
                let mut words = view.split_whitespace();
                words.find(|w| *w == "config-epoch")?;
                words.next()?.parse().ok()
            })
            .max()
            .unwrap_or(0)
    }

    /// The data node on `port`.
    pub fn node(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|n| n.port() == port)
    }

    /// Waits until the sentinels name a master other than `old`, and it
    /// says it is master; its port.
    pub fn wait_failover(&self, old: u16, within: Duration) -> Option<u16> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(port) = self.master_port().filter(|p| *p != old) {
                if self.ask(port, &["ROLE"]).starts_with("master") {
                    return Some(port);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A torture fault: the master SIGKILLed once its replica is in sync; at
/// the fault's end, once the sentinels have promoted the replica, it is
/// started again, empty, as the new master's replica, and the fault ends
/// once it has synced (with `replicas=1` nothing is granted while the
/// master has no replica). The old master restarted empty *as master* is
/// the failover test's case (`integration_sentinel.rs`).
pub struct MasterKilled {
    set: RedisSentinel,
    killed: Option<u16>,
}

impl MasterKilled {
    pub fn new(set: RedisSentinel) -> MasterKilled {
        MasterKilled { set, killed: None }
    }
}

impl crate::faults::Fault for MasterKilled {
    fn start(&mut self, turn: usize) {
        let Some(master) = self.set.master_port() else {
            eprintln!("sentinel fault {turn}: no master named");
            return;
        };
        // A replica that has not synced would be promoted empty: a loss
        // of every lock that no client could prevent.
        let nodes: Vec<u16> = self.set.nodes.iter().map(RedisServer::port).collect();
        let synced = wait_until(Duration::from_secs(30), "the replica's sync", || {
            nodes.iter().any(|port| {
                *port != master
                    && self
                        .set
                        .ask(*port, &["INFO", "replication"])
                        .contains("master_link_status:up")
            })
        });
        if !synced {
            eprintln!("sentinel fault {turn}: not killed");
            return;
        }
        if let Some(node) = self.set.node(master) {
            node.kill();
        }
        // The fault starts now: the failover happens while it is in force.
        self.killed = Some(master);
    }

    fn stop(&mut self, turn: usize) {
        let Some(port) = self.killed.take() else {
            return;
        };
        let Some(master) = self.set.wait_failover(port, Duration::from_secs(30)) else {
            eprintln!("sentinel fault {turn}: no failover within 30 s");
            return;
        };
        if let Some(node) = self.set.node(port) {
            node.restart_replica_of(master);
        }
        wait_until(Duration::from_secs(30), "the restarted node's sync", || {
            self.set
                .ask(port, &["INFO", "replication"])
                .contains("master_link_status:up")
        });
    }
}
