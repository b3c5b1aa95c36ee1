//! `redis-server`: one server, or several side by side.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::*;
use crate::{free_port, missing, TlsFiles};

/// A `redis-server` of its own.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    password: Option<String>,
    tls: Option<TlsFiles>,
    /// The master it starts as a replica of (`--replicaof`), if any.
    replica_of: Option<u16>,
    /// Whether it is a node of a Redis Cluster (`--cluster-enabled yes`).
    cluster: bool,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts one on a free port, or `None` (after [`missing`]) without the binary.
    pub fn start() -> Option<RedisServer> {
        Self::start_with_password(None)
    }

    /// Starts one that requires `password`.
    pub fn start_with_password(password: Option<&str>) -> Option<RedisServer> {
        find("redis-server", &["/usr/bin/redis-server"])?;
        let mut server = RedisServer {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            password: password.map(str::to_string),
            tls: None,
            replica_of: None,
            cluster: false,
            child: None,
        };
        server.launch();
        declare_new(&server.url());
        Some(server)
    }

    /// Starts one that speaks only TLS, with a certificate of a test CA
    /// (fails on CI and skips elsewhere without `redis-server` or `openssl`).
    pub fn start_tls_or_skip() -> Option<RedisServer> {
        let dir = tempfile::tempdir().expect("temp dir");
        let tls = TlsFiles::make(dir.path())?;
        let mut server = Self::start_tls_with(tls)?;
        // The files live in the server's own directory.
        server.dir = dir;
        Some(server)
    }

    /// Starts one that speaks only TLS with the given files, which the
    /// caller keeps (several servers may share one CA).
    pub fn start_tls_with(tls: TlsFiles) -> Option<RedisServer> {
        Self::start_tls_with_replica(tls, None)
    }

    fn start_tls_with_replica(tls: TlsFiles, replica_of: Option<u16>) -> Option<RedisServer> {
        if find("redis-server", &["/usr/bin/redis-server"]).is_none() {
            missing("redis-server", "redis-server");
            return None;
        }
        let mut server = RedisServer {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            password: None,
            tls: Some(tls),
            replica_of,
            cluster: false,
            child: None,
        };
        server.launch();
        if replica_of.is_none() {
            declare_new(&server.url());
        }
        Some(server)
    }

    /// Starts one that replicates the server on `master` (`--replicaof`,
    /// each time it is started), or `None` without the binary.
    pub fn start_replica_of(master: u16) -> Option<RedisServer> {
        find("redis-server", &["/usr/bin/redis-server"])?;
        let mut server = RedisServer {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            password: None,
            tls: None,
            replica_of: Some(master),
            cluster: false,
            child: None,
        };
        server.launch();
        Some(server)
    }

    /// Starts one that speaks only TLS with the given files and replicates
    /// the server on `master` (by TLS).
    pub fn start_tls_replica_of(master: u16, tls: TlsFiles) -> Option<RedisServer> {
        Self::start_tls_with_replica(tls, Some(master))
    }

    /// Starts a node of a Redis Cluster (not yet in one: see
    /// [`crate::RedisCluster`]) on a port whose bus port (port + 10000) is
    /// free too, or `None` without the binary. It keeps its `nodes.conf`
    /// across [`RedisServer::restart`], as a node whose disk survived.
    pub fn start_cluster_node() -> Option<RedisServer> {
        find("redis-server", &["/usr/bin/redis-server"])?;
        let port = loop {
            let port = free_port();
            if port < 55535 && std::net::TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
                break port;
            }
        };
        let mut server = RedisServer {
            port,
            dir: tempfile::tempdir().expect("temp dir"),
            password: None,
            tls: None,
            replica_of: None,
            cluster: true,
            child: None,
        };
        server.launch();
        Some(server)
    }

    /// The TLS files, for a server started with [`RedisServer::start_tls_or_skip`].
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// Like [`RedisServer::start`], but fails on CI and skips elsewhere.
    pub fn start_or_skip() -> Option<RedisServer> {
        let server = Self::start();
        if server.is_none() {
            missing("redis-server", "redis-server");
        }
        server
    }

    fn launch(&mut self) {
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            None => cmd.args(["--port", &self.port.to_string()]),
            Some(tls) => cmd
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args(["--tls-auth-clients", "no"])
                // A replica reaches its master by TLS too.
                .args(["--tls-replication", "yes"]),
        };
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            // A replica syncs at once (Redis waits 5 s for more replicas).
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(p) = &self.password {
            cmd.args(["--requirepass", p]);
        }
        if self.cluster {
            // A failed master is failed over after two seconds (a shorter
            // wait saw a loaded machine fail a healthy one over).
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]);
        }
        if let Some(master) = self.replica_of {
            cmd.args(["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        self.child = Some(spawn_tied(cmd).expect("spawn redis-server"));
        assert!(
            wait_for_port(self.port, Duration::from_secs(10)),
            "redis-server did not start"
        );
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `redis://` URL for it (with the password, if any).
    pub fn url(&self) -> String {
        if let Some(tls) = &self.tls {
            return format!(
                "rediss://127.0.0.1:{}/0?tls_ca={}",
                self.port,
                tls.ca.display()
            );
        }
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}/0", self.port),
            None => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    /// The directory it runs in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGKILLs the server; its data is gone (no persistence).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Starts it again on the same port, empty, as a replica of the server
    /// on `master` (as a supervisor whose configuration follows the
    /// failovers would).
    pub fn restart_replica_of(&mut self, master: u16) {
        self.kill();
        self.replica_of = Some(master);
        self.launch();
    }

    /// SIGSTOP: the server stops answering but keeps its connections.
    pub fn pause(&self) {
        if let Some(child) = &self.child {
            unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
        }
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        if let Some(child) = &self.child {
            unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// Declares the store at `url` (its default prefix) new, as an operator
/// runs `tenure init` once on a new Redis: the kit's servers start empty,
/// and tenure otherwise takes an empty keyspace for one that lost what it
/// held and grants nothing on it for its max_ttl. A restart
/// ([`RedisServer::restart`]) is a loss, and is not declared. Skipped
/// where this build of tenure cannot open the URL (a scheme whose feature
/// is off); any other failure fails the test.
pub fn declare_new(url: &str) {
    let url = url.to_string();
    // A thread of its own: the caller may be inside a runtime.
    let declared = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let store = match tenure::open(&url).await {
                Err(tenure::Error::BackendDisabled { .. } | tenure::Error::Unsupported { .. }) => {
                    return Ok(())
                }
                other => other?,
            };
            store.declare_new().await.map(|_| ())
        })
    })
    .join()
    .expect("declaring the store new");
    if let Err(e) = declared {
        panic!("declaring the kit's new Redis new: {e}");
    }
}
