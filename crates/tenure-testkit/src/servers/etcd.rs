//! etcd clusters of one or three members.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::*;
use crate::{free_port, missing, TlsFiles};

/// One member of an [`EtcdCluster`].
struct EtcdNode {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// An etcd cluster of its own (1 or 3 members) on loopback, each member in
/// a temp dir, from Debian's `etcd-server`.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    nodes: Vec<EtcdNode>,
    tls: Option<TlsFiles>,
}

impl EtcdCluster {
    /// Starts `members` members, or `None` (after [`missing`]) without `etcd`.
    pub fn start_or_skip(members: usize) -> Option<EtcdCluster> {
        Self::start_with(members, false)
    }

    /// One member that serves clients only over TLS, with a certificate of
    /// a test CA; its [`EtcdCluster::url`] is `etcds://…?tls_ca=…`.
    pub fn start_tls_or_skip() -> Option<EtcdCluster> {
        Self::start_with(1, true)
    }

    fn start_with(members: usize, tls: bool) -> Option<EtcdCluster> {
        if find("etcd", &["/usr/bin/etcd"]).is_none() {
            missing("etcd", "etcd-server");
            return None;
        }
        let dir = memory_dir();
        let tls = match tls {
            true => Some(TlsFiles::make(dir.path())?),
            false => None,
        };
        let nodes = (0..members)
            .map(|i| EtcdNode {
                name: format!("n{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster { dir, nodes, tls };
        for i in 0..members {
            cluster.launch(i, "new");
        }
        for node in &cluster.nodes {
            assert!(
                wait_for_port(node.client_port, Duration::from_secs(20)),
                "etcd did not start"
            );
        }
        Some(cluster)
    }

    fn launch(&mut self, i: usize, state: &str) {
        let initial: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}=http://127.0.0.1:{}", n.name, n.peer_port))
            .collect();
        let node = &self.nodes[i];
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", node.client_port);
        let peer = format!("http://127.0.0.1:{}", node.peer_port);
        let mut cmd = Command::new("etcd");
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key);
        }
        cmd.args(["--name", &node.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&node.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "tenure-test"])
            // Fast elections on loopback.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_tied(cmd).expect("spawn etcd");
        self.nodes[i].child = Some(child);
    }

    /// `etcd://host:port,…` over every member.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client_port))
            .collect();
        match &self.tls {
            Some(tls) => format!("etcds://{}?tls_ca={}", hosts.join(","), tls.ca.display()),
            None => format!("etcd://{}", hosts.join(",")),
        }
    }

    /// Member `i`'s client URL (`http://127.0.0.1:PORT`).
    pub fn client_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.nodes[i].client_port)
    }

    /// How many members it has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no members (never: for clippy's sake).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// POSTs a JSON body to member `i`'s gRPC gateway; the answer's body.
    fn gateway(&self, i: usize, path: &str, body: &str) -> Option<String> {
        use std::io::{Read, Write};
        let port = self.nodes[i].client_port;
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        if !answer.starts_with("HTTP/1.1 200") {
            return None;
        }
        answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
    }

    /// The index of the raft leader, as the members that answer say.
    pub fn leader(&self) -> Option<usize> {
        let field = |body: &str, key: &str| -> Option<String> {
            let at = body.find(&format!("\"{key}\":\""))? + key.len() + 4;
            let rest = &body[at..];
            Some(rest[..rest.find('"')?].to_string())
        };
        (0..self.nodes.len()).find(|i| {
            self.nodes[*i].child.is_some()
                && self
                    .gateway(*i, "/v3/maintenance/status", "{}")
                    .is_some_and(|b| {
                        field(&b, "leader").is_some()
                            && field(&b, "leader") == field(&b, "member_id")
                    })
        })
    }

    /// Waits (bounded) until some member is the raft leader; its index.
    pub fn wait_leader(&self, within: Duration) -> Option<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) = self.leader() {
                return Some(i);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Turns on authentication with a `root` user of this password, through
    /// etcd's JSON gateway (so the kit needs no etcd client).
    pub fn enable_auth(&self, password: &str) {
        let port = self.nodes[0].client_port;
        let post = |path: &str, body: String| {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let request = format!(
                "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(request.as_bytes()).expect("write");
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        // The first call waits for the cluster to have a leader.
        loop {
            let ok = std::panic::catch_unwind(|| {
                post(
                    "/v3/auth/user/add",
                    format!("{{\"name\":\"root\",\"password\":\"{password}\"}}"),
                )
            });
            if ok.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "etcd never took the user");
            std::thread::sleep(Duration::from_millis(200));
        }
        post(
            "/v3/auth/user/grant",
            "{\"user\":\"root\",\"role\":\"root\"}".to_string(),
        );
        post("/v3/auth/enable", "{}".to_string());
    }

    /// SIGKILLs member `i` (its data stays).
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data.
    pub fn restart_member(&mut self, i: usize) {
        self.kill_member(i);
        self.launch(i, "existing");
        let port = self.nodes[i].client_port;
        assert!(
            wait_for_port(port, Duration::from_secs(20)),
            "etcd did not restart"
        );
        // Listening is not having rejoined: a test that kills another
        // member next would leave no quorum (seen under a loaded CI run).
        // etcd's /health says true once the member has a leader and
        // serves a linearizable read (plain HTTP: not with TLS).
        if self.tls.is_none() {
            assert!(
                wait_healthy(port, Duration::from_secs(20)),
                "etcd member {i} did not rejoin in 20 s"
            );
        }
    }

    /// SIGKILLs every member.
    pub fn kill(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill_member(i);
        }
    }

    /// SIGSTOP to every member.
    pub fn pause(&self) {
        signal_all(self.nodes.iter().map(|n| &n.child), libc::SIGSTOP);
    }

    /// SIGCONT after [`EtcdCluster::pause`].
    pub fn resume(&self) {
        signal_all(self.nodes.iter().map(|n| &n.child), libc::SIGCONT);
    }

    /// Starts every member again on its data.
    pub fn restart(&mut self) {
        self.kill();
        for i in 0..self.nodes.len() {
            self.launch(i, "existing");
        }
        for node in &self.nodes {
            assert!(
                wait_for_port(node.client_port, Duration::from_secs(20)),
                "etcd did not restart"
            );
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}
