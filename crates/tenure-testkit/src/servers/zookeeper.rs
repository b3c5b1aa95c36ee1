//! ZooKeeper ensembles of one or three servers.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::*;
use crate::{free_port, missing, SteppableClock, TlsFiles};

/// One member of a [`ZkEnsemble`].
struct ZkNode {
    client_port: u16,
    child: Option<Child>,
}

/// A ZooKeeper ensemble of its own (1 or 3 servers) on loopback, from
/// Debian's `zookeeper` (run by `zkServer.sh start-foreground`, which execs
/// java, so the child is the server itself).
pub struct ZkEnsemble {
    dir: tempfile::TempDir,
    nodes: Vec<ZkNode>,
    tls: Option<TlsFiles>,
    clock: Option<SteppableClock>,
}

impl ZkEnsemble {
    /// Starts `servers` servers, or `None` (after [`missing`]) without ZooKeeper.
    pub fn start_or_skip(servers: usize) -> Option<ZkEnsemble> {
        Self::start_with(servers, false, false)
    }

    /// One server whose wall clock a test can step ([`SteppableClock`]:
    /// the JVM runs under libfaketime), or `None` (after [`missing`]).
    pub fn start_with_clock_or_skip() -> Option<ZkEnsemble> {
        Self::start_with(1, false, true)
    }

    /// The server's steppable clock, if started with one.
    pub fn clock(&self) -> Option<&SteppableClock> {
        self.clock.as_ref()
    }

    /// One server that takes clients only over TLS (its secure client port,
    /// Netty, a PEM certificate of a test CA; no plain client port); its
    /// [`ZkEnsemble::url`] is `zks://…?tls_ca=…`.
    pub fn start_tls_or_skip() -> Option<ZkEnsemble> {
        Self::start_with(1, true, false)
    }

    /// The test CA and the server's certificate, when it serves over TLS.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    fn start_with(servers: usize, tls: bool, steppable: bool) -> Option<ZkEnsemble> {
        if find("zkServer.sh", &["/usr/share/zookeeper/bin/zkServer.sh"]).is_none()
            || find("java", &["/usr/bin/java"]).is_none()
        {
            missing("ZooKeeper (zkServer.sh) and java", "zookeeper");
            return None;
        }
        let dir = memory_dir();
        let tls = match tls {
            true => Some(TlsFiles::make(dir.path())?),
            false => None,
        };
        let quorum: Vec<(u16, u16)> = (0..servers).map(|_| (free_port(), free_port())).collect();
        let mut nodes = Vec::new();
        for i in 0..servers {
            let data = dir.path().join(format!("zk{i}"));
            std::fs::create_dir_all(&data).expect("zk dir");
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
            let client_port = free_port();
            let listen = match &tls {
                None => format!("clientPort={client_port}\nclientPortAddress=127.0.0.1\n"),
                // ZooKeeper reads PEM key and trust stores (3.5.6 and
                // later); the key store holds the certificate and its key.
                Some(files) => {
                    let both = data.join("server-cert-and-key.pem");
                    let mut pem = std::fs::read(&files.cert).expect("read cert");
                    pem.extend(std::fs::read(&files.key).expect("read key"));
                    std::fs::write(&both, pem).expect("write cert and key");
                    format!(
                        "secureClientPort={client_port}\nsecureClientPortAddress=127.0.0.1\n\
                         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                         ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                         ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
                         ssl.clientAuth=none\n",
                        both.display(),
                        files.ca.display()
                    )
                }
            };
            let mut cfg = format!(
                "tickTime=200\ninitLimit=100\nsyncLimit=10\ndataDir={}\n{listen}\
                 admin.enableServer=false\n\
                 4lw.commands.whitelist=srvr,ruok\nmaxClientCnxns=0\nforceSync=no\nminSessionTimeout=400\nmaxSessionTimeout=60000\n",
                data.display()
            );
            if servers > 1 {
                for (j, (peer, election)) in quorum.iter().enumerate() {
                    cfg.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1));
                }
            }
            std::fs::write(data.join("zoo.cfg"), cfg).expect("zoo.cfg");
            nodes.push(ZkNode {
                client_port,
                child: None,
            });
        }
        let clock = match steppable {
            true => Some(SteppableClock::new(dir.path())?),
            false => None,
        };
        let mut ensemble = ZkEnsemble {
            dir,
            nodes,
            tls,
            clock,
        };
        // Three JVMs starting beside a busy test binary on 2 cores can miss
        // their first election (seen once in CI): one more try, afresh.
        for attempt in 1..=2 {
            for i in 0..servers {
                ensemble.launch(i);
            }
            let serving = (0..servers).all(|i| ensemble.wait_serving(i, Duration::from_secs(40)));
            if serving {
                return Some(ensemble);
            }
            assert!(attempt < 2, "ZooKeeper did not start");
            eprintln!("ZooKeeper did not start in 40 s; starting it again");
            ensemble.kill();
        }
        None
    }

    fn launch(&mut self, i: usize) {
        let data = self.dir.path().join(format!("zk{i}"));
        let mut jvm_flags = "-Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1".to_string();
        if self.tls.is_some() {
            // Netty's server needs netty-codec, which Debian's zookeeper.jar
            // does not list in its class path; a later -cp wins over the
            // script's own.
            jvm_flags.push_str(
                " -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/netty-codec.jar",
            );
        }
        let mut cmd = Command::new("/usr/share/zookeeper/bin/zkServer.sh");
        cmd.arg("start-foreground")
            .arg(data.join("zoo.cfg"))
            .env("ZOO_LOG_DIR", &data)
            .env("ZOO_LOG4J_PROP", "ERROR,CONSOLE")
            .env("JVMFLAGS", jvm_flags)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd);
        }
        self.nodes[i].child = Some(spawn_tied(cmd).expect("spawn ZooKeeper"));
    }

    /// Whether server `i` answers `srvr` (it serves clients) within `within`.
    fn wait_serving(&self, i: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.mode(i).is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Server `i`'s mode (`standalone`, `leader` or `follower`) if it serves.
    pub fn mode(&self, i: usize) -> Option<String> {
        use std::io::{Read, Write};
        if let Some(files) = &self.tls {
            // `srvr` over TLS, through openssl's client.
            let mut child = Command::new("openssl")
                .args(["s_client", "-quiet", "-verify_return_error", "-CAfile"])
                .arg(&files.ca)
                .arg("-connect")
                .arg(format!("127.0.0.1:{}", self.nodes[i].client_port))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .ok()?;
            let mut stdin = child.stdin.take()?;
            let _ = stdin.write_all(b"srvr");
            let mut stdout = child.stdout.take()?;
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut out = String::new();
                let _ = stdout.read_to_string(&mut out);
                let _ = tx.send(out);
            });
            let out = rx.recv_timeout(Duration::from_secs(3)).unwrap_or_default();
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
            return out
                .lines()
                .find_map(|l| l.strip_prefix("Mode: "))
                .map(str::to_string);
        }
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", self.nodes[i].client_port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        stream.write_all(b"srvr").ok()?;
        let mut out = String::new();
        stream.read_to_string(&mut out).ok()?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(str::to_string)
    }

    /// The index of the ensemble's leader, if one is serving.
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|i| {
            matches!(
                self.mode(*i).as_deref(),
                Some("leader") | Some("standalone")
            )
        })
    }

    /// `zk://host:port,…` over every server.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client_port))
            .collect();
        match &self.tls {
            None => format!("zk://{}", hosts.join(",")),
            Some(tls) => format!("zks://{}?tls_ca={}", hosts.join(","), tls.ca.display()),
        }
    }

    /// Server `i`'s client port.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].client_port
    }

    /// SIGKILLs server `i` (its data stays).
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again on its data.
    pub fn restart_member(&mut self, i: usize) {
        self.kill_member(i);
        self.launch(i);
        assert!(
            self.wait_serving(i, Duration::from_secs(30)),
            "ZooKeeper did not restart"
        );
    }

    /// SIGKILLs every server.
    pub fn kill(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill_member(i);
        }
    }

    /// SIGSTOP to every server.
    pub fn pause(&self) {
        signal_all(self.nodes.iter().map(|n| &n.child), libc::SIGSTOP);
    }

    /// SIGCONT after [`ZkEnsemble::pause`].
    pub fn resume(&self) {
        signal_all(self.nodes.iter().map(|n| &n.child), libc::SIGCONT);
    }

    /// Starts every server again on its data.
    pub fn restart(&mut self) {
        self.kill();
        for i in 0..self.nodes.len() {
            self.launch(i);
        }
        for i in 0..self.nodes.len() {
            assert!(
                self.wait_serving(i, Duration::from_secs(30)),
                "ZooKeeper did not restart"
            );
        }
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}
