//! Test support for tenure: real servers from Debian's packages on free
//! loopback ports in temporary directories, which a test may kill, pause
//! (SIGSTOP) and restart.
//!
//! A server binary that is missing is a test failure when `CI=true`, and a
//! loud skip (the caller gets `None`) otherwise.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

fn find(binary: &str, candidates: &[&str]) -> Option<PathBuf> {
    candidates
        .iter()
        .map(PathBuf::from)
        .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(binary))
                .collect::<Vec<_>>()
        }))
        .find(|p| p.is_file())
}

/// Waits until something accepts TCP connections on `port`.
fn wait_for_port(port: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` so that it dies with the test process: the child gets
/// SIGKILL when its parent *thread* ends (PR_SET_PDEATHSIG), so every server
/// is spawned by one thread that lives as long as the process. Shared servers
/// live in statics that are never dropped; this is what stops them.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::{mpsc, Mutex, OnceLock};
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    });
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("spawner thread gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("spawner thread gone"))?
}

/// A `redis-server` of its own.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    password: Option<String>,
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
            child: None,
        };
        server.launch();
        Some(server)
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
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(p) = &self.password {
            cmd.args(["--requirepass", p]);
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
