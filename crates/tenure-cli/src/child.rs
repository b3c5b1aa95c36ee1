//! Running the user's command while a lease is held, and stopping its whole
//! process group before the lease can run out, even if tenure itself is
//! killed or stopped: the command runs under the supervisor
//! ([`crate::supervise`]), which tenure feeds with each confirmed renewal's
//! deadline.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::exit::{self, Failure};
use crate::supervise::{self, group_exists, signal_group};
use tenure::Session;

/// How often tenure looks for a newer lease deadline to pass on.
const DEADLINE_POLL: Duration = Duration::from_millis(50);

/// A second SIGINT within this long kills the command's group.
pub const SECOND_INTERRUPT: Duration = Duration::from_secs(3);

/// SIGINT, SIGTERM and SIGHUP delivered to tenure.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    pub fn new() -> Result<Self, Failure> {
        let make = |kind| {
            signal(kind)
                .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            int: make(SignalKind::interrupt())?,
            term: make(SignalKind::terminate())?,
            hup: make(SignalKind::hangup())?,
        })
    }

    /// The next signal's number.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
        }
    }
}

/// Passes signals on to a command's group: a second SIGINT within
/// [`SECOND_INTERRUPT`] of the first becomes SIGKILL.
#[derive(Default)]
struct Escalation {
    last_interrupt: Option<Instant>,
}

impl Escalation {
    /// The signal to send the group for `sig` delivered to tenure.
    fn for_signal(&mut self, sig: i32) -> i32 {
        if sig != libc::SIGINT {
            return sig;
        }
        let now = Instant::now();
        let again = self
            .last_interrupt
            .is_some_and(|t| now.duration_since(t) < SECOND_INTERRUPT);
        self.last_interrupt = Some(now);
        if again {
            tracing::warn!("second SIGINT: killing the command's process group (SIGKILL)");
            libc::SIGKILL
        } else {
            tracing::info!(
                "passing SIGINT on to the command (a second one within {}s kills it)",
                SECOND_INTERRUPT.as_secs()
            );
            sig
        }
    }
}

/// How the command ended.
#[derive(Debug)]
pub enum Outcome {
    /// It exited by itself (or from a signal we passed on) with this code.
    Exited(u8),
    /// The lease was lost or at risk, and the process group was terminated.
    LeaseLost(String),
}

/// The lease's local deadline as an absolute `CLOCK_BOOTTIME` reading, for
/// the supervisor. The boot clock is read first: any delay before the
/// monotonic reading makes the result earlier, never later.
fn boot_deadline(session: &Session) -> Option<Duration> {
    let boot = supervise::boot_time()?;
    let deadline = session.deadline();
    let left = deadline.saturating_duration_since(Instant::now());
    Some(boot + left)
}

/// Whether `program` can be run, as `execvp` would look it up: 127 when it
/// is not found, 126 when found but not executable.
pub fn check_command(command: &[String]) -> Result<(), Failure> {
    let program = command
        .first()
        .ok_or_else(|| Failure::new(exit::USAGE, "no command given after --"))?;
    let runnable = |p: &Path| -> Option<bool> {
        let meta = std::fs::metadata(p).ok()?;
        let c = CString::new(p.as_os_str().as_bytes()).ok()?;
        // SAFETY: access(2) reads a NUL-terminated path we own.
        let exec = unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0;
        Some(meta.is_file() && exec)
    };
    let found = if program.contains('/') {
        runnable(Path::new(program))
    } else {
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        let mut found = None;
        for dir in std::env::split_paths(&path) {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            match runnable(&dir.join(program)) {
                Some(true) => {
                    found = Some(true);
                    break;
                }
                Some(false) => found = Some(false),
                None => {}
            }
        }
        found
    };
    match found {
        Some(true) => Ok(()),
        Some(false) => Err(Failure::new(
            126,
            format!("cannot run {program:?}: not an executable file (permission denied)"),
        )),
        None => Err(Failure::new(
            127,
            format!("cannot run {program:?}: command not found"),
        )),
    }
}

/// What the supervisor tells tenure.
#[derive(Debug)]
enum Report {
    Started(i32),
    SpawnFailed(u8, String),
    Terminating,
    Killing,
    Ended(u8),
}

fn parse_report(line: &str) -> Option<Report> {
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    Some(match word {
        "P" => Report::Started(rest.trim().parse().ok()?),
        "E" => {
            let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
            Report::SpawnFailed(code.parse().ok()?, message.to_string())
        }
        "T" => Report::Terminating,
        "K" => Report::Killing,
        "X" => Report::Ended(rest.trim().parse().ok()?),
        _ => return None,
    })
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Failure> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into an array we own.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(Failure::new(
            exit::SOFTWARE,
            format!("cannot make a pipe: {}", std::io::Error::last_os_error()),
        ));
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and ours alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The command, running under its supervisor.
struct Supervised {
    supervisor: tokio::process::Child,
    /// The control pipe's write end (non-blocking); dropping it tells the
    /// supervisor to kill the group.
    ctl: Option<std::fs::File>,
    reports: mpsc::UnboundedReceiver<Report>,
    pgid: Option<i32>,
    ended: bool,
}

impl Supervised {
    /// Starts the supervisor, which starts the command. `deadline` (boot
    /// clock) is enforced from the start; `None` means no lease to enforce
    /// (the supervisor still kills the group if tenure dies).
    fn spawn(
        command: &[String],
        env: &[(&str, String)],
        grace: Duration,
        deadline: Option<Duration>,
    ) -> Result<Supervised, Failure> {
        if command.is_empty() {
            return Err(Failure::new(exit::USAGE, "no command given after --"));
        }
        // /proc/self/exe still runs this binary if its file was replaced or
        // deleted since (an upgrade), where current_exe() names a path that
        // is gone.
        let exe = match std::fs::symlink_metadata("/proc/self/exe").is_ok() {
            true => PathBuf::from("/proc/self/exe"),
            false => std::env::current_exe().map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("cannot find tenure's own binary: {e}"),
                )
            })?,
        };
        let (ctl_r, ctl_w) = pipe()?;
        let (rep_r, rep_w) = pipe()?;
        let (ctl_fd, rep_fd) = (ctl_r.as_raw_fd(), rep_w.as_raw_fd());
        let mut cmd = tokio::process::Command::new(exe);
        cmd.arg0("tenure")
            .arg(supervise::ARG)
            .arg(ctl_fd.to_string())
            .arg(rep_fd.to_string())
            .arg(std::process::id().to_string())
            .arg(grace.as_nanos().to_string())
            .arg(deadline.map_or_else(|| "-".to_string(), |d| d.as_nanos().to_string()))
            .arg("--")
            .args(command)
            .kill_on_drop(false);
        for (k, v) in env {
            cmd.env(k, v);
        }
        // SAFETY: only async-signal-safe calls (fcntl, prctl). The two pipe
        // ends the supervisor needs survive its exec; the parent-death signal
        // is set before exec so no window is left (the supervisor checks
        // getppid() for a death before this point).
        unsafe {
            cmd.pre_exec(move || {
                for fd in [ctl_fd, rep_fd] {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    supervise::PARENT_DEATH_SIGNAL as libc::c_ulong,
                );
                Ok(())
            });
        }
        let supervisor = cmd.spawn().map_err(|e| {
            Failure::new(
                exit::SOFTWARE,
                format!("cannot start tenure's supervisor process: {e}"),
            )
        })?;
        drop((ctl_r, rep_w));
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let flags = libc::fcntl(ctl_w.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(ctl_w.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let (tx, reports) = mpsc::unbounded_channel();
        let reader = std::fs::File::from(rep_r);
        std::thread::Builder::new()
            .name("tenure-supervisor-reports".into())
            .spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(reader).lines() {
                    let Ok(line) = line else { break };
                    match parse_report(&line) {
                        Some(report) => {
                            if tx.send(report).is_err() {
                                break;
                            }
                        }
                        None => tracing::debug!(%line, "unknown report from the supervisor"),
                    }
                }
            })
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot start a thread: {e}")))?;
        Ok(Supervised {
            supervisor,
            ctl: Some(std::fs::File::from(ctl_w)),
            reports,
            pgid: None,
            ended: false,
        })
    }

    fn send(&mut self, line: &str) {
        use std::io::Write;
        if let Some(ctl) = self.ctl.as_mut() {
            if let Err(e) = ctl.write_all(format!("{line}\n").as_bytes()) {
                tracing::warn!(error = %e, "cannot reach the supervisor");
            }
        }
    }

    /// Passes a signal on to the command's group (SIGKILL at once, also from
    /// here, not only through the supervisor).
    fn signal(&mut self, sig: i32) {
        if sig == libc::SIGKILL {
            if let Some(pgid) = self.pgid {
                signal_group(pgid, libc::SIGKILL);
            }
            self.send("K");
        } else {
            self.send(&format!("S {sig}"));
        }
    }

    /// The next report; `None` when the supervisor is gone.
    async fn next(&mut self) -> Option<Report> {
        let report = self.reports.recv().await;
        if let Some(Report::Started(pgid)) = report {
            self.pgid = Some(pgid);
        }
        if let Some(Report::Ended(_) | Report::SpawnFailed(..)) = report {
            self.ended = true;
        }
        report
    }

    /// Reaps the supervisor after its last report, or after it died: then
    /// kills the group from here and waits (bounded) until it is gone.
    async fn finish(&mut self) {
        if !self.ended {
            if let Some(pgid) = self.pgid {
                tracing::error!(
                    pgid,
                    "the supervisor died: killing the command's group from tenure"
                );
                signal_group(pgid, libc::SIGKILL);
                let until = Instant::now() + Duration::from_secs(5);
                while group_exists(pgid) && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
        self.ctl = None;
        let _ = self.supervisor.wait().await;
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // A run dropped mid-way (cron's --at-most, a lost lease): kill the
        // group now; the closed pipe tells the supervisor the same.
        if !self.ended {
            if let Some(pgid) = self.pgid {
                signal_group(pgid, libc::SIGKILL);
            }
        }
    }
}

/// Runs `command` under the supervisor while `session` holds its lease.
/// The supervisor kills the command's group if tenure dies, SIGTERMs it
/// `grace` before the lease's local deadline and SIGKILLs it at the deadline
/// when no newer deadline came from tenure (tenure stopped, or no renewal
/// confirmed); tenure also has it killed at once when the store says the
/// lease is gone. When the command exits, whatever is left in its group is
/// killed, and this returns only once the group is gone, so nothing of it
/// outlives the lock.
pub async fn run_while_held(
    command: &[String],
    env: &[(&str, String)],
    session: &Session,
    grace: Duration,
    signals: &mut Signals,
) -> Result<Outcome, Failure> {
    let mut sent = session.deadline();
    let mut child = Supervised::spawn(command, env, grace, boot_deadline(session))?;
    let lost = session.lost();
    tokio::pin!(lost);
    let mut lost_seen = false;
    let mut trouble: Option<String> = None;
    let mut escalation = Escalation::default();
    let mut poll = tokio::time::interval(DEADLINE_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            report = child.next() => match report {
                Some(Report::Started(pgid)) => tracing::debug!(pgid, "the command started"),
                Some(Report::SpawnFailed(code, message)) => {
                    child.finish().await;
                    return Err(Failure::new(code, message));
                }
                Some(Report::Terminating) => {
                    tracing::warn!("lease at risk: no renewal confirmed --kill-grace before the lease's local deadline; SIGTERM sent to the command's process group");
                    trouble.get_or_insert_with(|| "no renewal confirmed before the lease's local deadline".into());
                }
                Some(Report::Killing) => {
                    tracing::error!("the lease's local deadline passed with no confirmed renewal; SIGKILL sent to the command's process group");
                    trouble.get_or_insert_with(|| "no renewal confirmed before the lease's local deadline".into());
                }
                Some(Report::Ended(code)) => {
                    child.finish().await;
                    return Ok(match trouble {
                        Some(why) => Outcome::LeaseLost(why),
                        None => Outcome::Exited(code),
                    });
                }
                None => {
                    child.finish().await;
                    return Err(Failure::new(exit::SOFTWARE, "tenure's supervisor process died unexpectedly; the command's process group was killed"));
                }
            },
            reason = &mut lost, if !lost_seen => {
                lost_seen = true;
                tracing::error!(%reason, "lease lost: killing the command's process group");
                child.signal(libc::SIGKILL);
                trouble = Some(reason.to_string());
            }
            _ = poll.tick() => {
                let deadline = session.deadline();
                if deadline != sent {
                    sent = deadline;
                    if let Some(boot) = boot_deadline(session) {
                        child.send(&format!("D {}", boot.as_nanos()));
                    }
                }
            }
            sig = signals.recv() => {
                let sig = escalation.for_signal(sig);
                child.signal(sig);
            }
        }
    }
}

/// The process group of the run in progress, if any, shared with the signal
/// forwarder.
#[derive(Clone, Default)]
pub struct RunningGroup(std::sync::Arc<std::sync::Mutex<Option<i32>>>);

impl RunningGroup {
    fn set(&self, pgid: Option<i32>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = pgid;
    }
    fn get(&self) -> Option<i32> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The process group of the run in progress, if any.
    pub fn current(&self) -> Option<i32> {
        self.get()
    }
}

/// Clears the running group when a run ends or is dropped.
struct ClearOnDrop(RunningGroup);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.set(None);
    }
}

/// Passes SIGINT/SIGTERM/SIGHUP on to the run in progress and resolves (the
/// schedule's shutdown) on the first one. A second SIGINT within
/// [`SECOND_INTERRUPT`] kills the run's group.
pub fn forward_signals_then_stop(
    running: RunningGroup,
) -> Result<impl std::future::Future<Output = ()>, Failure> {
    let mut signals = Signals::new()?;
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut escalation = Escalation::default();
        loop {
            let sig = escalation.for_signal(signals.recv().await);
            if let Some(pgid) = running.get() {
                signal_group(pgid, sig);
            }
            tx.send_replace(true);
        }
    });
    Ok(async move {
        let _ = rx.wait_for(|stop| *stop).await.map(|_| ());
    })
}

/// Runs one tick's command under the supervisor (no lease deadline: the
/// schedule drops this future when the run must stop, which kills the group;
/// the supervisor kills it if tenure dies) and returns its exit code.
pub async fn run_tick(
    command: &[String],
    env: &[(&str, String)],
    running: &RunningGroup,
) -> Result<u8, Failure> {
    let mut child = Supervised::spawn(command, env, Duration::ZERO, None)?;
    let _clear = ClearOnDrop(running.clone());
    loop {
        match child.next().await {
            Some(Report::Started(pgid)) => running.set(Some(pgid)),
            Some(Report::SpawnFailed(code, message)) => {
                child.finish().await;
                return Err(Failure::new(code, message));
            }
            Some(Report::Terminating | Report::Killing) => {}
            Some(Report::Ended(code)) => {
                child.finish().await;
                return Ok(code);
            }
            None => {
                child.finish().await;
                return Err(Failure::new(
                    exit::SOFTWARE,
                    "tenure's supervisor process died unexpectedly; the run's process group was killed",
                ));
            }
        }
    }
}
