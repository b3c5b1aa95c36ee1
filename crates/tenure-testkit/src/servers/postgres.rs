//! PostgreSQL from Debian's binaries.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::*;
use crate::{free_port, missing, SteppableClock, TlsFiles, PASSWORD};

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
