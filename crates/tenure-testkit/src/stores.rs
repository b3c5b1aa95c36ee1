//! The table of stores: one row per backend of tenure's registry, with what
//! the tests and the benches need to run it — the Debian packages of its
//! server, how to start one of its own, a URL where nothing answers and a
//! URL with an option no backend takes.
//!
//! Everything that tests or measures every store iterates [`STORES`]: the
//! conformance suite, the differential test, the CLI's tests, the torture
//! runs and `scripts/test`'s package list and feature string (through the
//! `tenure-stores` binary). Adding a store is one row here.

use std::path::Path;

use crate::faults::{
    paused, paused_or_restarted, Alternate, ClockJump, Faulted, Keeping, LongRun, MemberKilled,
    TortureScenario, TwoNodesKilled, NETWORK_AND_CLIENT,
};
use crate::servers::{
    redis_cluster, sentinel, ClockedServer, EtcdCluster, MariaDbServer, PostgresServer,
    RedisCluster, RedisSentinel, RedisServer, ZkEnsemble,
};
use crate::Server;

/// A Debian package a store's tests need, and a file or command that shows
/// it is installed.
#[derive(Debug, Clone, Copy)]
pub struct Package {
    /// The package's name, as `apt-get install` takes it.
    pub name: &'static str,
    /// A command on `PATH`, or an absolute path (one `*` component allowed),
    /// that exists once the package is installed.
    pub provides: &'static str,
}

impl Package {
    /// Whether what the package provides is on this machine.
    pub fn is_installed(&self) -> bool {
        if self.provides.starts_with('/') {
            path_exists(self.provides)
        } else {
            std::env::var_os("PATH")
                .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(self.provides).is_file()))
        }
    }
}

/// `path` exists, where one component may be `*` (any directory entry).
fn path_exists(path: &str) -> bool {
    match path.split_once("/*/") {
        None => Path::new(path).exists(),
        Some((dir, rest)) => std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .filter_map(|e| e.ok())
                .any(|e| e.path().join(rest).exists())
        }),
    }
}

/// A store the test kit has started for a test: its URL, and the server a
/// fault check may kill, pause and restart (none for an embedded store, or
/// for one made of several servers that fault checks do not drive as one).
pub struct Running {
    /// A URL with working credentials.
    pub url: String,
    /// The server, for the fault checks.
    pub server: Option<Box<dyn Server + Send + Sync>>,
    /// Whatever must live as long as the store (a temp dir, extra servers).
    _keep: Option<Box<dyn Send + Sync>>,
}

impl Running {
    fn server<S: Server + Send + Sync + 'static>(server: S) -> Running {
        Running {
            url: server.url(),
            server: Some(Box::new(server)),
            _keep: None,
        }
    }

    fn embedded(url: String, keep: Option<Box<dyn Send + Sync>>) -> Running {
        Running {
            url,
            server: None,
            _keep: keep,
        }
    }
}

/// One row: a store as the tests and benches see it.
#[derive(Clone, Copy)]
pub struct StoreFixture {
    /// The backend's name in tenure's registry (`tenure::backends()`).
    pub backend: &'static str,
    /// The Debian packages its server needs (none for an embedded store).
    pub packages: &'static [Package],
    /// The server faults a bounded `tenure torture` run drives on it, one
    /// run each (none for a store without a server).
    pub torture_scenarios: &'static [TortureScenario],
    /// Its long torture run.
    pub long_run: LongRun,
    /// Starts a store of its own, or `None` when its server is not installed
    /// and this is not CI (said on stderr); on CI a missing server panics.
    pub start: fn() -> Option<Running>,
    /// A URL of this store on `port`, where nothing listens.
    pub down_url: Option<fn(u16) -> String>,
    /// A URL that names an option no backend takes (`bogus`) and the
    /// password `hunter2`, with `dir` for a file store.
    pub bad_option_url: fn(&Path) -> String,
    /// URLs the store refuses for an option's value or the URL's shape, each
    /// with the password `hunter2` where the store takes one.
    pub bad_value_urls: &'static [&'static str],
    /// How many random sequences the differential test compares with memory.
    pub differential_seeds: u64,
    /// The network faults a bounded `tenure torture` run must inject on it
    /// (none for a store without a network).
    pub torture_network_faults: &'static [&'static str],
    /// The name (`/proc/PID/comm`) of its server's processes, whose CPU time
    /// the benches charge its runs with (none for an embedded store).
    pub server_process: Option<&'static str>,
}

impl std::fmt::Debug for StoreFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreFixture")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl StoreFixture {
    /// The registry's row for this store.
    pub fn registry(&self) -> Option<&'static tenure::Backend> {
        tenure::backends().iter().find(|b| b.name == self.backend)
    }

    /// Whether this build of tenure has the store (its cargo feature is on).
    pub fn is_built_in(&self) -> bool {
        self.registry().is_some_and(|b| b.is_built_in())
    }

    /// The cargo feature of the `tenure` crate that builds the store in
    /// (empty for memory, which is always there).
    pub fn feature(&self) -> &'static str {
        self.registry().map_or("", |b| b.feature)
    }
}

/// Every store, in the registry's order.
pub static STORES: &[StoreFixture] = &[
    StoreFixture {
        backend: "memory",
        packages: &[],
        torture_scenarios: &[],
        long_run: LongRun {
            ttl: "1s",
            faults: "kill,pause",
            scenario: None,
        },
        start: || Some(Running::embedded("memory://".into(), None)),
        down_url: None,
        bad_option_url: |_| "memory://?bogus=1".into(),
        bad_value_urls: &[],
        differential_seeds: 0,
        torture_network_faults: &[],
        server_process: None,
    },
    StoreFixture {
        backend: "sqlite",
        packages: &[],
        torture_scenarios: &[],
        long_run: LongRun {
            ttl: "1s",
            faults: "kill,pause,clock",
            scenario: None,
        },
        start: || {
            // One file for every check, as several programs share one.
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite://{}", dir.path().join("conformance.db").display());
            Some(Running::embedded(url, Some(Box::new(dir))))
        },
        down_url: None,
        bad_option_url: |dir| format!("sqlite://{}?bogus=1", dir.join("b.db").display()),
        bad_value_urls: &["sqlite://"],
        differential_seeds: 12,
        torture_network_faults: &[],
        server_process: None,
    },
    StoreFixture {
        backend: "redis",
        packages: &[Package {
            name: "redis-server",
            provides: "redis-server",
        }],
        torture_scenarios: &[
            TortureScenario {
                // A killed Redis comes back empty (no persistence): paused only.
                name: "server_paused",
                ttl: "1s",
                start: || RedisServer::start_or_skip().map(|s| Faulted::new(s.url(), paused(s))),
            },
            TortureScenario {
                // Grants wait for the replica (replicas=1): without it, a
                // failover may lose an acknowledged grant (docs/stores/redis.md).
                name: "sentinel_master_killed",
                ttl: "1s",
                start: || {
                    let set = RedisSentinel::start_or_skip()?;
                    let url = format!("{}?replicas=1", set.url());
                    Some(Faulted::new(url, sentinel::MasterKilled::new(set)))
                },
            },
            TortureScenario {
                name: "cluster_master_killed",
                ttl: "1s",
                start: || {
                    let set = RedisCluster::start_or_skip()?;
                    let ports: Vec<u16> = set.nodes.iter().map(RedisServer::port).collect();
                    let url = format!("{}?replicas=1", RedisCluster::url_via(&ports));
                    Some(Faulted::new(
                        url,
                        redis_cluster::SlotMasterKilled::new(set, "{tenure}"),
                    ))
                },
            },
        ],
        long_run: LongRun {
            ttl: "1s",
            faults: NETWORK_AND_CLIENT,
            scenario: Some(|| {
                RedisServer::start_or_skip().map(|s| Faulted::new(s.url(), paused(s)))
            }),
        },
        start: || RedisServer::start_or_skip().map(Running::server),
        down_url: Some(|port| format!("redis://127.0.0.1:{port}/0")),
        bad_option_url: |_| "redis://u:hunter2@127.0.0.1:1/db?bogus=1".into(),
        bad_value_urls: &[
            "redis://:hunter2@127.0.0.1:1/db?prefix=",
            "redis+sentinel://127.0.0.1:1/mymaster?sentinel_password=hunter2&replicas=abc",
        ],
        differential_seeds: 12,
        torture_network_faults: &["partition", "delay", "hold"],
        server_process: Some("redis-server"),
    },
    StoreFixture {
        backend: "redlock",
        packages: &[Package {
            name: "redis-server",
            provides: "redis-server",
        }],
        torture_scenarios: &[
            TortureScenario {
                // One node of three: the majority goes on.
                name: "minority_paused",
                ttl: "1s",
                start: || {
                    let mut nodes = redis_nodes(3)?;
                    let url = redlock_url(&nodes);
                    let node = nodes.remove(0);
                    Some(Faulted::new(url, Keeping(paused(node), Box::new(nodes))))
                },
            },
            TortureScenario {
                name: "five_nodes_two_killed",
                ttl: "1s",
                start: five_nodes_two_killed,
            },
        ],
        long_run: LongRun {
            ttl: "1s",
            faults: NETWORK_AND_CLIENT,
            scenario: Some(five_nodes_two_killed),
        },
        start: || {
            let nodes: Vec<RedisServer> = (0..3)
                .map(|_| RedisServer::start_or_skip())
                .collect::<Option<_>>()?;
            let url = redlock_url(&nodes);
            Some(Running::embedded(url, Some(Box::new(nodes))))
        },
        down_url: None,
        bad_option_url: |_| "redlock://:hunter2@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?bogus=1".into(),
        bad_value_urls: &["redlock://:hunter2@127.0.0.1:1"],
        differential_seeds: 8,
        torture_network_faults: &["partition-minority", "delay", "hold"],
        server_process: Some("redis-server"),
    },
    StoreFixture {
        backend: "postgres",
        packages: &[Package {
            name: "postgresql",
            provides: "/usr/lib/postgresql/*/bin/initdb",
        }],
        torture_scenarios: &clocked_server_scenarios::<PostgresServer>(),
        long_run: LongRun {
            ttl: "1s",
            faults: NETWORK_AND_CLIENT,
            scenario: Some(paused_restarted_or_clock_jumps::<PostgresServer>),
        },
        start: || PostgresServer::start_or_skip().map(Running::server),
        down_url: Some(|port| format!("postgres://postgres:x@127.0.0.1:{port}/postgres")),
        bad_option_url: |_| "postgres://u:hunter2@127.0.0.1:1/db?bogus=1".into(),
        bad_value_urls: &["postgres://bob:hunter2@127.0.0.1:1/db?sslmode=sometimes"],
        differential_seeds: 8,
        torture_network_faults: &["partition", "delay", "hold"],
        server_process: Some("postgres"),
    },
    StoreFixture {
        backend: "mysql",
        packages: &[Package {
            name: "mariadb-server",
            provides: "mariadbd",
        }],
        torture_scenarios: &clocked_server_scenarios::<MariaDbServer>(),
        long_run: LongRun {
            ttl: "1s",
            faults: NETWORK_AND_CLIENT,
            scenario: Some(paused_restarted_or_clock_jumps::<MariaDbServer>),
        },
        start: || MariaDbServer::start_or_skip().map(Running::server),
        down_url: Some(|port| format!("mysql://tenure:x@127.0.0.1:{port}/tenure")),
        bad_option_url: |_| "mysql://u:hunter2@127.0.0.1:1/db?bogus=1".into(),
        bad_value_urls: &["mysql://bob:hunter2@127.0.0.1:1/db?ssl-mode=sometimes"],
        differential_seeds: 8,
        torture_network_faults: &["partition", "delay", "hold"],
        server_process: Some("mariadbd"),
    },
    StoreFixture {
        backend: "etcd",
        packages: &[
            Package {
                name: "etcd-server",
                provides: "etcd",
            },
            // `etcdctl lock` and `elect` beside tenure (`?layout=etcd`).
            Package {
                name: "etcd-client",
                provides: "etcdctl",
            },
        ],
        torture_scenarios: &[
            // etcd's shortest lease is 2 s.
            TortureScenario {
                name: "server_paused_and_restarted",
                ttl: "2s",
                start: || {
                    EtcdCluster::start_or_skip(1)
                        .map(|c| Faulted::new(c.url(), paused_or_restarted(c)))
                },
            },
            TortureScenario {
                name: "three_members_one_killed",
                ttl: "2s",
                start: etcd_member_killed,
            },
        ],
        long_run: LongRun {
            ttl: "2s",
            faults: NETWORK_AND_CLIENT,
            scenario: Some(etcd_member_killed),
        },
        start: || EtcdCluster::start_or_skip(1).map(Running::server),
        down_url: Some(|port| format!("etcd://127.0.0.1:{port}")),
        bad_option_url: |_| "etcd://u:hunter2@127.0.0.1:1/db?bogus=1".into(),
        bad_value_urls: &["etcd://bob:hunter2@db"],
        differential_seeds: 6,
        torture_network_faults: &["partition", "delay", "hold"],
        server_process: Some("etcd"),
    },
    StoreFixture {
        backend: "zookeeper",
        packages: &[Package {
            name: "zookeeper",
            provides: "/usr/share/zookeeper/bin/zkServer.sh",
        }],
        torture_scenarios: &[
            TortureScenario {
                name: "server_paused_and_restarted",
                ttl: "1s",
                start: || {
                    ZkEnsemble::start_or_skip(1)
                        .map(|e| Faulted::new(e.url(), paused_or_restarted(e)))
                },
            },
            TortureScenario {
                name: "three_servers_one_killed",
                ttl: "2s",
                start: zk_member_killed,
            },
            TortureScenario {
                name: "clock_jumps",
                ttl: "1s",
                start: || {
                    let e = ZkEnsemble::start_with_clock_or_skip()?;
                    let clock = e.clock()?.file().to_path_buf();
                    Some(Faulted::new(
                        e.url(),
                        Keeping(ClockJump(clock), Box::new(e)),
                    ))
                },
            },
        ],
        long_run: LongRun {
            ttl: "1s",
            faults: NETWORK_AND_CLIENT,
            scenario: Some(zk_member_killed),
        },
        start: || ZkEnsemble::start_or_skip(1).map(Running::server),
        down_url: Some(|port| format!("zk://127.0.0.1:{port}")),
        bad_option_url: |_| "zk://u:hunter2@127.0.0.1:1?bogus=1".into(),
        bad_value_urls: &["zk://bob:hunter2@127.0.0.1:1/path?max_sessions=lots"],
        differential_seeds: 6,
        torture_network_faults: &["partition", "delay", "hold"],
        server_process: Some("java"),
    },
];

/// `n` redis-servers of their own, or `None` without the binary.
fn redis_nodes(n: usize) -> Option<Vec<RedisServer>> {
    (0..n).map(|_| RedisServer::start_or_skip()).collect()
}

/// Five Redlock nodes, two of them killed and restarted empty each turn.
fn five_nodes_two_killed() -> Option<Faulted> {
    let nodes = redis_nodes(5)?;
    // A node restarted empty grants nothing for max_ttl: 2 s, so that it
    // votes again before the next fault (every 3 s) takes two others.
    let url = format!("{}?max_ttl=2s", redlock_url(&nodes));
    Some(Faulted::new(url, TwoNodesKilled(nodes)))
}

/// Three etcd members, one killed and restarted on its data each turn.
fn etcd_member_killed() -> Option<Faulted> {
    let cluster = EtcdCluster::start_or_skip(3)?;
    let url = cluster.url();
    Some(Faulted::new(
        url,
        MemberKilled {
            cluster,
            members: 3,
        },
    ))
}

/// Three ZooKeeper servers, one killed and restarted on its data each turn.
fn zk_member_killed() -> Option<Faulted> {
    let cluster = ZkEnsemble::start_or_skip(3)?;
    let url = cluster.url();
    Some(Faulted::new(
        url,
        MemberKilled {
            cluster,
            members: 3,
        },
    ))
}

/// A server with a steppable clock: paused or restarted now and then in one
/// run, its clock stepped in the other.
const fn clocked_server_scenarios<S: ClockedServer>() -> [TortureScenario; 2] {
    [
        TortureScenario {
            name: "server_paused_and_restarted",
            ttl: "1s",
            start: paused_and_restarted::<S>,
        },
        TortureScenario {
            name: "clock_jumps",
            ttl: "1s",
            start: clock_jumps::<S>,
        },
    ]
}

fn paused_and_restarted<S: ClockedServer>() -> Option<Faulted> {
    S::start_or_skip().map(|s| Faulted::new(s.url(), paused_or_restarted(s)))
}

fn clock_jumps<S: ClockedServer>() -> Option<Faulted> {
    let s = S::start_with_clock_or_skip()?;
    let clock = s.clock()?.file().to_path_buf();
    Some(Faulted::new(
        s.url(),
        Keeping(ClockJump(clock), Box::new(s)),
    ))
}

/// The long run's: pauses, restarts and clock steps in turn, on one server.
fn paused_restarted_or_clock_jumps<S: ClockedServer>() -> Option<Faulted> {
    let s = S::start_with_clock_or_skip()?;
    let clock = s.clock()?.file().to_path_buf();
    let url = s.url();
    Some(Faulted::new(
        url,
        Alternate(paused_or_restarted(s), ClockJump(clock)),
    ))
}

/// The row of `backend`.
pub fn store(backend: &str) -> Option<&'static StoreFixture> {
    STORES.iter().find(|s| s.backend == backend)
}

/// A `redlock://` URL over these servers (`redlocks://` with the first
/// one's CA when they speak TLS).
pub fn redlock_url(servers: &[RedisServer]) -> String {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    match servers.first().and_then(|s| s.tls()) {
        Some(tls) => format!(
            "redlocks://{}/0?tls_ca={}",
            hosts.join(","),
            tls.ca.display()
        ),
        None => format!("redlock://{}/0", hosts.join(",")),
    }
}
