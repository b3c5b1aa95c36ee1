//! The kit's servers, one file each, and what fault tests do to any of them.

mod etcd;
mod mariadb;
mod postgres;
mod redis;
pub mod redis_cluster;
pub mod sentinel;
mod zookeeper;

pub use etcd::EtcdCluster;
pub use mariadb::MariaDbServer;
pub use postgres::PostgresServer;
pub use redis::{declare_new as declare_redis_new, RedisServer};
pub use redis_cluster::RedisCluster;
pub use sentinel::RedisSentinel;
pub use zookeeper::ZkEnsemble;

/// What fault tests do to any of the kit's servers.
pub trait Server {
    /// A URL for the store, with working credentials.
    fn url(&self) -> String;
    /// SIGKILLs the server.
    fn kill(&mut self);
    /// Starts it again on the same port (and data, where it keeps any).
    fn restart(&mut self);
    /// SIGSTOPs it (every process of it): it stops answering but keeps its
    /// connections.
    fn pause(&self);
    /// SIGCONT after [`Server::pause`].
    fn resume(&self);
}

macro_rules! impl_server {
    ($($t:ty),*) => {$(
        impl Server for $t {
            fn url(&self) -> String { <$t>::url(self) }
            fn kill(&mut self) { <$t>::kill(self) }
            fn restart(&mut self) { <$t>::restart(self) }
            fn pause(&self) { <$t>::pause(self) }
            fn resume(&self) { <$t>::resume(self) }
        }
    )*};
}

impl_server!(
    RedisServer,
    PostgresServer,
    MariaDbServer,
    EtcdCluster,
    ZkEnsemble
);

/// A server whose clock the kit can step (under libfaketime), beside the
/// faults every server takes.
pub trait ClockedServer: Server + Send + Sized + 'static {
    /// Starts one, or `None` when it is not installed (and this is not CI).
    fn start_or_skip() -> Option<Self>;
    /// Starts one whose clock [`ClockedServer::clock`] steps.
    fn start_with_clock_or_skip() -> Option<Self>;
    /// Its clock, when it was started with one.
    fn clock(&self) -> Option<&crate::SteppableClock>;
}

macro_rules! impl_clocked_server {
    ($($t:ty),*) => {$(
        impl ClockedServer for $t {
            fn start_or_skip() -> Option<Self> { <$t>::start_or_skip() }
            fn start_with_clock_or_skip() -> Option<Self> { <$t>::start_with_clock_or_skip() }
            fn clock(&self) -> Option<&crate::SteppableClock> { <$t>::clock(self) }
        }
    )*};
}

impl_clocked_server!(PostgresServer, MariaDbServer);

/// A replicated store whose members a test kills one by one.
pub trait Cluster {
    /// A URL over every member.
    fn url(&self) -> String;
    /// SIGKILLs member `i`.
    fn kill_member(&mut self, i: usize);
    /// Starts member `i` again on its data.
    fn restart_member(&mut self, i: usize);
}

macro_rules! impl_cluster {
    ($($t:ty),*) => {$(
        impl Cluster for $t {
            fn url(&self) -> String { <$t>::url(self) }
            fn kill_member(&mut self, i: usize) { <$t>::kill_member(self, i) }
            fn restart_member(&mut self, i: usize) { <$t>::restart_member(self, i) }
        }
    )*};
}

impl_cluster!(EtcdCluster, ZkEnsemble);

/// `redis-cli -p PORT ARGS…`'s answer (empty when it fails).
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    redis_cli_tls(port, None, args)
}

/// [`redis_cli`], by TLS when `tls` is given (trusting its CA).
pub(crate) fn redis_cli_tls(port: u16, tls: Option<&crate::TlsFiles>, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(tls) = tls {
        cmd.arg("--tls").arg("--cacert").arg(&tls.ca);
    }
    cmd.args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Polls `done` every 100 ms until it holds (true) or `within` has passed
/// (false, after saying on stderr that `what` did not happen).
pub(crate) fn wait_until(
    within: std::time::Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> bool {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        if std::time::Instant::now() > deadline {
            eprintln!("{what} did not happen within {within:?}");
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    true
}
