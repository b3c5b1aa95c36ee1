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

pub mod conformance;

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

/// A temp dir in memory (`/dev/shm`) where there is one: etcd and
/// ZooKeeper fsync every write, which on a busy disk makes tests slow for no
/// gain (the tests kill servers, not machines).
fn memory_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("tenure-testkit-")
            .tempdir_in(shm)
        {
            return dir;
        }
    }
    tempfile::tempdir().expect("temp dir")
}

/// Sends `signal` to `pid` and to every process below it (a server's
/// worker processes, as PostgreSQL's backends), parents first.
fn signal_tree(pid: u32, signal: i32) {
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        let parent = pids[i];
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let Some(child) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces.
                let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<u32>().ok());
                if ppid == Some(parent) && !pids.contains(&child) {
                    pids.push(child);
                }
            }
        }
        i += 1;
    }
    for pid in pids {
        // SAFETY: kill(2) on a pid; no memory is involved.
        unsafe { libc::kill(pid as i32, signal) };
    }
}

/// [`signal_tree`] for each running child of a server.
fn signal_all<'a>(children: impl IntoIterator<Item = &'a Option<Child>>, signal: i32) {
    for child in children.into_iter().flatten() {
        signal_tree(child.id(), signal);
    }
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

/// Whether the etcd member on `port` answers `/health` with true within
/// `within`.
fn wait_healthy(port: u16, within: Duration) -> bool {
    use std::io::{Read, Write};
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let healthy = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut stream| {
            stream.set_read_timeout(Some(Duration::from_secs(3)))?;
            stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            Ok(answer.contains("\"health\":\"true\""))
        });
        if matches!(healthy, Ok(true)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
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

/// A test CA and a server certificate it signed, for `127.0.0.1` and
/// `localhost`, made with the `openssl` command.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA's certificate (PEM): what clients trust.
    pub ca: PathBuf,
    /// The server's certificate (PEM).
    pub cert: PathBuf,
    /// The server's private key (PEM).
    pub key: PathBuf,
}

impl TlsFiles {
    /// Makes them in `dir`, or `None` (after [`missing`]) without `openssl`.
    pub fn make(dir: &Path) -> Option<TlsFiles> {
        if find("openssl", &["/usr/bin/openssl"]).is_none() {
            missing("openssl", "openssl");
            return None;
        }
        let files = TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        };
        let ca_key = dir.join("ca.key");
        let csr = dir.join("server.csr");
        let ext = dir.join("san.ext");
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1,DNS:localhost\n").expect("write ext");
        let run = |args: &[&std::ffi::OsStr]| {
            let status = Command::new("openssl")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run openssl");
            assert!(status.success(), "openssl {args:?} failed");
        };
        let os = |s: &str| std::ffi::OsString::from(s);
        run(&[
            &os("req"),
            &os("-x509"),
            &os("-newkey"),
            &os("rsa:2048"),
            &os("-nodes"),
            &os("-keyout"),
            ca_key.as_os_str(),
            &os("-out"),
            files.ca.as_os_str(),
            &os("-days"),
            &os("2"),
            &os("-subj"),
            &os("/CN=tenure test CA"),
        ]);
        run(&[
            &os("req"),
            &os("-newkey"),
            &os("rsa:2048"),
            &os("-nodes"),
            &os("-keyout"),
            files.key.as_os_str(),
            &os("-out"),
            csr.as_os_str(),
            &os("-subj"),
            &os("/CN=localhost"),
        ]);
        run(&[
            &os("x509"),
            &os("-req"),
            &os("-in"),
            csr.as_os_str(),
            &os("-CA"),
            files.ca.as_os_str(),
            &os("-CAkey"),
            ca_key.as_os_str(),
            &os("-CAcreateserial"),
            &os("-out"),
            files.cert.as_os_str(),
            &os("-days"),
            &os("2"),
            &os("-extfile"),
            ext.as_os_str(),
        ]);
        Some(files)
    }
}

/// A `redis-server` of its own.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    password: Option<String>,
    tls: Option<TlsFiles>,
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
            child: None,
        };
        server.launch();
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
        if find("redis-server", &["/usr/bin/redis-server"]).is_none() {
            missing("redis-server", "redis-server");
            return None;
        }
        let mut server = RedisServer {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            password: None,
            tls: Some(tls),
            child: None,
        };
        server.launch();
        Some(server)
    }

    /// A `redlock://` URL over these servers (`redlocks://` with the first
    /// one's CA when they speak TLS).
    pub fn redlock_url(servers: &[RedisServer]) -> String {
        let hosts: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        match servers.first().and_then(|s| s.tls.as_ref()) {
            Some(tls) => format!(
                "redlocks://{}/0?tls_ca={}",
                hosts.join(","),
                tls.ca.display()
            ),
            None => format!("redlock://{}/0", hosts.join(",")),
        }
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
                .args(["--tls-auth-clients", "no"]),
        };
        cmd.args(["--bind", "127.0.0.1"])
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

/// Looks up a system user's uid and gid (such as `postgres`).
fn system_user(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&name) && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}

/// A temporary directory the server's own user can use (a plain temp dir is
/// 0700 and root's).
fn server_dir(uid: u32, gid: u32) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("tenure-testkit-")
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
    dir
}

fn postgres_bin(name: &str) -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin").join(name)))
        .filter(|p| p.is_file())
        .collect();
    versions.sort();
    versions.pop()
}

/// A server's wall clock that a test can step, forward or back: the server
/// runs under libfaketime (Debian's `libfaketime`), which reads the offset
/// from a file at every clock call (`FAKETIME_NO_CACHE`). Only the wall
/// clock moves (`FAKETIME_DONT_FAKE_MONOTONIC`), as in an NTP step or an
/// operator's `date -s`. (`redis-server` crashes under libfaketime, and Go's
/// etcd ignores it.)
pub struct SteppableClock {
    file: PathBuf,
    library: PathBuf,
    offset_s: std::sync::atomic::AtomicI64,
}

impl SteppableClock {
    /// A clock file in `dir` at offset 0, or `None` (after [`missing`])
    /// without libfaketime.
    fn new(dir: &Path) -> Option<SteppableClock> {
        let library = std::fs::read_dir("/usr/lib")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("faketime/libfaketime.so.1"))
            .find(|p| p.exists());
        let Some(library) = library else {
            missing("libfaketime", "libfaketime");
            return None;
        };
        let clock = SteppableClock {
            file: dir.join("faketime"),
            library,
            offset_s: std::sync::atomic::AtomicI64::new(0),
        };
        clock.write(0);
        Some(clock)
    }

    fn write(&self, offset_s: i64) {
        // Written aside and renamed, so the server never reads half a line.
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset_s:+}\n")).expect("write the clock file");
        std::fs::rename(&tmp, &self.file).expect("move the clock file");
    }

    fn apply(&self, cmd: &mut Command) {
        cmd.env("LD_PRELOAD", &self.library)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }

    /// The file libfaketime reads the offset from (a line such as `+30`),
    /// for a test that steps the clock from another process.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Steps the server's wall clock by `seconds` (negative: back).
    pub fn step(&self, seconds: i64) {
        let now = self
            .offset_s
            .fetch_add(seconds, std::sync::atomic::Ordering::SeqCst)
            + seconds;
        self.write(now);
    }

    /// How far the server's wall clock is from this machine's, in seconds.
    pub fn offset(&self) -> i64 {
        self.offset_s.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A PostgreSQL server of its own (`initdb` + `postgres`, run as the
/// `postgres` user, since both refuse root), with password authentication
/// over TCP for the user `postgres`.
pub struct PostgresServer {
    port: u16,
    dir: tempfile::TempDir,
    user: (u32, u32),
    tls: Option<TlsFiles>,
    clock: Option<SteppableClock>,
    child: Option<Child>,
}

/// The password of the kit's PostgreSQL and MariaDB servers.
pub const PASSWORD: &str = "tenure-test";

impl PostgresServer {
    /// Starts one, or `None` (after [`missing`]) without the binaries.
    pub fn start_or_skip() -> Option<PostgresServer> {
        Self::start_with(false)
    }

    /// Starts one that accepts TCP logins only over TLS, with a certificate
    /// of a test CA; its [`PostgresServer::url`] asks for `verify-full`.
    pub fn start_tls_or_skip() -> Option<PostgresServer> {
        Self::start_with(true)
    }

    /// Starts one whose wall clock the test steps ([`Self::clock`]).
    pub fn start_with_clock_or_skip() -> Option<PostgresServer> {
        Self::start_inner(false, true)
    }

    /// The steppable clock of a server started with one.
    pub fn clock(&self) -> Option<&SteppableClock> {
        self.clock.as_ref()
    }

    fn start_with(tls: bool) -> Option<PostgresServer> {
        Self::start_inner(tls, false)
    }

    fn start_inner(tls: bool, steppable: bool) -> Option<PostgresServer> {
        let found = postgres_bin("initdb")
            .zip(postgres_bin("postgres"))
            .zip(system_user("postgres"));
        let Some(((initdb, _), user)) = found else {
            missing("PostgreSQL (initdb, postgres)", "postgresql");
            return None;
        };
        let dir = server_dir(user.0, user.1);
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, PASSWORD).expect("password file");
        std::os::unix::fs::chown(&pwfile, Some(user.0), Some(user.1)).expect("chown");
        use std::os::unix::process::CommandExt;
        let status = Command::new(initdb)
            .arg("-D")
            .arg(dir.path().join("data"))
            .args([
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .uid(user.0)
            .gid(user.1)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed");
        let tls = if tls {
            let data = dir.path().join("data");
            let files = TlsFiles::make(dir.path())?;
            for f in [&files.cert, &files.key, &files.ca] {
                std::os::unix::fs::chown(f, Some(user.0), Some(user.1)).expect("chown");
            }
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600))
                .expect("chmod key");
            let conf = format!(
                "\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                files.cert.display(),
                files.key.display()
            );
            let mut pg_conf = std::fs::read_to_string(data.join("postgresql.conf")).expect("conf");
            pg_conf.push_str(&conf);
            std::fs::write(data.join("postgresql.conf"), pg_conf).expect("write conf");
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\n\
                 hostssl all all 127.0.0.1/32 scram-sha-256\n\
                 hostnossl all all 127.0.0.1/32 reject\n",
            )
            .expect("write pg_hba");
            Some(files)
        } else {
            None
        };
        let clock = if steppable {
            Some(SteppableClock::new(dir.path())?)
        } else {
            None
        };
        let mut server = PostgresServer {
            port: free_port(),
            dir,
            user,
            tls,
            clock,
            child: None,
        };
        server.launch();
        Some(server)
    }

    fn launch(&mut self) {
        use std::os::unix::process::CommandExt;
        let Some(postgres) = postgres_bin("postgres") else {
            panic!("postgres binary vanished");
        };
        let mut cmd = Command::new(postgres);
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .args([
                "-p",
                &self.port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
            ])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .args(["-c", "fsync=off", "-c", "max_connections=200"]);
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd);
        }
        cmd.uid(self.user.0)
            .gid(self.user.1)
            .current_dir(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(spawn_tied(cmd).expect("spawn postgres"));
        assert!(
            wait_for_port(self.port, Duration::from_secs(20)),
            "postgres did not start"
        );
        // The port opens a moment before the server accepts logins.
        std::thread::sleep(Duration::from_millis(300));
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `postgres://` URL with the right password.
    pub fn url(&self) -> String {
        match &self.tls {
            Some(tls) => format!(
                "postgres://postgres:{PASSWORD}@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
                self.port,
                tls.ca.display()
            ),
            None => format!(
                "postgres://postgres:{PASSWORD}@127.0.0.1:{}/postgres",
                self.port
            ),
        }
    }

    /// The TLS files, for a server started with [`PostgresServer::start_tls_or_skip`].
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// SIGKILLs the postmaster (its backends exit when they notice).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            // Backends of a killed postmaster linger briefly and hold the
            // shared memory; wait for the port to close.
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts it again on the same data and port.
    pub fn restart(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(self.dir.path().join("data/postmaster.pid"));
        self.launch();
    }

    /// SIGSTOP to the postmaster and every backend: the server stops
    /// answering but keeps its connections.
    pub fn pause(&self) {
        signal_all([&self.child], libc::SIGSTOP);
    }

    /// SIGCONT after [`PostgresServer::pause`].
    pub fn resume(&self) {
        signal_all([&self.child], libc::SIGCONT);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.resume();
        if let Some(child) = &self.child {
            // SIGQUIT: immediate shutdown of the postmaster and its backends.
            unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
        }
        self.kill();
    }
}

/// A MariaDB server of its own (`mariadb-install-db` + `mariadbd
/// --user=mysql`), with a user `tenure` (password [`PASSWORD`]) and a
/// database `tenure`.
pub struct MariaDbServer {
    port: u16,
    dir: tempfile::TempDir,
    clock: Option<SteppableClock>,
    tls: Option<TlsFiles>,
    child: Option<Child>,
}

impl MariaDbServer {
    /// Starts one, or `None` (after [`missing`]) without the binaries.
    pub fn start_or_skip() -> Option<MariaDbServer> {
        Self::start_inner(false, false)
    }

    /// Starts one whose wall clock the test steps ([`Self::clock`]).
    pub fn start_with_clock_or_skip() -> Option<MariaDbServer> {
        Self::start_inner(true, false)
    }

    /// Starts one that accepts connections only over TLS, with a
    /// certificate of a test CA; its [`MariaDbServer::url`] asks for
    /// `ssl-mode=VERIFY_IDENTITY` with that CA.
    pub fn start_tls_or_skip() -> Option<MariaDbServer> {
        Self::start_inner(false, true)
    }

    /// The TLS files of a server started with [`Self::start_tls_or_skip`].
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The steppable clock of a server started with one.
    pub fn clock(&self) -> Option<&SteppableClock> {
        self.clock.as_ref()
    }

    fn start_inner(steppable: bool, tls: bool) -> Option<MariaDbServer> {
        let install = find("mariadb-install-db", &["/usr/bin/mariadb-install-db"]);
        let server = find("mariadbd", &["/usr/sbin/mariadbd"]);
        let client = find("mariadb", &["/usr/bin/mariadb"]);
        let user = system_user("mysql");
        let (Some(install), Some(_), Some(client), Some(user)) = (install, server, client, user)
        else {
            missing(
                "MariaDB (mariadb-install-db, mariadbd, mariadb)",
                "mariadb-server",
            );
            return None;
        };
        let dir = server_dir(user.0, user.1);
        // Two mariadb-install-db at once in one test binary fail now and
        // then (seen when three servers started together): one at a time.
        static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
        let status = Command::new(install)
            .args([
                "--user=mysql",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ])
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run mariadb-install-db");
        assert!(status.success(), "mariadb-install-db failed");
        let clock = if steppable {
            Some(SteppableClock::new(dir.path())?)
        } else {
            None
        };
        let tls = if tls {
            let files = TlsFiles::make(dir.path())?;
            for f in [&files.cert, &files.key, &files.ca] {
                std::os::unix::fs::chown(f, Some(user.0), Some(user.1)).expect("chown");
            }
            Some(files)
        } else {
            None
        };
        let mut server = MariaDbServer {
            port: free_port(),
            dir,
            clock,
            tls,
            child: None,
        };
        server.launch();
        let setup = format!(
            "CREATE USER 'tenure'@'%' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL ON *.* TO 'tenure'@'%'; CREATE DATABASE tenure;"
        );
        let status = Command::new(client)
            .arg(format!("--socket={}", server.socket().display()))
            .args(["-uroot", "-e", &setup])
            .status()
            .expect("run mariadb");
        assert!(status.success(), "creating the test user failed");
        Some(server)
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn launch(&mut self) {
        use std::os::unix::process::CommandExt;
        let Some((uid, gid)) = system_user("mysql") else {
            panic!("the mysql user vanished");
        };
        let mut cmd = Command::new("mariadbd");
        // Started as the mysql user rather than with --user=mysql: a process
        // that changes its own user loses its parent-death signal, and the
        // server would outlive a test that dies.
        cmd.uid(uid)
            .gid(gid)
            .args(["--bind-address=127.0.0.1", "--skip-log-bin"])
            .args([
                "--innodb-flush-log-at-trx-commit=2",
                "--max-connections=300",
            ])
            .arg(format!(
                "--datadir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", self.socket().display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd);
        }
        if let Some(tls) = &self.tls {
            cmd.arg(format!("--ssl-cert={}", tls.cert.display()))
                .arg(format!("--ssl-key={}", tls.key.display()))
                .arg(format!("--ssl-ca={}", tls.ca.display()))
                .arg("--require-secure-transport=ON");
        }
        self.child = Some(spawn_tied(cmd).expect("spawn mariadbd"));
        assert!(
            wait_for_port(self.port, Duration::from_secs(20)),
            "mariadbd did not start"
        );
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `mysql://` URL with the right password.
    pub fn url(&self) -> String {
        match &self.tls {
            Some(tls) => format!(
                "mysql://tenure:{PASSWORD}@127.0.0.1:{}/tenure?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
                self.port,
                tls.ca.display()
            ),
            None => format!("mysql://tenure:{PASSWORD}@127.0.0.1:{}/tenure", self.port),
        }
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same data and port.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// SIGSTOP: the server stops answering but keeps its connections.
    pub fn pause(&self) {
        signal_all([&self.child], libc::SIGSTOP);
    }

    /// SIGCONT after [`MariaDbServer::pause`].
    pub fn resume(&self) {
        signal_all([&self.child], libc::SIGCONT);
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

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
