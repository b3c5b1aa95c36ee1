//! MariaDB from Debian's binaries.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::*;
use crate::{free_port, missing, SteppableClock, TlsFiles, PASSWORD};

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
