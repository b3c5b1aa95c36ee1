//! The supervisor: the tenure binary re-executed as `tenure __supervise …`,
//! a small process between tenure and the user's command that stops the
//! command's whole process group when tenure can no longer vouch for the
//! lease: tenure died (its end of the control pipe closed), or the lease's
//! local deadline passed with no newer one from tenure (tenure stopped, or
//! too slow). It runs in a process group of its own, so stopping tenure's
//! group (job control's `kill -STOP %1`) does not stop it. It is plain
//! blocking code on purpose: no runtime, no store, no threads, nothing that
//! could itself stall.
//!
//! Its arguments (written by the `child` module):
//!
//! ```text
//! __supervise CTL_FD REPORT_FD PARENT_PID GRACE_NS DEADLINE_NS|- IGNORED -- PROGRAM ARGS…
//! ```
//!
//! `IGNORED` is the set of signals (a bit per signal, in hex) that whoever
//! started tenure left ignored: the command starts with those ignored (as
//! `nohup` expects) and every other signal at its default.
//!
//! Control lines, tenure → supervisor (CTL_FD):
//! - `D <ns>`: the lease's local deadline, as an absolute `CLOCK_BOOTTIME`
//!   reading (a clock both processes share, which keeps counting while the
//!   machine is suspended and that no one can set);
//! - `Q <sig> <ns>`: stop the run: send signal `sig` to the group now and
//!   SIGKILL it at boot time `ns` if anything of it is left;
//! - `S <n>`: pass signal n on to the command's group;
//! - `K`: SIGKILL the command's group now.
//!
//! Report lines, supervisor → tenure (REPORT_FD); `<at>` is the boot-clock
//! reading when the supervisor acted, so that tenure, woken late, logs when
//! it happened rather than when it heard of it:
//! - `P <pgid>`: the command started, in process group pgid;
//! - `E <code> <message>`: the command could not be started (127, 126, 70);
//! - `T <at>`: SIGTERM sent to the group `grace` before the lease's
//!   deadline, no newer one;
//! - `K <at> lease|stop|gone`: SIGKILL sent to the group: at the lease's
//!   deadline, at the end of a stop's grace, or after tenure was gone;
//! - `G <at>`: tenure is gone (dead, or it closed the pipe): the group got
//!   SIGTERM, and SIGKILL follows after the grace or at the lease's deadline;
//! - `X <code>`: the command ended with this exit code (128+N for signal N),
//!   and nothing of its process group is left.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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
    ignored: u64,
    program: OsString,
    rest: Vec<OsString>,
}

fn parse(args: &[OsString]) -> Option<Args> {
    let num = |i: usize| -> Option<u64> { args.get(i)?.to_str()?.parse().ok() };
    let fd = |i: usize| -> Option<RawFd> { RawFd::try_from(num(i)?).ok() };
    if args.get(6)? != "--" {
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
        ignored: u64::from_str_radix(args.get(5)?.to_str()?, 16).ok()?,
        program: args.get(7)?.clone(),
        rest: args.get(8..)?.to_vec(),
    })
}

/// The highest signal number a set of signals covers (the real-time ones
/// included).
const MAX_SIGNAL: libc::c_int = 64;

/// The signals ignored in this process now, a bit per signal (bit n-1 for
/// signal n). Read by tenure first thing, before anything of its own
/// changes a disposition; SIGPIPE reads as not ignored, since Rust's
/// runtime ignores it before `main` (whatever tenure's parent had set).
pub fn ignored_signals() -> u64 {
    let mut set = 0u64;
    for sig in 1..=MAX_SIGNAL {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP || sig == libc::SIGPIPE {
            continue;
        }
        // SAFETY: sigaction with a null new action only reads the current
        // one into memory we own.
        let ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        };
        if ignored {
            set |= 1 << (sig - 1);
        }
    }
    set
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
/// of a group (the command gets them from tenure, or directly), so the
/// supervisor is not stopped or killed by them. SIGCHLD and the parent-death
/// signal are blocked except while waiting in `ppoll`, so none is missed.
/// The command starts with none of this (see [`clean_start`]). Returns the
/// mask to wait with.
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

/// In the command's process, between fork and exec: what a shell gives a
/// program it starts. An empty signal mask; every signal at its default
/// action except those in `ignored` (ignored by whoever started tenure);
/// every descriptor above 2 closed at exec. Only async-signal-safe calls.
fn clean_start(ignored: u64) -> std::io::Result<()> {
    // SAFETY: sigprocmask, sigaction, syscall and fcntl on values we own;
    // all are async-signal-safe.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        for sig in 1..=MAX_SIGNAL {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = if ignored & (1 << (sig - 1)) != 0 {
                libc::SIG_IGN
            } else {
                libc::SIG_DFL
            };
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(sig, &action, std::ptr::null_mut()) != 0 {
                // glibc keeps two real-time signals for itself and refuses
                // them here; the kernel does not.
                raw_sigaction(sig, action.sa_sigaction);
            }
        }
        // Close-on-exec rather than closed: the pipe that reports a failed
        // exec to the supervisor must stay open until the exec.
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        let rc = libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
        if rc != 0 {
            // A kernel before 5.11: mark them one by one, up to the limit.
            let mut limit: libc::rlimit = std::mem::zeroed();
            let top = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                limit.rlim_cur.min(1 << 20) as libc::c_int
            } else {
                4096
            };
            for fd in 3..top {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        }
    }
    Ok(())
}

/// The kernel's `struct sigaction` (with a restorer, as x86-64 and
/// AArch64 have it).
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Sets a signal's disposition to `SIG_DFL` or `SIG_IGN` through the
/// system call itself, for the signals glibc will not touch.
/// Async-signal-safe.
fn raw_sigaction(sig: libc::c_int, handler: libc::sighandler_t) {
    let action = KernelSigaction {
        handler,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: rt_sigaction reads one struct we own; the size is the
    // kernel's sigset (64 bits).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &action as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            8usize,
        );
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

    /// A report of something done now, stamped with the boot clock.
    fn acted(&mut self, what: &str, detail: &str) {
        let at = boot_time().unwrap_or_default().as_nanos();
        self.send(format!("{what} {at} {detail}").trim_end());
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
    report.send(&format!("P {pid}"));
    let mut watch = Watch {
        pid,
        parent: args.parent,
        ctl,
        grace: args.grace,
        deadline: args.deadline,
        stop_by: None,
        termed: false,
        killed: false,
        status: None,
        pending: Vec::new(),
    };
    let status = watch.until_gone(&mut report, &wait_mask);
    report.send(&format!(
        "X {}",
        status_code(std::process::ExitStatus::from_raw(status))
    ));
    0
}

/// Starts the command in a process group of its own, as a shell would
/// start it ([`clean_start`]); returns its pid, or `None` once the report
/// says why it could not be started.
fn start_command(args: &Args, report: &mut Reporter) -> Option<libc::pid_t> {
    let me = std::process::id() as libc::pid_t;
    let ignored = args.ignored;
    let mut cmd = std::process::Command::new(&args.program);
    cmd.args(&args.rest).process_group(0);
    // SAFETY: the closure calls only async-signal-safe functions (prctl,
    // getppid, and those of `clean_start`). Backstop: if the supervisor
    // itself is SIGKILLed, the command's first process gets SIGKILL too.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if libc::getppid() != me {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            clean_start(ignored)
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

/// The supervisor's watch over a running command's group.
struct Watch {
    /// The command's pid, which is also its group's id.
    pid: libc::pid_t,
    parent: i32,
    /// tenure's control pipe; `None` once closed.
    ctl: Option<std::fs::File>,
    /// SIGTERM this long before the lease's deadline; the time between
    /// SIGTERM and SIGKILL when tenure is gone or the command has exited
    /// leaving processes behind.
    grace: Duration,
    /// The lease's local deadline (boot clock), if the run has a lease.
    deadline: Option<Duration>,
    /// A stop under way: SIGKILL at this boot time.
    stop_by: Option<Duration>,
    /// SIGTERM sent for the current deadline.
    termed: bool,
    killed: bool,
    /// The command's own wait status, once it has ended.
    status: Option<libc::c_int>,
    /// Control bytes read, not yet a whole line.
    pending: Vec<u8>,
}

impl Watch {
    /// Watches until the command has ended and nothing of its group is
    /// left; returns the command's wait status.
    fn until_gone(&mut self, report: &mut Reporter, wait_mask: &libc::sigset_t) -> libc::c_int {
        loop {
            if let Some(status) = reap(self.pid) {
                self.status = Some(status);
                if !self.killed && self.stop_by.is_none() && group_exists(self.pid) {
                    // The command left processes behind: they are stopped
                    // as any run is (SIGTERM, the grace, SIGKILL).
                    signal_group(self.pid, libc::SIGTERM);
                    self.stop_by = Some(self.now() + self.grace);
                }
            }
            if let Some(status) = self.status {
                if !group_exists(self.pid) {
                    return status;
                }
                if self.unkillable() {
                    // A write error (a closed stderr) must not end the supervisor.
                    let _ = writeln!(
                        std::io::stderr(),
                        "tenure: part of the command's process group cannot be killed by this user"
                    );
                    return status;
                }
            }
            if self.stop_by.is_none() && !self.killed && self.tenure_gone() {
                signal_group(self.pid, libc::SIGTERM);
                self.stop_by = Some(self.now() + self.grace);
                report.acted("G", "");
            }
            let mut wait = self.enforce(report);
            if self.status.is_some() || self.killed {
                // Waiting for processes that are not our children: look often.
                wait = wait.min(Duration::from_millis(5));
            }
            if self.poll(wait, wait_mask) {
                self.read_control(report);
            }
        }
    }

    fn now(&self) -> Duration {
        // An unreadable clock acts at once: never late.
        boot_time().unwrap_or(Duration::MAX)
    }

    /// Whether tenure is gone: its control pipe closed, or it died (the
    /// parent-death signal, confirmed by our parent having changed).
    fn tenure_gone(&self) -> bool {
        // SAFETY: getppid has no arguments.
        self.ctl.is_none()
            || (PARENT_GONE.load(Ordering::SeqCst) && unsafe { libc::getppid() } != self.parent)
    }

    /// Only processes we may not signal are left (a setuid program).
    fn unkillable(&self) -> bool {
        // SAFETY: kill(2) with signal 0 only checks.
        let refused = unsafe { libc::kill(-self.pid, 0) } != 0;
        refused && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }

    /// SIGTERM `grace` before the lease's deadline, SIGKILL at it or at the
    /// end of a stop's grace (each reported); once killed, SIGKILL again
    /// until the group is gone. Returns how long to wait before looking
    /// again.
    fn enforce(&mut self, report: &mut Reporter) -> Duration {
        // Read the clock after the checks made before this: a slow
        // supervisor acts late, never on a stale reading.
        let now = self.now();
        if self.killed {
            signal_group(self.pid, libc::SIGKILL);
            return Duration::from_millis(5);
        }
        let kill_at = match (self.deadline, self.stop_by) {
            (Some(d), Some(s)) => Some(d.min(s)),
            (d, s) => d.or(s),
        };
        let Some(kill_at) = kill_at else {
            return Duration::from_millis(250);
        };
        if now >= kill_at {
            signal_group(self.pid, libc::SIGKILL);
            let why = match (self.deadline, self.stop_by) {
                (Some(d), _) if d == kill_at => "lease",
                _ if self.ctl.is_none() => "gone",
                _ => "stop",
            };
            report.acted("K", why);
            self.killed = true;
            return Duration::from_millis(5);
        }
        let mut next = kill_at;
        if let Some(d) = self.deadline {
            let warn_at = d.saturating_sub(self.grace);
            if !self.termed && self.stop_by.is_none() {
                if now >= warn_at {
                    signal_group(self.pid, libc::SIGTERM);
                    report.acted("T", "");
                    self.termed = true;
                } else {
                    next = next.min(warn_at);
                }
            }
        }
        next.saturating_sub(now).min(Duration::from_millis(250))
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
    fn read_control(&mut self, report: &mut Reporter) {
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
            let words: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|w| w.parse().ok())
                .collect();
            match (line.split_whitespace().next(), words.as_slice()) {
                (Some("D"), [ns]) => {
                    let next = Duration::from_nanos(*ns);
                    if self.deadline != Some(next) {
                        self.deadline = Some(next);
                        self.termed = false;
                    }
                }
                (Some("Q"), [sig, ns]) => {
                    if let Ok(sig) = libc::c_int::try_from(*sig) {
                        signal_group(self.pid, sig);
                    }
                    let by = Duration::from_nanos(*ns);
                    self.stop_by = Some(self.stop_by.map_or(by, |s| s.min(by)));
                }
                (Some("S"), [sig]) => {
                    if let Ok(sig) = libc::c_int::try_from(*sig) {
                        signal_group(self.pid, sig);
                    }
                }
                (Some("K"), _) => {
                    signal_group(self.pid, libc::SIGKILL);
                    if !self.killed {
                        report.acted("K", "stop");
                    }
                    self.killed = true;
                }
                _ => {}
            }
        }
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
