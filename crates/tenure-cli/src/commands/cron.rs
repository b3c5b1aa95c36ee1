//! `tenure cron SCHEDULE NAME -- COMMAND`: run a command on a cron schedule
//! across instances, once per tick or only on the leader.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tenure::{SessionOptions, Store};

use super::lease::{check_ttl, check_ttl_on};
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
    /// How long a run that must stop (SIGTERM or SIGINT to tenure, the
    /// leader's term over, --at-most) has between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    grace: Duration,
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

pub(super) async fn run(
    store: Arc<dyn Store>,
    args: CronArgs,
    runner: super::Runner,
) -> Result<u8, Failure> {
    check_ttl_on(&store, args.ttl)?;
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
    let hub = runner.hub;
    let shutdown = {
        let hub = hub.clone();
        async move {
            hub.stopped().await;
        }
    };
    let runner = TickRunner::new(&args.name, args.command.clone(), args.ttl, args.grace, &hub);
    // Checked in `validate`; the library parsed it too.
    let tz: chrono_tz::Tz = args.tz.parse().unwrap_or(chrono_tz::UTC);
    schedule
        .stop_grace(runner.library_grace())
        .run(move |tick| runner.clone().run(tick, tz), shutdown)
        .await?;
    Ok(0)
}

/// Runs a job's ticks under the supervisor: what `cron` and `crond` share.
#[derive(Clone)]
pub(super) struct TickRunner {
    job: Arc<str>,
    command: Arc<[String]>,
    /// The environment the runs get before the tick's own (a crontab's
    /// environment lines).
    env: Arc<[(String, String)]>,
    /// SIGTERM this long before the lease's local deadline.
    lease_grace: Duration,
    /// Between SIGTERM and SIGKILL when a run must stop.
    stop_grace: Duration,
    hub: child::SignalHub,
}

impl TickRunner {
    pub(super) fn new(
        job: &str,
        command: Vec<String>,
        ttl: Duration,
        grace: Duration,
        hub: &child::SignalHub,
    ) -> TickRunner {
        TickRunner {
            job: job.into(),
            command: command.into(),
            env: Arc::new([]),
            lease_grace: grace.min(ttl / 6),
            stop_grace: grace,
            hub: hub.clone(),
        }
    }

    /// Runs with these variables set too (the tick's own come after).
    pub(super) fn with_env(mut self, env: Vec<(String, String)>) -> TickRunner {
        self.env = env.into();
        self
    }

    /// How long the library polls a run that must stop before it drops it
    /// (which kills the group at once): a little more than the grace, so
    /// that the supervisor's own SIGKILL comes first.
    pub(super) fn library_grace(&self) -> Duration {
        self.stop_grace + Duration::from_secs(1)
    }

    /// One tick's run: the command under the supervisor, held to the lease
    /// of the session that claimed the tick, and stopped (SIGTERM, the
    /// grace, SIGKILL) when the library says the run must stop. A run that
    /// exits non-zero (or dies of a signal: 128+N) is a failed run on the
    /// board and in the metrics.
    pub(super) async fn run(self, tick: tenure::Tick, tz: chrono_tz::Tz) -> Result<(), String> {
        let mut env: Vec<(&str, String)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        env.extend(tick_env(&self.job, &tick, tz));
        let run = child::Run {
            command: &self.command,
            env: &env,
            lease_grace: self.lease_grace,
            stop_grace: self.stop_grace,
        };
        // The library says when the run must stop; a lost lease is stopped
        // within the lease grace, anything else within the stop grace.
        let why = || {
            tick.stop_reason()
                .unwrap_or("the run must stop")
                .to_string()
        };
        let lost = async {
            tick.stopped().await;
            if !tick.is_lease_lost() {
                std::future::pending::<()>().await;
            }
            why()
        };
        let ended = async {
            tick.stopped().await;
            if tick.is_lease_lost() {
                std::future::pending::<()>().await;
            }
            why()
        };
        let outcome = child::supervise(&run, &tick, lost, ended, &self.hub).await;
        match outcome {
            Ok(child::Outcome::Exited(0)) => Ok(()),
            Ok(child::Outcome::Exited(code)) => Err(format!("exit {code}")),
            // The library knows why it stopped the run: only the code here.
            Ok(child::Outcome::Stopped { code, .. }) => Err(format!("exit {code}")),
            Ok(child::Outcome::LeaseLost(why)) => Err(format!("lease lost: {why}")),
            Err(f) => Err(f.message),
        }
    }
}
