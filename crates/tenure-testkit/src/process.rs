//! Running the kit's servers: finding binaries, spawning them tied to the
//! test process, signalling their process trees, waiting for their ports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub(crate) fn find(binary: &str, candidates: &[&str]) -> Option<PathBuf> {
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

/// A temp dir in memory (`/dev/shm`) where there is one: the consensus
/// servers fsync every write, which on a busy disk makes tests slow for no
/// gain (the tests kill servers, not machines).
pub(crate) fn memory_dir() -> tempfile::TempDir {
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
pub(crate) fn signal_tree(pid: u32, signal: i32) {
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
pub(crate) fn signal_all<'a>(children: impl IntoIterator<Item = &'a Option<Child>>, signal: i32) {
    for child in children.into_iter().flatten() {
        signal_tree(child.id(), signal);
    }
}

/// Waits until something accepts TCP connections on `port`.
pub(crate) fn wait_for_port(port: u16, within: Duration) -> bool {
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
pub(crate) fn wait_healthy(port: u16, within: Duration) -> bool {
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

/// Looks up a system user's uid and gid (such as `postgres`).
pub(crate) fn system_user(name: &str) -> Option<(u32, u32)> {
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
pub(crate) fn server_dir(uid: u32, gid: u32) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("tenure-testkit-")
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
    dir
}

pub(crate) fn postgres_bin(name: &str) -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin").join(name)))
        .filter(|p| p.is_file())
        .collect();
    versions.sort();
    versions.pop()
}
