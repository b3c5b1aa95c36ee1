//! Test support for tenure: real servers from Debian's packages on free
//! loopback ports in temporary directories, which a test may kill, pause
//! (SIGSTOP) and restart.
//!
//! A server binary that is missing is a test failure when `CI=true`, and a
//! loud skip (the caller gets `None`) otherwise.

use std::net::TcpListener;

/// Whether this run is CI, where a missing server is a failure.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Handles a missing server binary: panics on CI, else says so and returns.
pub fn missing(what: &str, package: &str) {
    if on_ci() {
        panic!("{what} is not installed (Debian package {package}); CI=true makes this a failure");
    }
    eprintln!(
        "SKIPPED: {what} is not installed (apt-get install {package}); its tests did not run"
    );
}

pub mod conformance;
pub mod counting;

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

mod clock;
pub mod faults;
mod process;
pub mod servers;
pub mod stores;
mod tls;

pub use clock::SteppableClock;
pub use process::spawn_tied;
pub use servers::{
    ClockedServer, Cluster, EtcdCluster, MariaDbServer, PostgresServer, RedisCluster,
    RedisSentinel, RedisServer, Server, ZkEnsemble,
};
pub use tls::TlsFiles;

/// The password of the kit's PostgreSQL and MariaDB servers.
pub const PASSWORD: &str = "tenure-test";
