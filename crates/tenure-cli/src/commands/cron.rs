//! `tenure cron SCHEDULE NAME -- COMMAND`: run a command on a cron schedule
//! across instances, once per tick or only on the leader.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tenure::{SessionOptions, Store};

use super::lease::check_ttl;
use crate::child;
use crate::cli::{parse_duration, MetricsArg};
use crate::exit::{self, Failure};

#[derive(Args, Debug)]
pub(crate) struct CronArgs {
    /// When to run: a crontab expression ('*/5 * * * *', or six fields with
    /// seconds first), '@hourly' and the like, or '@every 90s'.
    schedule: String,
    /// The job's name.
    name: String,
    /// Who runs ticks.
    #[arg(long, value_enum, default_value = "per-tick")]
    mode: CronMode,
    /// The time zone the schedule is read in.
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// What to do about ticks missed while no instance could run them.
    #[arg(long, value_enum, default_value = "skip")]
    missed: CronMissed,
    /// Kill a run (its whole process group) that lasts longer than this (more than 0).
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    at_most: Option<Duration>,
    /// Keep each tick's claim held at least this long after the tick was due,
    /// even if the run ends sooner. Each tick has a claim of its own, so this
    /// does NOT limit how often the job runs across instances (ShedLock's
    /// lockAtLeastFor does); it only keeps the claim held (and shown by
    /// `tenure status`) that long.
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true, verbatim_doc_comment)]
    at_least: Option<Duration>,
    /// Session TTL.
    #[arg(long, default_value = "15s", value_parser = parse_duration, allow_hyphen_values = true)]
    ttl: Duration,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CronMode {
    PerTick,
    Leader,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CronMissed {
    Skip,
    RunOnce,
}

/// Checks the TTL, `--at-most`, the schedule (that it fires at all, in its
/// zone) and the command before the store is opened.
pub(super) fn validate(args: &CronArgs) -> Result<(), Failure> {
    check_ttl(args.ttl)?;
    if args.at_most.is_some_and(|d| d.is_zero()) {
        return Err(Failure::new(
            exit::USAGE,
            "--at-most 0s would kill every run at once: give a positive duration, or leave it out",
        ));
    }
    let timetable = tenure::Timetable::parse(&args.schedule)?;
    let tz: chrono_tz::Tz = args
        .tz
        .parse()
        .map_err(|e| Failure::new(exit::USAGE, format!("invalid time zone {:?}: {e}", args.tz)))?;
    if timetable.next_after(chrono::Utc::now(), &tz).is_none() {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "the schedule {:?} never fires (no time matches it from now on)",
                args.schedule
            ),
        ));
    }
    child::check_command(&args.command)
}

/// What a run is told of its tick: `TENURE_JOB`, `TENURE_TICK` (Unix
/// seconds), `TENURE_TICK_AT` (RFC 3339 in `tz`) and, under a leader,
/// `TENURE_FENCE` (the term's token).
pub(super) fn tick_env(
    job: &str,
    tick: &tenure::Tick,
    tz: chrono_tz::Tz,
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("TENURE_JOB", job.to_string()),
        ("TENURE_TICK", tick.at.timestamp().to_string()),
        ("TENURE_TICK_AT", tick.at.with_timezone(&tz).to_rfc3339()),
    ];
    if let Some(token) = tick.leader_token {
        env.push(("TENURE_FENCE", token.to_string()));
    }
    env
}

pub(super) async fn run(store: Arc<dyn Store>, args: CronArgs) -> Result<u8, Failure> {
    let mut schedule = tenure::Schedule::new(&store, &args.name, &args.schedule)?
        .time_zone(&args.tz)?
        .mode(match args.mode {
            CronMode::PerTick => tenure::ScheduleMode::PerTick,
            CronMode::Leader => tenure::ScheduleMode::Leader,
        })
        .missed(match args.missed {
            CronMissed::Skip => tenure::Missed::Skip,
            CronMissed::RunOnce => tenure::Missed::RunOnce,
        })
        .session_options(SessionOptions::new().ttl(args.ttl));
    if let Some(d) = args.at_most {
        schedule = schedule.lock_at_most_for(d);
    }
    if let Some(d) = args.at_least {
        schedule = schedule.lock_at_least_for(d);
    }
    let running = child::RunningGroup::default();
    let stop = child::forward_signals_then_stop(running.clone())?;
    let name = args.name.clone();
    let command = args.command.clone();
    // Checked in `validate`; the library parsed it too.
    let tz: chrono_tz::Tz = args.tz.parse().unwrap_or(chrono_tz::UTC);
    schedule
        .run(
            move |tick| {
                let env = tick_env(&name, &tick, tz);
                let (command, running) = (command.clone(), running.clone());
                async move {
                    // A run that exits non-zero (or dies of a signal: 128+N)
                    // is a failed run on the board and in the metrics.
                    match child::run_tick(&command, &env, &running).await {
                        Ok(0) => Ok(()),
                        Ok(code) => Err(format!("exit {code}")),
                        Err(f) => Err(f.message),
                    }
                }
            },
            stop,
        )
        .await?;
    Ok(0)
}
