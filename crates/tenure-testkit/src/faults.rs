//! Server faults for `tenure torture` runs that the test drives as the
//! nemesis (`--nemesis-exec`): each turn starts a fault, then stops it.
//! A store's row in the table of stores names the scenarios it is tortured
//! with (the `torture_scenarios` of its `StoreFixture`).

use std::path::PathBuf;

use crate::servers::RedisServer;
use crate::{Cluster, Server};

/// What the test does at each `--nemesis-exec` turn (from 1): start a
/// fault, then stop it.
pub trait Fault: Send + 'static {
    /// Starts the fault of turn `turn`.
    fn start(&mut self, turn: usize);
    /// Undoes it.
    fn stop(&mut self, turn: usize);
}

impl Fault for Box<dyn Fault> {
    fn start(&mut self, turn: usize) {
        (**self).start(turn);
    }
    fn stop(&mut self, turn: usize) {
        (**self).stop(turn);
    }
}

/// A server's own faults: SIGSTOP then SIGCONT, or (every other turn, where
/// the server keeps its data) kill -9 then a restart on its data.
pub struct ServerFault<S> {
    server: S,
    restarts: bool,
    killed: bool,
}

/// The server paused and resumed, each turn.
pub fn paused<S: Server + Send + 'static>(server: S) -> ServerFault<S> {
    ServerFault {
        server,
        restarts: false,
        killed: false,
    }
}

/// The server paused, or every other turn killed and restarted on its data.
pub fn paused_or_restarted<S: Server + Send + 'static>(server: S) -> ServerFault<S> {
    ServerFault {
        server,
        restarts: true,
        killed: false,
    }
}

impl<S: Server + Send + 'static> Fault for ServerFault<S> {
    fn start(&mut self, turn: usize) {
        self.killed = self.restarts && turn.is_multiple_of(2);
        if self.killed {
            self.server.kill();
        } else {
            self.server.pause();
        }
    }
    fn stop(&mut self, _: usize) {
        if std::mem::take(&mut self.killed) {
            self.server.restart();
        } else {
            self.server.resume();
        }
    }
}

/// A cluster's minority killed -9 and restarted on its data, a different
/// member each turn.
pub struct MemberKilled<C> {
    /// The cluster.
    pub cluster: C,
    /// How many members it has.
    pub members: usize,
}

impl<C: Cluster + Send + 'static> Fault for MemberKilled<C> {
    fn start(&mut self, turn: usize) {
        self.cluster.kill_member(turn % self.members);
    }
    fn stop(&mut self, turn: usize) {
        self.cluster.restart_member(turn % self.members);
    }
}

/// Two independent nodes of five killed -9, and restarted empty after the
/// fault's 1.5–3 TTLs (the delayed restart a quorum of independent nodes
/// asks for), other nodes each turn.
pub struct TwoNodesKilled(pub Vec<RedisServer>);

impl TwoNodesKilled {
    fn two(&self, turn: usize) -> [usize; 2] {
        let n = self.0.len();
        [turn % n, (turn + 2) % n]
    }
}

impl Fault for TwoNodesKilled {
    fn start(&mut self, turn: usize) {
        for i in self.two(turn) {
            self.0[i].kill();
        }
    }
    fn stop(&mut self, turn: usize) {
        for i in self.two(turn) {
            self.0[i].restart();
        }
    }
}

/// A server's wall clock stepped 30 s forward for the fault, back after it
/// (libfaketime, through the test kit's clock file).
pub struct ClockJump(pub PathBuf);

impl ClockJump {
    fn set(&self, offset: &str) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset}\n")).expect("write the clock file");
        std::fs::rename(&tmp, &self.0).expect("move the clock file");
    }
}

impl Fault for ClockJump {
    fn start(&mut self, _: usize) {
        self.set("+30");
    }
    fn stop(&mut self, _: usize) {
        self.set("+0");
    }
}

/// `A` on odd turns, `B` on even ones (each counting its own turns).
pub struct Alternate<A, B>(pub A, pub B);

impl<A: Fault, B: Fault> Fault for Alternate<A, B> {
    fn start(&mut self, turn: usize) {
        if turn % 2 == 1 {
            self.0.start(turn.div_ceil(2));
        } else {
            self.1.start(turn / 2);
        }
    }
    fn stop(&mut self, turn: usize) {
        if turn % 2 == 1 {
            self.0.stop(turn.div_ceil(2));
        } else {
            self.1.stop(turn / 2);
        }
    }
}

/// A fault that also keeps alive what the store needs besides the servers it
/// drives (the other nodes, a server whose clock it steps).
pub struct Keeping<F>(pub F, pub Box<dyn Send>);

impl<F: Fault> Fault for Keeping<F> {
    fn start(&mut self, turn: usize) {
        self.0.start(turn);
    }
    fn stop(&mut self, turn: usize) {
        self.0.stop(turn);
    }
}

/// A store started for a torture scenario: its URL and the fault the test
/// drives.
pub struct Faulted {
    /// A URL with working credentials.
    pub url: String,
    /// The fault, which owns the servers.
    pub fault: Box<dyn Fault>,
}

impl Faulted {
    /// A store at `url` whose servers `fault` owns.
    pub fn new(url: String, fault: impl Fault) -> Faulted {
        Faulted {
            url,
            fault: Box::new(fault),
        }
    }
}

/// One way to torture a store with faults of its servers.
#[derive(Clone, Copy)]
pub struct TortureScenario {
    /// What it does, as a test names it (`server_paused_and_restarted`).
    pub name: &'static str,
    /// The TTL of the run's leases.
    pub ttl: &'static str,
    /// Starts the store and its fault; `None` where a server is missing
    /// (and this is not CI).
    pub start: fn() -> Option<Faulted>,
}

impl std::fmt::Debug for TortureScenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// A store's long torture run (`scripts/torture`): at least 10,000 grants
/// with every fault this machine can inject there.
#[derive(Clone, Copy)]
pub struct LongRun {
    /// The TTL of the run's leases.
    pub ttl: &'static str,
    /// The harness's own faults (`--faults`).
    pub faults: &'static str,
    /// The server faults the test drives beside them, if any.
    pub scenario: Option<fn() -> Option<Faulted>>,
}

impl std::fmt::Debug for LongRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LongRun")
            .field("ttl", &self.ttl)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

/// Every client and network fault of the harness.
pub const NETWORK_AND_CLIENT: &str = "partition,delay,hold,kill,pause";
