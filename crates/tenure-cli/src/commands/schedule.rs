//! `tenure schedule list|pause|resume`: the schedules' board in the store
//! (the same JSON feeds the console).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use tenure::{ScheduleBoard, Store};

use crate::audit::audit;
use crate::exit::{self, Failure};
use crate::output::escape_line;

#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// List the schedules whose instances ran on this store: expression,
    /// zone, mode, next ticks, last run, pause.
    #[command(after_help = "Example:\n  tenure schedule list --json")]
    List(ListArgs),
    /// Pause a schedule on every instance (they skip its ticks) until resumed
    /// or for a while.
    #[command(
        after_help = "Example:\n  tenure schedule pause nightly --for 2h --reason 'database migration'\n\n\
        Every instance reads the pause before it claims a tick and skips the tick while it holds\n\
        (counted as `paused`). A leader stays elected. With --for the pause lifts by itself at its\n\
        end, judged by each instance's clock. Needs a store with cells (`tenure backends` says `cells (and so pauses): yes`)."
    )]
    Pause(PauseArgs),
    /// Lift a schedule's pause.
    #[command(after_help = "Example:\n  tenure schedule resume nightly --reason 'migration done'")]
    Resume(ResumeArgs),
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only jobs whose name starts with this.
    #[arg(default_value = "")]
    prefix: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct PauseArgs {
    /// The job's name (as given to `tenure cron`).
    pub job: String,
    /// Lift the pause by itself after this long (e.g. 30m, 2h).
    #[arg(long = "for", value_parser = crate::cli::parse_duration, allow_hyphen_values = true)]
    pub for_: Option<Duration>,
    /// Why (kept with the pause and in the audit record).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Append the audit record (JSON, one line) to this file too.
    #[arg(long, env = "TENURE_AUDIT_LOG")]
    pub audit_log: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct ResumeArgs {
    /// The job's name.
    pub job: String,
    /// Why (kept in the audit record).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Append the audit record (JSON, one line) to this file too.
    #[arg(long, env = "TENURE_AUDIT_LOG")]
    pub audit_log: Option<std::path::PathBuf>,
}

/// Checks a command's input before the store is opened.
pub fn validate(command: &ScheduleCommand) -> Result<(), Failure> {
    let job = match command {
        ScheduleCommand::List(_) => return Ok(()),
        ScheduleCommand::Pause(a) => {
            check_for(a.for_)?;
            &a.job
        }
        ScheduleCommand::Resume(a) => &a.job,
    };
    ScheduleBoard::check_job(job)?;
    Ok(())
}

/// Checks a pause's `--for`: more than zero, and within the board's own
/// bound of ten years (checked before the store is asked whether the name
/// exists, so bad input is said as such).
pub(crate) fn check_for(for_: Option<Duration>) -> Result<(), Failure> {
    if for_.is_some_and(|d| d.is_zero()) {
        return Err(Failure::new(exit::USAGE, "--for must be more than 0"));
    }
    if for_.is_some_and(|d| d > Duration::from_secs(3653 * 86_400)) {
        return Err(Failure::new(
            exit::USAGE,
            "--for is more than ten years ahead: pause until resumed instead",
        ));
    }
    Ok(())
}

/// When a pause of `--for` ends, and who asked for it (user and host).
pub(crate) fn pause_of(
    for_: Option<Duration>,
) -> Result<(Option<chrono::DateTime<chrono::Utc>>, String), Failure> {
    let until = match for_ {
        Some(d) => Some(
            chrono::Duration::from_std(d)
                .ok()
                .and_then(|d| chrono::Utc::now().checked_add_signed(d))
                .ok_or_else(|| Failure::new(exit::USAGE, "--for is too long"))?,
        ),
        None => None,
    };
    let by = format!(
        "{} on {}",
        crate::audit::operator(),
        tenure::default_label()
    );
    Ok((until, by))
}

/// Refuses a job no instance has started on this store (a typo would
/// otherwise pause nothing and say it did), unless it is paused already
/// (so that such a pause can still be lifted). A store without cells is
/// left to refuse the pause itself.
pub async fn started_job(
    store: &Arc<dyn Store>,
    board: &ScheduleBoard,
    paused: bool,
) -> Result<(), String> {
    if !store.capabilities().cells || paused || board.exists().await.map_err(|e| e.to_string())? {
        return Ok(());
    }
    let known = ScheduleBoard::jobs(store).await.unwrap_or_default();
    Err(if known.is_empty() {
        format!(
            "no job named {} has started on this store (none has)",
            board.job()
        )
    } else {
        format!(
            "no job named {} has started on this store (started: {})",
            board.job(),
            known.join(", ")
        )
    })
}

/// Unix milliseconds as RFC 3339 (`None` for a time chrono cannot hold,
/// which only a cell tenure did not write could have).
fn ms_rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

pub(crate) fn paused_json(p: &tenure::Paused) -> serde_json::Value {
    serde_json::json!({
        "since": ms_rfc3339(p.since_ms),
        "until": p.until_ms.and_then(ms_rfc3339),
        "by": p.by,
        "reason": p.reason,
    })
}

/// A run's outcome in one word (`succeeded`, `failed`, `stopped`) and
/// its exit code where it gave one, from what the board records
/// (`finished`, `failed: exit 3`, `stopped: … ; exit 143`).
pub(crate) fn outcome_of(recorded: &str) -> (&'static str, Option<u8>) {
    let word = if recorded == "finished" {
        "succeeded"
    } else if recorded.starts_with("failed") {
        "failed"
    } else if recorded.starts_with("stopped") {
        "stopped"
    } else {
        "unknown"
    };
    let code = recorded.rsplit_once("exit ").and_then(|(_, rest)| {
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    });
    (word, code)
}

/// A run of `job` in progress: a live claim of a tick after the last
/// recorded run (a claim kept by `--at-least` after its run is not one).
async fn run_in_progress(
    store: &Arc<dyn Store>,
    job: &str,
    last_tick_ms: Option<i64>,
) -> tenure::Result<Option<serde_json::Value>> {
    for claim in store.names(&format!("{job}@")).await? {
        let Some(tick) = claim
            .as_str()
            .strip_prefix(&format!("{job}@"))
            .and_then(|t| t.parse::<i64>().ok())
        else {
            continue;
        };
        if last_tick_ms.is_some_and(|last| last >= tick * 1000) {
            continue;
        }
        let queue = store.queue(&claim).await?;
        if let Some(holder) = queue.entries.iter().find(|e| e.granted) {
            return Ok(Some(serde_json::json!({
                "tick": ms_rfc3339(tick * 1000),
                "by": holder.label,
                "session": holder.session_tag,
                "token": holder.seq,
                "since": holder.granted_at.map(|t| chrono::DateTime::<chrono::Utc>::from(t)
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            })));
        }
    }
    Ok(None)
}

/// The board of every job that starts with `prefix`, as JSON.
pub async fn schedules_json(
    store: &Arc<dyn Store>,
    prefix: &str,
) -> tenure::Result<serde_json::Value> {
    let now = chrono::Utc::now();
    let mut all = Vec::new();
    for job in ScheduleBoard::jobs(store).await? {
        if !job.starts_with(prefix) {
            continue;
        }
        // A job whose board cells do not hold what tenure wrote is listed
        // with the reason, not allowed to hide the others.
        let unreadable =
            |e: tenure::Error| serde_json::json!({ "job": job, "error": e.to_string() });
        let Ok(board) = ScheduleBoard::new(store, &job) else {
            continue;
        };
        let info = match board.info().await {
            Ok(Some(info)) => info,
            Ok(None) => continue,
            Err(e @ tenure::Error::InvalidArgument { .. }) => {
                all.push(unreadable(e));
                continue;
            }
            Err(e) => return Err(e),
        };
        let paused = match board.paused().await {
            Ok(paused) => paused,
            Err(e @ tenure::Error::InvalidArgument { .. }) => {
                all.push(unreadable(e));
                continue;
            }
            Err(e) => return Err(e),
        };
        // A pause that has run out is over (each instance resumes by its
        // own clock); while one holds, the next ticks are those that will
        // run: after its end, or none for a pause until resumed.
        let paused = paused.filter(|p| p.holds_at(now));
        let from = match &paused {
            None => Some(now),
            Some(p) => p
                .until_ms
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|until| until.max(now)),
        };
        let next: Vec<String> = from
            .map(|from| info.next_ticks(from, 3))
            .unwrap_or_default()
            .iter()
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect();
        let last = info.last_run.as_ref().map(|r| {
            let (result, exit_code) = outcome_of(&r.outcome);
            serde_json::json!({
                "tick": ms_rfc3339(r.tick_ms),
                "ended": ms_rfc3339(r.ended_ms),
                "seconds": r.seconds,
                "by": r.by,
                "session": r.session_tag,
                "token": r.token,
                "leader_token": r.leader_token,
                "outcome": r.outcome,
                "result": result,
                "exit_code": exit_code,
            })
        });
        let running =
            run_in_progress(store, &job, info.last_run.as_ref().map(|r| r.tick_ms)).await?;
        all.push(serde_json::json!({
            "job": info.job,
            "expr": info.expr,
            "time_zone": info.time_zone,
            "mode": info.mode,
            "missed": info.missed,
            "next_ticks": next,
            "last_run": last,
            "running": running,
            "paused": paused.as_ref().map(paused_json),
        }));
    }
    Ok(serde_json::Value::Array(all))
}

pub async fn run(store: Arc<dyn Store>, command: ScheduleCommand) -> Result<u8, Failure> {
    match command {
        ScheduleCommand::List(args) => {
            let all = schedules_json(&store, &args.prefix).await?;
            if args.json {
                outln!("{all}");
                return Ok(0);
            }
            for s in all.as_array().into_iter().flatten() {
                let text = |k: &str| escape_line(s[k].as_str().unwrap_or_default());
                if let Some(e) = s["error"].as_str() {
                    outln!("{}  unreadable: {}", text("job"), escape_line(e));
                    continue;
                }
                outln!(
                    "{}  '{}' {} {}{}",
                    text("job"),
                    text("expr"),
                    text("time_zone"),
                    text("mode"),
                    if s["paused"].is_null() {
                        ""
                    } else {
                        "  PAUSED"
                    }
                );
                match s["next_ticks"].as_array().and_then(|n| n.first()) {
                    Some(next) => outln!("  next: {}", next.as_str().unwrap_or_default()),
                    None if !s["paused"].is_null() => outln!("  next: none until resumed"),
                    None => {}
                }
                let running = &s["running"];
                if !running.is_null() {
                    outln!(
                        "  running: tick {} by {} token={} since {}",
                        running["tick"].as_str().unwrap_or_default(),
                        escape_line(running["by"].as_str().unwrap_or_default()),
                        running["token"],
                        running["since"].as_str().unwrap_or("?"),
                    );
                }
                let last = &s["last_run"];
                if !last.is_null() {
                    outln!(
                        "  last: tick {} by {} token={} {} ({}) in {:.3}s",
                        last["tick"].as_str().unwrap_or_default(),
                        escape_line(last["by"].as_str().unwrap_or_default()),
                        last["token"],
                        last["result"].as_str().unwrap_or_default().to_uppercase(),
                        escape_line(last["outcome"].as_str().unwrap_or_default()),
                        last["seconds"].as_f64().unwrap_or_default(),
                    );
                }
                let p = &s["paused"];
                if !p.is_null() {
                    outln!(
                        "  paused by {} until {}: {}",
                        escape_line(p["by"].as_str().unwrap_or_default()),
                        p["until"].as_str().unwrap_or("resumed"),
                        escape_line(p["reason"].as_str().unwrap_or_default()),
                    );
                }
            }
            Ok(0)
        }
        ScheduleCommand::Pause(args) => {
            let board = ScheduleBoard::new(&store, &args.job)?;
            let (until, by) = pause_of(args.for_)?;
            // Best effort: an unreadable pause is replaced all the same.
            let before = board.paused().await.ok().flatten();
            started_job(&store, &board, before.is_some())
                .await
                .map_err(|e| Failure::new(exit::NO_LEADER, escape_line(&e)))?;
            let paused = board.pause(until, &by, args.reason.trim()).await?;
            let record = record("pause", &args.job, &args.reason, &before, Some(&paused));
            audit(args.audit_log.as_deref(), &record).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("paused, but the audit log could not be written: {e}"),
                )
            })?;
            match paused.until_ms.and_then(ms_rfc3339) {
                Some(until) => outln!("paused {} until {until}", args.job),
                None => outln!("paused {} until resumed", args.job),
            }
            Ok(0)
        }
        ScheduleCommand::Resume(args) => {
            let board = ScheduleBoard::new(&store, &args.job)?;
            let before = board.paused().await.ok().flatten();
            started_job(&store, &board, before.is_some())
                .await
                .map_err(|e| Failure::new(exit::NO_LEADER, escape_line(&e)))?;
            let was = board.resume().await?;
            let record = record("resume", &args.job, &args.reason, &before, None);
            audit(args.audit_log.as_deref(), &record).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("resumed, but the audit log could not be written: {e}"),
                )
            })?;
            if was {
                outln!("resumed {}", args.job);
            } else {
                outln!("{} was not paused", args.job);
            }
            Ok(0)
        }
    }
}

/// An audit record of a pause or resume (the console's and the CLI's).
pub fn record(
    action: &str,
    job: &str,
    reason: &str,
    before: &Option<tenure::Paused>,
    after: Option<&tenure::Paused>,
) -> serde_json::Value {
    serde_json::json!({
        "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        "who": crate::audit::operator(),
        "from": format!("tenure schedule on {}", tenure::default_label()),
        "action": action,
        "target": job,
        "reason": reason,
        "before": before.as_ref().map(paused_json),
        "after": after.map(paused_json),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_read_in_one_word_with_the_exit_code() {
        assert_eq!(outcome_of("finished"), ("succeeded", None));
        assert_eq!(outcome_of("failed: exit 3"), ("failed", Some(3)));
        assert_eq!(
            outcome_of("stopped: the leader's term ended; exit 143"),
            ("stopped", Some(143))
        );
        assert_eq!(outcome_of("failed: cannot run \"x\""), ("failed", None));
    }
}
