//! A Redis Cluster: three masters and three replicas (`redis-server
//! --cluster-enabled yes`, formed by `redis-cli --cluster create`), which
//! fails a master over two seconds after it stops answering.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::missing;
use crate::servers::{redis_cli as ask, wait_until, RedisServer};

/// Six nodes; which are masters changes with failovers.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the nodes, forms the cluster and waits until every node sees
    /// it whole and every replica has synced; fails on CI and skips
    /// elsewhere without `redis-server`.
    pub fn start_or_skip() -> Option<RedisCluster> {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let Some(node) = RedisServer::start_cluster_node() else {
                missing("redis-server", "redis-server");
                return None;
            };
            nodes.push(node);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let formed = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(formed.success(), "redis-cli --cluster create failed");
        let set = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        // Formed: every node sees the cluster whole, and three masters
        // each have a replica that has synced (one that has not could be
        // promoted empty).
        while !(set.nodes.iter().all(|n| {
            let info = ask(n.port(), &["CLUSTER", "INFO"]);
            info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:6")
        }) && set
            .nodes
            .iter()
            .filter(|n| {
                let replication = ask(n.port(), &["INFO", "replication"]);
                replication.contains("role:master")
                    && replication.contains("connected_slaves:1")
                    && replication.contains("state=online")
            })
            .count()
            == 3
            && set
                .nodes
                .iter()
                .filter(|n| {
                    ask(n.port(), &["INFO", "replication"]).contains("master_link_status:up")
                })
                .count()
                == 3)
        {
            assert!(Instant::now() < deadline, "the cluster did not form");
            std::thread::sleep(Duration::from_millis(200));
        }
        let ports: Vec<u16> = set.nodes.iter().map(RedisServer::port).collect();
        super::redis::declare_new(&Self::url_via(&ports));
        Some(set)
    }

    /// A `redis+cluster://` URL that names the nodes on `ports`.
    pub fn url_via(ports: &[u16]) -> String {
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// A `redis+cluster://` URL that names one node which does not hold
    /// `key`'s slot (so tenure must follow the cluster to find it).
    pub fn url_not_at(&self, key: &str) -> String {
        let owner = self.owner(self.slot(key));
        let other = self
            .nodes
            .iter()
            .map(RedisServer::port)
            .find(|p| Some(*p) != owner)
            .expect("six nodes");
        Self::url_via(&[other])
    }

    /// The slot `key` hashes to.
    pub fn slot(&self, key: &str) -> u16 {
        self.live_ports()
            .find_map(|p| ask(p, &["CLUSTER", "KEYSLOT", key]).trim().parse().ok())
            .expect("a node answers CLUSTER KEYSLOT")
    }

    fn live_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes
            .iter()
            .map(RedisServer::port)
            .filter(|p| ask(*p, &["PING"]).trim() == "PONG")
    }

    /// The port of the master that holds `slot` now, as the first live
    /// node sees it.
    pub fn owner(&self, slot: u16) -> Option<u16> {
        let nodes = self
            .live_ports()
            .map(|p| ask(p, &["CLUSTER", "NODES"]))
            .next()?;
        nodes.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.contains("master") || flags.contains("fail") {
                return None;
            }
            let holds = fields.iter().skip(8).any(|range| {
                let mut ends = range.splitn(2, '-');
                match (
                    ends.next().and_then(|a| a.parse::<u16>().ok()),
                    ends.next().map(|b| b.parse::<u16>().ok()),
                ) {
                    (Some(a), None) => a == slot,
                    (Some(a), Some(Some(b))) => (a..=b).contains(&slot),
                    _ => false,
                }
            });
            let port = fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
            holds.then_some(port)
        })
    }

    /// The node on `port`.
    pub fn node(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|n| n.port() == port)
    }

    /// Waits until a master other than `old` holds `slot` and says it is
    /// master; its port.
    pub fn wait_failover(&self, slot: u16, old: u16, within: Duration) -> Option<u16> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(port) = self.owner(slot).filter(|p| *p != old) {
                if ask(port, &["ROLE"]).starts_with("master") {
                    return Some(port);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// A master other than `not`.
    pub fn other_master(&self, not: u16) -> Option<u16> {
        self.live_ports()
            .find(|p| *p != not && ask(*p, &["ROLE"]).starts_with("master"))
    }

    /// Moves `slot` from its master to the master on `to` as `redis-cli
    /// --cluster reshard` does: `SETSLOT IMPORTING` and `MIGRATING`, then
    /// `MIGRATE` the keys, `batch` at a time with `pause` after each batch
    /// (a batch smaller than the slot's keys leaves it half moved for a
    /// while), then `SETSLOT NODE` everywhere. Blocking; the number of keys
    /// moved.
    pub fn migrate_slot(&self, slot: u16, to: u16, batch: usize, pause: Duration) -> usize {
        let from = self.owner(slot).expect("the slot has a master");
        assert_ne!(from, to, "the slot is already there");
        let id = |port: u16| ask(port, &["CLUSTER", "MYID"]).trim().to_string();
        let (from_id, to_id) = (id(from), id(to));
        let slot = slot.to_string();
        let ok = |port: u16, args: &[&str]| {
            let said = ask(port, args);
            assert!(said.trim() == "OK", "{args:?} on {port}: {said}");
        };
        ok(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        ok(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
        let mut moved = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "the slot's keys did not move");
            let keys = ask(
                from,
                &["CLUSTER", "GETKEYSINSLOT", &slot, &batch.to_string()],
            );
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let to_port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().copied());
            let said = ask(from, &args);
            assert!(matches!(said.trim(), "OK" | "NOKEY"), "MIGRATE: {said}");
            moved += keys.len();
            std::thread::sleep(pause);
        }
        // The new owner first, then the old, then everyone else.
        ok(to, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        ok(from, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        for port in self.live_ports().filter(|p| *p != from && *p != to) {
            if ask(port, &["ROLE"]).starts_with("master") {
                ok(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
            }
        }
        moved
    }
}

/// A torture fault: the master of `key`'s slot SIGKILLed once its replica
/// is in sync; at the fault's end, once the cluster has promoted the
/// replica, it is started again (its cluster configuration kept, its data
/// not), and the fault ends once it has rejoined as a replica and synced.
pub struct SlotMasterKilled {
    set: RedisCluster,
    slot: u16,
    killed: Option<u16>,
}

impl SlotMasterKilled {
    pub fn new(set: RedisCluster, key: &str) -> SlotMasterKilled {
        let slot = set.slot(key);
        SlotMasterKilled {
            set,
            slot,
            killed: None,
        }
    }
}

impl crate::faults::Fault for SlotMasterKilled {
    fn start(&mut self, turn: usize) {
        let Some(master) = self.set.owner(self.slot) else {
            eprintln!("cluster fault {turn}: the slot has no master");
            return;
        };
        // A replica that has not synced would be promoted empty.
        if !wait_until(Duration::from_secs(30), "the replica's sync", || {
            ask(master, &["INFO", "replication"]).contains("state=online")
        }) {
            eprintln!("cluster fault {turn}: not killed");
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
        if self
            .set
            .wait_failover(self.slot, port, Duration::from_secs(30))
            .is_none()
        {
            eprintln!("cluster fault {turn}: no failover within 30 s");
        }
        if let Some(node) = self.set.node(port) {
            node.restart();
        }
        wait_until(Duration::from_secs(30), "the restarted node's sync", || {
            ask(port, &["INFO", "replication"]).contains("master_link_status:up")
        });
    }
}
