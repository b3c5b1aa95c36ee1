//! Running the user's command while a lease is held, and stopping its whole
//! process group before the lease can run out.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::{exit, Failure};
use tenure::Session;

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

/// How the command ended.
#[derive(Debug)]
pub enum Outcome {
    /// It exited by itself (or from a signal we passed on) with this code.
    Exited(u8),
    /// The lease was lost or at risk, and the process group was terminated.
    LeaseLost(String),
}

fn signal_group(pgid: i32, sig: i32) {
    // SAFETY: kill(2) with a negative pid signals a process group; it touches
    // no memory of ours.
    let rc = unsafe { libc::kill(-pgid, sig) };
    if rc != 0 {
        tracing::debug!(pgid, sig, error = %std::io::Error::last_os_error(), "signalling the process group failed");
    }
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => 1,
    }
}

/// Runs `command` in a process group of its own while `session` holds its
/// lease. When the command exits, anything it left running in its group is
/// killed, so nothing of it outlives the lock. SIGTERM goes to the group when no renewal has been confirmed
/// `grace` before the lease's local deadline, SIGKILL at the deadline (which
/// comes before the store's expiry), and at once if the store says the lease
/// is gone.
pub async fn run_while_held(
    command: &[String],
    env: &[(&str, String)],
    session: &Session,
    grace: Duration,
    signals: &mut Signals,
) -> Result<Outcome, Failure> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| Failure::new(exit::USAGE, "no command given after --"))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest).process_group(0).kill_on_drop(false);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        };
        Failure::new(code, format!("cannot run {program:?}: {e}"))
    })?;
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| Failure::new(exit::SOFTWARE, "the command has no process id"))?;
    let lost = session.lost();
    tokio::pin!(lost);
    let mut terminating: Option<String> = None;
    loop {
        let deadline = session.deadline();
        let warn_at = deadline.checked_sub(grace).unwrap_or(deadline);
        tokio::select! {
            status = child.wait() => {
                // Nothing the command started may outlive the lease: whatever
                // is left in its process group goes before the release.
                signal_group(pgid, libc::SIGKILL);
                let status = status.map_err(|e| Failure::new(exit::SOFTWARE, format!("waiting for the command: {e}")))?;
                return Ok(match terminating {
                    Some(why) => Outcome::LeaseLost(why),
                    None => Outcome::Exited(exit_code(status)),
                });
            }
            reason = &mut lost => {
                tracing::error!(%reason, "lease lost: killing the command's process group");
                signal_group(pgid, libc::SIGKILL);
                let _ = child.wait().await;
                return Ok(Outcome::LeaseLost(reason.to_string()));
            }
            () = tokio::time::sleep_until(warn_at), if terminating.is_none() => {
                // Still no confirmed renewal since this deadline was set?
                if session.deadline() == deadline && !session.is_lost() {
                    tracing::warn!("lease at risk: no renewal confirmed; sending SIGTERM to the command");
                    signal_group(pgid, libc::SIGTERM);
                    terminating = Some("no renewal confirmed before the lease's deadline".into());
                }
            }
            sig = signals.recv() => {
                tracing::info!(sig, "passing the signal on to the command");
                signal_group(pgid, sig);
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
}

/// Kills a process group when dropped: a run whose future is dropped (it ran
/// too long, or the lease was lost) leaves nothing behind.
struct KillOnDrop {
    pgid: i32,
    running: RunningGroup,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        signal_group(self.pgid, libc::SIGKILL);
        self.running.set(None);
    }
}

/// Passes SIGINT/SIGTERM/SIGHUP on to the run in progress and resolves (the
/// schedule's shutdown) on the first one.
pub fn forward_signals_then_stop(
    running: RunningGroup,
) -> Result<impl std::future::Future<Output = ()>, Failure> {
    let mut signals = Signals::new()?;
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        loop {
            let sig = signals.recv().await;
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

/// Runs one tick's command in its own process group and returns its exit code.
/// Dropping the future kills the group.
pub async fn run_tick(
    command: &[String],
    env: &[(&str, String)],
    running: &RunningGroup,
) -> Result<u8, Failure> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| Failure::new(exit::USAGE, "no command given after --"))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest).process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot run {program:?}: {e}")))?;
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| Failure::new(exit::SOFTWARE, "the command has no process id"))?;
    running.set(Some(pgid));
    let _kill = KillOnDrop {
        pgid,
        running: running.clone(),
    };
    let status = child
        .wait()
        .await
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("waiting for the command: {e}")))?;
    Ok(exit_code(status))
}
