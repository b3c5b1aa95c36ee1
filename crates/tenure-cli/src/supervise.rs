//! The supervisor: the tenure binary re-executed as `tenure __supervise …`,
//! a small process between tenure and the user's command that stops the
//! command's whole process group when tenure can no longer vouch for the
//! lease: tenure died (its end of the control pipe closed), or the lease's
//! local deadline passed with no newer one from tenure (tenure stopped, or
//! too slow). It is plain blocking code on purpose: no runtime, no store, no
//! threads, nothing that could itself stall.
//!
//! Its arguments (written by the `child` module):
//!
//! ```text
//! __supervise CTL_FD REPORT_FD PARENT_PID GRACE_NS DEADLINE_NS|- -- PROGRAM ARGS…
//! ```
//!
//! Control lines, tenure → supervisor (CTL_FD):
//! - `D <ns>`: the lease's local deadline, as an absolute `CLOCK_BOOTTIME`
//!   reading (a clock both processes share, which keeps counting while the
//!   machine is suspended and that no one can set);
//! - `S <n>`: pass signal n on to the command's group;
//! - `K`: SIGKILL the command's group now.
//!
//! Report lines, supervisor → tenure (REPORT_FD):
//! - `P <pgid>`: the command started, in process group pgid;
//! - `E <code> <message>`: the command could not be started (127, 126, 70);
//! - `T`: SIGTERM sent to the group: `grace` before the deadline, no newer one;
//! - `K`: SIGKILL sent to the group: the deadline passed, no newer one;
//! - `X <code>`: the command ended with this exit code (128+N for signal N),
//!   and nothing of its process group is left.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::exit;

/// The hidden subcommand's name.
pub const ARG: &str = "__supervise";

/// Set by the parent-death signal (SIGUSR1): tenure is gone.
static PARENT_GONE: AtomicBool = AtomicBool::new(false);

/// The signal the kernel sends the supervisor when tenure dies
/// (`PR_SET_PDEATHSIG`); caught, so it is a flag, not the supervisor's death.
pub const PARENT_DEATH_SIGNAL: libc::c_int = libc::SIGUSR1;

/// `CLOCK_BOOTTIME`: time since boot, counting suspend; `None` if unreadable.
pub fn boot_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec that we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

/// The exit code tenure gives when the command cannot be started, by the
/// error `spawn` (exec) returned: 127 not found, 70 when the system could not
/// make a process, 126 for everything else (found but not runnable).
pub fn spawn_failure_code(e: &std::io::Error) -> u8 {
    match e.raw_os_error() {
        Some(libc::ENOENT) => 127,
        Some(libc::EAGAIN | libc::ENOMEM) => exit::SOFTWARE,
        _ if e.kind() == std::io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// An exit status as a shell reports it: the code, or 128+N for signal N.
pub fn status_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => 1,
    }
}

/// Signals a process group, logging (to stderr) nothing: the group may
/// already be gone.
pub fn signal_group(pgid: i32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) with a negative pid signals a process group; it touches
    // no memory of ours.
    unsafe { libc::kill(-pgid, sig) == 0 }
}

/// Whether any process of the group still exists (zombies included).
pub fn group_exists(pgid: i32) -> bool {
    // SAFETY: as above; signal 0 only checks.
    let rc = unsafe { libc::kill(-pgid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

struct Args {
    ctl: RawFd,
    report: RawFd,
    parent: i32,
    grace: Duration,
    deadline: Option<Duration>,
    program: OsString,
    rest: Vec<OsString>,
}

fn parse(args: &[OsString]) -> Option<Args> {
    let num = |i: usize| -> Option<u64> { args.get(i)?.to_str()?.parse().ok() };
    let fd = |i: usize| -> Option<RawFd> { RawFd::try_from(num(i)?).ok() };
    if args.get(5)? != "--" {
        return None;
    }
    let deadline = match args.get(4)?.to_str()? {
        "-" => None,
        _ => Some(Duration::from_nanos(num(4)?)),
    };
    Some(Args {
        ctl: fd(0)?,
        report: fd(1)?,
        parent: i32::try_from(num(2)?).ok()?,
        grace: Duration::from_nanos(num(3)?),
        deadline,
        program: args.get(6)?.clone(),
        rest: args.get(7..)?.to_vec(),
    })
}

/// Takes an inherited descriptor: checks it is open and marks it
/// close-on-exec, so the command does not inherit it.
fn take_fd(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: fcntl on a number we were given; F_GETFD fails on a closed one.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return None;
    }
    // SAFETY: as above.
    unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    // SAFETY: the descriptor is open (checked above) and tenure handed it to
    // this process alone.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == PARENT_DEATH_SIGNAL {
        PARENT_GONE.store(true, Ordering::SeqCst);
    }
}

/// Catches the signals a terminal or a service manager sends to every process
/// of tenure's group (the command gets them from tenure, or directly), so the
/// supervisor is not stopped or killed by them. Caught signals are reset to
/// their defaults when the command is executed. SIGCHLD and the parent-death
/// signal are blocked except while waiting in `ppoll`, so none is missed.
/// Returns the mask to wait with.
fn setup_signals() -> libc::sigset_t {
    // SAFETY: plain libc calls on values we own; the handler only stores to an
    // atomic, which is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
            libc::SIGCHLD,
            PARENT_DEATH_SIGNAL,
        ] {
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGCHLD);
        libc::sigaddset(&mut block, PARENT_DEATH_SIGNAL);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
        libc::sigdelset(&mut old, libc::SIGCHLD);
        libc::sigdelset(&mut old, PARENT_DEATH_SIGNAL);
        old
    }
}

/// Reaps every child that has ended (the command, and with the subreaper
/// flag any orphan of its tree); returns the command's status if it was one.
fn reap(command: libc::pid_t) -> Option<libc::c_int> {
    let mut found = None;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes one int that we own.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return found;
        }
        if pid == command {
            found = Some(status);
        }
    }
}

struct Reporter(std::fs::File);

impl Reporter {
    fn send(&mut self, line: &str) {
        // tenure may be gone (EPIPE; SIGPIPE is ignored): nothing to do then.
        let _ = self.0.write_all(format!("{line}\n").as_bytes());
    }
}

/// The supervisor's `main`; its exit code is not what tenure reports (that
/// goes over the report pipe), only 0 or 64 for a hand-made call.
pub fn main(args: &[OsString]) -> u8 {
    let Some(args) = parse(args) else {
        eprintln!("tenure: {ARG} is tenure's own helper, not a command to run by hand");
        return exit::USAGE;
    };
    let (Some(ctl), Some(report)) = (take_fd(args.ctl), take_fd(args.report)) else {
        eprintln!("tenure: {ARG}: the descriptors from tenure are not open");
        return exit::USAGE;
    };
    let mut report = Reporter(std::fs::File::from(report));
    let ctl = Some(std::fs::File::from(ctl));
    let wait_mask = setup_signals();
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL as libc::c_ulong);
        // Orphans of the command's tree become our children, so we can reap
        // them and tell when the whole group is gone.
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
    }
    // tenure may have died before the parent-death signal was set.
    // SAFETY: getppid has no arguments.
    if unsafe { libc::getppid() } != args.parent {
        return 0;
    }
    let Some(pid) = start_command(&args, &mut report) else {
        return 0;
    };
    // The command leads its own group: the group id is its pid.
    let pgid = pid;
    report.send(&format!("P {pgid}"));

    let mut watch = Watch {
        ctl,
        deadline: args.deadline,
        termed: false,
        killed: false,
        pending: Vec::new(),
    };
    let status = watch.until_exit(pid, pgid, args.grace, &mut report, &wait_mask);
    kill_group_to_the_end(pgid, pid);
    report.send(&format!(
        "X {}",
        status_code(std::process::ExitStatus::from_raw(status))
    ));
    0
}

/// Starts the command in a process group of its own; returns its pid, or
/// `None` once the report says why it could not be started.
fn start_command(args: &Args, report: &mut Reporter) -> Option<libc::pid_t> {
    let me = std::process::id() as libc::pid_t;
    let mut cmd = std::process::Command::new(&args.program);
    cmd.args(&args.rest).process_group(0);
    // SAFETY: the closure calls only async-signal-safe functions (prctl,
    // getppid). Backstop: if the supervisor itself is SIGKILLed, the command's
    // first process gets SIGKILL too.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if libc::getppid() != me {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let code = spawn_failure_code(&e);
            let message = format!("cannot run {:?}: {e}", args.program);
            report.send(&format!("E {code} {}", message.replace('\n', " ")));
            return None;
        }
    };
    Some(child.id() as libc::pid_t)
}

/// The supervisor's watch over a running command: tenure's control pipe
/// (`None` once closed), the lease's local deadline, and what was done.
struct Watch {
    ctl: Option<std::fs::File>,
    deadline: Option<Duration>,
    termed: bool,
    killed: bool,
    /// Control bytes read, not yet a whole line.
    pending: Vec<u8>,
}

impl Watch {
    /// Watches until the command ends; returns its wait status.
    fn until_exit(
        &mut self,
        pid: libc::pid_t,
        pgid: i32,
        grace: Duration,
        report: &mut Reporter,
        wait_mask: &libc::sigset_t,
    ) -> libc::c_int {
        loop {
            if let Some(status) = reap(pid) {
                return status;
            }
            if !self.killed && (self.ctl.is_none() || PARENT_GONE.load(Ordering::SeqCst)) {
                eprintln!(
                    "tenure: tenure ended while its command ran: killing the command's process group"
                );
                signal_group(pgid, libc::SIGKILL);
                self.killed = true;
            }
            let wait = self.enforce_deadline(pgid, grace, report);
            if !self.poll(wait, wait_mask) {
                continue;
            }
            self.read_control(pgid);
        }
    }

    /// SIGTERM `grace` before the deadline, SIGKILL at it (each reported);
    /// returns how long to wait for tenure before looking again.
    fn enforce_deadline(&mut self, pgid: i32, grace: Duration, report: &mut Reporter) -> Duration {
        // Read the clock after the checks `until_exit` made before this: a
        // slow supervisor acts late, never on a stale reading.
        let now = boot_time().unwrap_or(Duration::MAX);
        let mut wait = Duration::from_millis(250);
        if let Some(d) = self.deadline.filter(|_| !self.killed) {
            if now >= d {
                signal_group(pgid, libc::SIGKILL);
                report.send("K");
                self.killed = true;
            } else {
                let warn_at = d.saturating_sub(grace);
                if now >= warn_at && !self.termed {
                    signal_group(pgid, libc::SIGTERM);
                    report.send("T");
                    self.termed = true;
                }
                let next = if self.termed { d } else { warn_at };
                wait = wait.min(next.saturating_sub(now));
            }
        }
        wait
    }

    /// Waits up to `wait` for the control pipe (or a signal); true if it
    /// has something to read.
    fn poll(&self, wait: Duration, wait_mask: &libc::sigset_t) -> bool {
        let mut fds = [libc::pollfd {
            fd: self.ctl.as_ref().map_or(-1, |f| f.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        }];
        let timeout = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one pollfd and one timespec we own; the mask unblocks
        // SIGCHLD and the parent-death signal for the wait only. A negative
        // fd is ignored by ppoll.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 1, &timeout, wait_mask) };
        n > 0 && fds[0].revents != 0
    }

    /// Reads tenure's control lines and acts on each whole one.
    fn read_control(&mut self, pgid: i32) {
        let Some(file) = self.ctl.as_mut() else {
            return;
        };
        let mut buf = [0u8; 512];
        match file.read(&mut buf) {
            Ok(0) => self.ctl = None,
            Ok(k) => self.pending.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => self.ctl = None,
        }
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let mut words = line.split_whitespace();
            match (
                words.next(),
                words.next().and_then(|w| w.parse::<u64>().ok()),
            ) {
                (Some("D"), Some(ns)) => {
                    let next = Duration::from_nanos(ns);
                    if self.deadline != Some(next) {
                        self.deadline = Some(next);
                        self.termed = false;
                    }
                }
                (Some("S"), Some(sig)) => {
                    if let Ok(sig) = libc::c_int::try_from(sig) {
                        signal_group(pgid, sig);
                    }
                }
                (Some("K"), _) => {
                    signal_group(pgid, libc::SIGKILL);
                    self.killed = true;
                }
                _ => {}
            }
        }
    }
}

/// Whatever the command left running in its group goes too, and we wait
/// until nothing of the group is left (orphans are reaped here, as the
/// subreaper) before telling tenure, which releases only then.
fn kill_group_to_the_end(pgid: i32, pid: libc::pid_t) {
    signal_group(pgid, libc::SIGKILL);
    let started = Instant::now();
    let mut warned = false;
    while group_exists(pgid) {
        reap(pid);
        // Only processes we may not signal are left (a setuid program).
        // SAFETY: kill(2) with signal 0 only checks.
        if unsafe { libc::kill(-pgid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        {
            eprintln!("tenure: part of the command's process group cannot be killed by this user");
            break;
        }
        if !warned && started.elapsed() > Duration::from_secs(1) {
            eprintln!("tenure: the command's process group is still not gone 1 s after SIGKILL (a process in uninterruptible sleep?); waiting");
            warned = true;
        }
        std::thread::sleep(Duration::from_millis(2));
        signal_group(pgid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_failures_map_like_a_shell() {
        use std::io::Error as E;
        assert_eq!(spawn_failure_code(&E::from_raw_os_error(libc::ENOENT)), 127);
        assert_eq!(spawn_failure_code(&E::from_raw_os_error(libc::EACCES)), 126);
        assert_eq!(
            spawn_failure_code(&E::from_raw_os_error(libc::ENOEXEC)),
            126
        );
        assert_eq!(spawn_failure_code(&E::from_raw_os_error(libc::EAGAIN)), 70);
    }
}
