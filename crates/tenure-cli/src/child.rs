//! Running the user's command while a lease authorises it — the one
//! supervision path of every runner (`lock`, `elect`, `cron`, `crond`) —
//! and stopping its whole process group before the lease can run out, even
//! if tenure itself is killed or stopped: the command runs under the
//! supervisor ([`crate::supervise`]), which tenure feeds with each confirmed
//! renewal's deadline.
//!
//! Every way a run is stopped is the same: a signal to the whole group
//! (SIGTERM, or the signal tenure itself got), the grace for the whole
//! group, then SIGKILL; never later than the lease's local deadline.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use crate::exit::{self, Failure};
use crate::supervise::{self, group_exists, signal_group};
use tenure::Session;

/// How often tenure looks for a newer lease deadline to pass on.
const DEADLINE_POLL: Duration = Duration::from_millis(50);

/// A second SIGINT within this long kills the command's group.
pub const SECOND_INTERRUPT: Duration = Duration::from_secs(3);

/// The signals whoever started tenure left ignored, read first thing in
/// `main` (see [`supervise::ignored_signals`]); every command starts with
/// these ignored and every other signal at its default.
static INHERITED_IGNORED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Records the signals ignored when tenure started; called before anything
/// in tenure changes a disposition.
pub fn record_inherited_signals() {
    INHERITED_IGNORED.store(
        supervise::ignored_signals(),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// SIGINT, SIGTERM and SIGHUP delivered to tenure, passed on to every run in
/// progress and to the runner: the runner stops on the first SIGINT or
/// SIGTERM (and SIGHUP, unless it reloads on it); a second SIGINT within
/// [`SECOND_INTERRUPT`] becomes SIGKILL for the runs.
#[derive(Clone)]
pub struct SignalHub {
    runs: broadcast::Sender<i32>,
    stop: watch::Receiver<Option<i32>>,
    hups: broadcast::Sender<()>,
}

impl SignalHub {
    /// Starts listening. With `hup_stops` false, SIGHUP is only announced
    /// ([`SignalHub::hangups`]), not passed on to runs (`crond` reloads).
    pub fn start(hup_stops: bool) -> Result<SignalHub, Failure> {
        let mut signals = Signals::new()?;
        let (runs, _) = broadcast::channel(16);
        let (hups, _) = broadcast::channel(4);
        let (stop_tx, stop) = watch::channel(None);
        let hub = SignalHub {
            runs: runs.clone(),
            stop,
            hups: hups.clone(),
        };
        tokio::spawn(async move {
            let mut escalation = Escalation::default();
            loop {
                let got = signals.recv().await;
                if got == libc::SIGHUP && !hup_stops {
                    let _ = hups.send(());
                    continue;
                }
                // Every stop is SIGTERM to the run's group, whatever the
                // signal tenure got (as a service manager's stop is).
                let sig = match escalation.for_signal(got) {
                    libc::SIGKILL => libc::SIGKILL,
                    _ => libc::SIGTERM,
                };
                stop_tx.send_if_modified(|s| {
                    s.is_none() && {
                        *s = Some(got);
                        true
                    }
                });
                let _ = runs.send(sig);
            }
        });
        Ok(hub)
    }

    /// The signal that asked tenure to stop, if one has.
    pub fn stop_requested(&self) -> Option<i32> {
        *self.stop.borrow()
    }

    /// Resolves with the first signal that asks tenure to stop.
    pub async fn stopped(&self) -> i32 {
        let mut stop = self.stop.clone();
        loop {
            if let Some(sig) = *stop.borrow_and_update() {
                return sig;
            }
            if stop.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// SIGHUPs, when they do not stop tenure.
    pub fn hangups(&self) -> broadcast::Receiver<()> {
        self.hups.subscribe()
    }
}

/// SIGINT, SIGTERM and SIGHUP delivered to tenure.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
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
    async fn recv(&mut self) -> i32 {
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
                "SIGINT: stopping the command (a second one within {}s kills it)",
                SECOND_INTERRUPT.as_secs()
            );
            sig
        }
    }
}

/// How the command ended.
#[derive(Debug)]
pub enum Outcome {
    /// It exited by itself, or from a signal tenure was sent and passed on,
    /// with this code.
    Exited(u8),
    /// The lease was lost or at risk, and the process group was stopped.
    LeaseLost(String),
    /// The runner stopped it (the term ended, a pause, a resignation's
    /// grace, `--at-most`): why, and the code it ended with.
    Stopped { why: String, code: u8 },
}

/// What authorises a run: a lease whose local deadline moves with each
/// confirmed renewal.
pub trait Lease: Sync {
    /// The lease's local deadline now.
    fn deadline(&self) -> Instant;
}

impl Lease for Session {
    fn deadline(&self) -> Instant {
        Session::deadline(self)
    }
}

impl Lease for tenure::Tick {
    fn deadline(&self) -> Instant {
        tenure::Tick::deadline(self)
    }
}

/// A command to run under the supervisor.
pub struct Run<'a> {
    pub command: &'a [String],
    pub env: &'a [(&'a str, String)],
    /// SIGTERM this long before the lease's local deadline when no renewal
    /// is confirmed (SIGKILL at it); also the longest a run may take to end
    /// once the store says the lease is gone.
    pub lease_grace: Duration,
    /// Between the signal that stops a run (a signal to tenure, the term's
    /// end, a pause) and SIGKILL.
    pub stop_grace: Duration,
}

/// The lease's local deadline as an absolute `CLOCK_BOOTTIME` reading, for
/// the supervisor. The boot clock is read first: any delay before the
/// monotonic reading makes the result earlier, never later.
fn boot_deadline(lease: &dyn Lease) -> Option<Duration> {
    let boot = supervise::boot_time()?;
    let left = lease.deadline().saturating_duration_since(Instant::now());
    Some(boot + left)
}

/// A boot-clock reading of the supervisor's, as the wall-clock time it
/// was (for logs written after tenure was stopped: when the supervisor
/// acted, not when tenure heard of it).
fn wall_time_of(boot: Duration) -> String {
    let now = supervise::boot_time().unwrap_or(boot);
    let ago = now.saturating_sub(boot);
    let at = std::time::SystemTime::now()
        .checked_sub(ago)
        .unwrap_or_else(std::time::SystemTime::now);
    let ms = if ago >= Duration::from_millis(100) {
        format!(" ({:.1} s ago)", ago.as_secs_f64())
    } else {
        String::new()
    };
    format!("{}{ms}", humantime::format_rfc3339_millis(at))
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
    /// SIGTERM before the lease's deadline, at this boot time.
    Terminating(Duration),
    /// SIGKILL at this boot time: `lease`, `stop` or `gone`.
    Killing(Duration, String),
    /// The supervisor found tenure gone, at this boot time.
    Gone(Duration),
    Ended(u8),
}

fn parse_report(line: &str) -> Option<Report> {
    let mut words = line.split(' ');
    let word = words.next()?;
    let mut at = || {
        words
            .next()
            .and_then(|w| w.parse().ok())
            .map(Duration::from_nanos)
    };
    Some(match word {
        "P" => Report::Started(line.get(2..)?.trim().parse().ok()?),
        "E" => {
            let rest = line.get(2..)?;
            let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
            Report::SpawnFailed(code.parse().ok()?, message.to_string())
        }
        "T" => Report::Terminating(at()?),
        "K" => {
            let when = at()?;
            Report::Killing(when, words.next().unwrap_or("stop").to_string())
        }
        "G" => Report::Gone(at()?),
        "X" => Report::Ended(line.get(2..)?.trim().parse().ok()?),
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
    /// supervisor that tenure is gone.
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
            .arg(format!(
                "{:x}",
                INHERITED_IGNORED.load(std::sync::atomic::Ordering::Relaxed)
            ))
            .arg("--")
            .args(command)
            .kill_on_drop(false)
            // A group of its own: stopping tenure's group (job control's
            // `kill -STOP %1`) must not stop the supervisor.
            .process_group(0);
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

    /// Stops the run: `sig` to the group now, SIGKILL after `grace` if
    /// anything of it is left (the supervisor keeps the time).
    fn stop(&mut self, sig: i32, grace: Duration) {
        let Some(now) = supervise::boot_time() else {
            self.signal(libc::SIGKILL);
            return;
        };
        self.send(&format!("Q {sig} {}", (now + grace).as_nanos()));
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
        // A run dropped mid-way (the library gave up waiting for it): kill
        // the group now, from here and through the supervisor.
        if !self.ended {
            if let Some(pgid) = self.pgid {
                signal_group(pgid, libc::SIGKILL);
            }
            self.send("K");
        }
    }
}

/// What a run has been through, for its outcome.
#[derive(Default)]
struct RunState {
    /// The lease was lost or at risk: why.
    trouble: Option<String>,
    /// The runner stopped the run: why.
    stopped: Option<String>,
    /// A signal to tenure was passed on.
    signalled: bool,
}

impl RunState {
    fn outcome(self, code: u8) -> Outcome {
        match (self.trouble, self.stopped) {
            (Some(why), _) => Outcome::LeaseLost(why),
            (None, Some(why)) if !self.signalled => Outcome::Stopped { why, code },
            _ => Outcome::Exited(code),
        }
    }
}

/// Runs `run.command` under the supervisor while `lease` authorises it —
/// the one supervision path of every runner. The supervisor SIGTERMs the
/// group `lease_grace` before the lease's local deadline and SIGKILLs it at
/// the deadline when no newer deadline came from tenure (tenure stopped, or
/// no renewal confirmed), and stops it if tenure dies. The run is stopped
/// (SIGTERM to the group, SIGKILL after the grace, never past the lease's
/// deadline) when `lost` resolves (the store says the lease is gone), when
/// `ended` resolves (the runner's reason: the term's end, a pause) or when
/// tenure gets a signal (passed on as it came). When the command exits,
/// what is left of its group gets SIGTERM, then SIGKILL after the grace.
/// This returns only once nothing of the group is left.
pub async fn supervise(
    run: &Run<'_>,
    lease: &dyn Lease,
    lost: impl std::future::Future<Output = String>,
    ended: impl std::future::Future<Output = String>,
    hub: &SignalHub,
) -> Result<Outcome, Failure> {
    let mut sent = lease.deadline();
    let mut signals = hub.runs.subscribe();
    let mut child = Supervised::spawn(run.command, run.env, run.lease_grace, boot_deadline(lease))?;
    tokio::pin!(lost, ended);
    let (mut lost_seen, mut ended_seen) = (false, false);
    let mut state = RunState::default();
    if hub.stop_requested().is_some() {
        // Asked to stop while the run was being started.
        state.signalled = true;
        child.stop(libc::SIGTERM, run.stop_grace);
    }
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
                Some(Report::Terminating(at)) => {
                    tracing::warn!("lease at risk: no renewal confirmed {} before the lease's local deadline; the supervisor sent SIGTERM to the command's process group at {}", humantime::format_duration(run.lease_grace), wall_time_of(at));
                    state.trouble.get_or_insert_with(|| "no renewal confirmed before the lease's local deadline".into());
                }
                Some(Report::Killing(at, why)) => match why.as_str() {
                    "lease" => {
                        tracing::error!("the lease's local deadline passed with no confirmed renewal; the supervisor sent SIGKILL to the command's process group at {}", wall_time_of(at));
                        state.trouble.get_or_insert_with(|| "no renewal confirmed before the lease's local deadline".into());
                    }
                    _ => tracing::warn!("the run outlived its grace: SIGKILL sent to its process group at {}", wall_time_of(at)),
                },
                Some(Report::Gone(at)) => tracing::warn!("the supervisor lost touch with tenure at {}; it stopped the run", wall_time_of(at)),
                Some(Report::Ended(code)) => {
                    child.finish().await;
                    return Ok(state.outcome(code));
                }
                None => {
                    child.finish().await;
                    return Err(Failure::new(exit::SOFTWARE, "tenure's supervisor process died unexpectedly; the command's process group was killed"));
                }
            },
            reason = &mut lost, if !lost_seen => {
                lost_seen = true;
                let left = lease.deadline().saturating_duration_since(Instant::now());
                let grace = run.lease_grace.min(left);
                tracing::error!(%reason, "lease lost: SIGTERM to the command's process group, SIGKILL after {}", humantime::format_duration(grace));
                child.stop(libc::SIGTERM, grace);
                state.trouble = Some(reason);
            }
            why = &mut ended, if !ended_seen => {
                ended_seen = true;
                tracing::warn!("{why}: stopping the run (SIGTERM to its process group, SIGKILL after {})", humantime::format_duration(run.stop_grace));
                child.stop(libc::SIGTERM, run.stop_grace);
                state.stopped.get_or_insert(why);
            }
            _ = poll.tick() => {
                let deadline = lease.deadline();
                if deadline != sent {
                    sent = deadline;
                    if let Some(boot) = boot_deadline(lease) {
                        child.send(&format!("D {}", boot.as_nanos()));
                    }
                }
            }
            sig = signals.recv() => match sig {
                Ok(libc::SIGKILL) => {
                    state.signalled = true;
                    child.signal(libc::SIGKILL);
                }
                Ok(sig) => {
                    state.signalled = true;
                    child.stop(sig, run.stop_grace);
                }
                Err(_) => {}
            },
        }
    }
}
