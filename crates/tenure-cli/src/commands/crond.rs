//! `tenure crond NAME --crontab FILE`: one election for a service, and the
//! crontab's jobs run only on its leader.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tenure::{ElectorHandle, SessionOptions, Store};

use super::cron::TickRunner;
use super::lease::{check_ttl, check_ttl_on};
use crate::child::{self, SignalHub};
use crate::cli::{parse_duration, MetricsArg};
use crate::exit::{self, Failure};
use crate::output::escape_line;

#[derive(Args, Debug)]
pub(crate) struct CrondArgs {
    /// The service's election: one leader runs every job of the crontab.
    name: String,
    /// The crontab: one job per line, `[name=JOB] [on-failure=resign] SCHEDULE COMMAND…`.
    #[arg(long)]
    crontab: PathBuf,
    /// The value the leader campaigns with (shown by `tenure leader`);
    /// the session's label by default.
    #[arg(long)]
    value: Option<String>,
    /// The time zone the schedules are read in (and TENURE_TICK_AT is given in).
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// Session TTL.
    #[arg(long, default_value = "15s", value_parser = parse_duration, allow_hyphen_values = true)]
    ttl: Duration,
    /// On SIGTERM or SIGINT: how long running jobs get between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    grace: Duration,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
}

/// One line of the crontab.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Job {
    name: String,
    expr: String,
    command: String,
    resign_on_failure: bool,
    /// The crontab's environment lines above the job, in order.
    env: Vec<(String, String)>,
}

impl Job {
    /// The program and arguments that run the job: `$SHELL -c COMMAND`
    /// (`sh` unless an environment line set `SHELL`), as cron runs it.
    fn argv(&self) -> Vec<String> {
        let shell = self
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "SHELL")
            .map_or("sh", |(_, v)| v.as_str());
        vec![shell.to_string(), "-c".to_string(), self.command.clone()]
    }
}

/// Whether a word reads as a field of a cron schedule (`*/5`, `1-5`,
/// `MON-FRI`, `L`) rather than as a command.
fn field_like(word: &str) -> bool {
    const NAMES: [&str; 22] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC", "MON",
        "TUE", "WED", "THU", "FRI", "SAT", "SUN", "L", "W", "LW",
    ];
    !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "*/,-?#".contains(c))
        && word
            .split(|c: char| !c.is_ascii_alphabetic())
            .filter(|run| !run.is_empty())
            .all(|run| NAMES.iter().any(|n| n.eq_ignore_ascii_case(run)))
}

/// An environment line (`NAME=value`, `NAME = "value"`), as cron reads
/// them; `None` for a job's line.
fn env_line(line: &str) -> Option<(String, String)> {
    let (key, value) = line.split_once('=')?;
    let key = key.trim_end();
    let starts_well = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
    if !starts_well || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    if key == "name" {
        return None;
    }
    let value = value.trim();
    // `colour=red @every 1s x` is an option misspelt, not an environment
    // line: refused as an unknown option.
    let mut words = value.split_whitespace();
    if words
        .nth(1)
        .is_some_and(|w| w.starts_with('@') || field_like(w))
    {
        return None;
    }
    let unquoted = ['"', '\'']
        .iter()
        .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
        .unwrap_or(value);
    Some((key.to_string(), unquoted.to_string()))
}

/// How many of a line's words make its schedule: 1 for a shorthand, 2 for
/// `@every D`, else the cron fields before the command (5 to 7).
fn schedule_words(words: &[&str]) -> Result<usize, String> {
    match words.first() {
        None => Err("a schedule and then a command".into()),
        Some(&"@every") => Ok(2),
        Some(w) if w.starts_with('@') => Ok(1),
        Some(_) => {
            let n = words.iter().take_while(|w| field_like(w)).count();
            match n {
                0..=4 => Err(format!(
                    "a schedule has five fields (six with seconds first, seven with a year last) and then a command: {n} field(s) found before {:?}",
                    words.get(n).copied().unwrap_or_default()
                )),
                5..=7 => Ok(n),
                _ => Err(format!(
                    "{n} fields: a schedule has at most seven (seconds first, a year last), then a command"
                )),
            }
        }
    }
}

/// A job's command as cron would have it, or why not: an unescaped `%`
/// (cron's new line and standard input) is refused; `\%` is a `%`.
fn command_of(words: &[&str]) -> Result<String, String> {
    let command = words.join(" ");
    let mut escaped = false;
    for c in command.chars() {
        if c == '%' && !escaped {
            return Err(
                "'%' in the command: cron turns it into a new line and standard input, tenure does not; write \\% for a literal %, or put the input in a script".into(),
            );
        }
        escaped = c == '\\' && !escaped;
    }
    Ok(command.replace("\\%", "%"))
}

fn parse_crontab(text: &str, service: &str) -> Result<Vec<Job>, String> {
    let mut jobs: Vec<Job> = Vec::new();
    let mut env: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |why: String| format!("line {}: {why}", i + 1);
        if let Some(setting) = env_line(line) {
            env.push(setting);
            continue;
        }
        let mut words: Vec<&str> = line.split_whitespace().collect();
        let mut name = None;
        let mut on_failure = None;
        while let Some((key, value)) = words.first().and_then(|w| w.split_once('=')) {
            let twice = || at(format!("{key}= given twice"));
            match (key, value) {
                ("name", v) if !v.is_empty() => {
                    if name.replace(v.to_string()).is_some() {
                        return Err(twice());
                    }
                }
                ("on-failure", "resign" | "continue") => {
                    if on_failure.replace(value == "resign").is_some() {
                        return Err(twice());
                    }
                }
                _ => {
                    return Err(at(format!(
                        "unknown option {:?} (name=JOB, on-failure=resign or on-failure=continue; an environment line is NAME=value alone)",
                        words[0]
                    )))
                }
            }
            words.remove(0);
        }
        let fields = schedule_words(&words).map_err(at)?;
        let expr = words[..fields.min(words.len())].join(" ");
        if words.len() <= fields {
            return Err(at(format!(
                "no command after the schedule {expr:?} (a line is a schedule and then a command)"
            )));
        }
        tenure::Timetable::parse(&expr).map_err(|e| at(e.to_string()))?;
        let command = command_of(&words[fields..]).map_err(at)?;
        let name = name.unwrap_or_else(|| derived_name(service, &expr, &command));
        tenure::ScheduleBoard::check_job(&name).map_err(|e| at(e.to_string()))?;
        if jobs.iter().any(|j| j.name == name) {
            return Err(at(format!(
                "a second job named {name:?} (give one of them name=…)"
            )));
        }
        jobs.push(Job {
            name,
            expr,
            command,
            resign_on_failure: on_failure.unwrap_or(false),
            env: env.clone(),
        });
    }
    if jobs.is_empty() {
        return Err("no job in the crontab".into());
    }
    Ok(jobs)
}

fn derived_name(service: &str, expr: &str, command: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for b in expr.bytes().chain([b'\n']).chain(command.bytes()) {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let word: String = command
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(32)
        .collect();
    format!("{service}.{word}-{hash:08x}")
}

fn read_crontab(path: &Path, service: &str) -> Result<Vec<Job>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::new(
            exit::USAGE,
            format!("cannot read the crontab {}: {e}", path.display()),
        )
    })?;
    parse_crontab(&text, service).map_err(|e| {
        Failure::new(
            exit::USAGE,
            escape_line(&format!("{}: {e}", path.display())),
        )
    })
}

/// Checks the TTL, the zone and the crontab before the store is opened.
pub(super) fn validate(args: &CrondArgs) -> Result<(), Failure> {
    check_ttl(args.ttl)?;
    args.tz
        .parse::<chrono_tz::Tz>()
        .map_err(|e| Failure::new(exit::USAGE, format!("invalid time zone {:?}: {e}", args.tz)))?;
    tenure::Name::new(&args.name)?;
    for job in read_crontab(&args.crontab, &args.name)? {
        child::check_command(&job.argv()[..1])?;
    }
    Ok(())
}

/// A job running under the elector.
struct Running {
    job: Job,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<tenure::Result<()>>,
}

/// What every job of the crontab is started with.
struct Setup<'a> {
    store: &'a Arc<dyn Store>,
    elector: &'a ElectorHandle,
    options: &'a SessionOptions,
    tz: chrono_tz::Tz,
    ttl: Duration,
    grace: Duration,
    hub: &'a SignalHub,
}

fn start(setup: &Setup<'_>, job: Job) -> Result<Running, Failure> {
    let runner = TickRunner::new(&job.name, job.argv(), setup.ttl, setup.grace, setup.hub)
        .with_env(job.env.clone());
    let schedule = tenure::Schedule::new(setup.store, &job.name, &job.expr)?
        .time_zone(setup.tz.name())?
        .leader_of(setup.elector)
        .resign_on_failure(job.resign_on_failure)
        .session_options(setup.options.clone())
        .stop_grace(runner.library_grace());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let tz = setup.tz;
    let task = tokio::spawn(
        schedule.run(move |tick| runner.clone().run(tick, tz), async {
            let _ = stopped.await;
        }),
    );
    Ok(Running { job, stop, task })
}

/// Stops every job: their runs got the signal tenure got (from the signal
/// hub) and end within the grace, SIGKILL after it; then the schedules end.
async fn stop_all(jobs: Vec<Running>, grace: Duration) {
    let mut tasks = Vec::new();
    for r in jobs {
        let _ = r.stop.send(());
        tasks.push((r.job.name, r.task));
    }
    // The runs' groups are gone by the grace and the supervisor's SIGKILL;
    // the rest is the store's answers for the last records.
    let deadline = tokio::time::Instant::now() + grace + Duration::from_secs(15);
    for (name, task) in tasks {
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Err(e))) => {
                tracing::warn!(job = %name, error = %e, "the job ended with an error")
            }
            Ok(_) => {}
            Err(_) => tracing::error!(job = %name, "the job did not end 15 s after its grace"),
        }
    }
}

pub(super) async fn run(
    store: Arc<dyn Store>,
    args: CrondArgs,
    runner: super::Runner,
) -> Result<u8, Failure> {
    check_ttl_on(&store, args.ttl)?;
    let tz: chrono_tz::Tz = args.tz.parse().unwrap_or(chrono_tz::UTC);
    let options = SessionOptions::new().ttl(args.ttl);
    let value = args.value.clone().unwrap_or_else(tenure::default_label);
    // Signals are caught before the first job can start a run; SIGHUP
    // reads the crontab again.
    let hub = runner.hub;
    let mut hangups = hub.hangups();
    let elector = tenure::Elector::new(&store, &args.name, value)?
        .session_options(options.clone())
        .stop_grace(args.grace + Duration::from_secs(1));
    let handle = elector.handle();
    let (stop_elector, elector_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut elector_task = tokio::spawn(elector.run(async {
        let _ = elector_stopped.await;
    }));
    let setup = Setup {
        store: &store,
        elector: &handle,
        options: &options,
        tz,
        ttl: args.ttl,
        grace: args.grace,
        hub: &hub,
    };
    let mut jobs: HashMap<String, Running> = HashMap::new();
    for job in read_crontab(&args.crontab, &args.name)? {
        jobs.insert(job.name.clone(), start(&setup, job)?);
    }
    eprintln!(
        "tenure: crond {} runs {} job(s) while leader",
        args.name,
        jobs.len()
    );
    let ended = loop {
        tokio::select! {
            _ = hub.stopped() => break Ok(0),
            _ = hangups.recv() => reload(&setup, &args, &mut jobs).await,
            result = &mut elector_task => {
                // The elector ends only on a lasting error (such as a name
                // the store refuses): nothing can run.
                break match result {
                    Ok(Err(e)) => Err(Failure::from(e)),
                    _ => Err(Failure::new(exit::SOFTWARE, "the elector stopped unexpectedly")),
                };
            }
        }
    };
    // Resign only once no run is left.
    stop_all(jobs.into_values().collect(), args.grace).await;
    let _ = stop_elector.send(());
    if !elector_task.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(30), elector_task).await;
    }
    ended
}

async fn reload(setup: &Setup<'_>, args: &CrondArgs, jobs: &mut HashMap<String, Running>) {
    let wanted = match read_crontab(&args.crontab, &args.name) {
        Ok(wanted) => wanted,
        Err(f) => {
            eprintln!("tenure: SIGHUP: {}; the jobs go on as they were", f.message);
            return;
        }
    };
    let gone: Vec<String> = jobs
        .iter()
        .filter(|(name, r)| !wanted.iter().any(|w| &w.name == *name && *w == r.job))
        .map(|(name, _)| name.clone())
        .collect();
    let mut stopping = Vec::new();
    for name in gone {
        if let Some(r) = jobs.remove(&name) {
            stopping.push(r);
        }
    }
    // A stopping job's run finishes as it would (no signal): a job that is
    // only changed must not be cut short by a reload.
    for r in stopping {
        let _ = r.stop.send(());
        let _ = r.task.await;
    }
    let mut started = 0;
    for job in wanted {
        if jobs.contains_key(&job.name) {
            continue;
        }
        match start(setup, job.clone()) {
            Ok(r) => {
                jobs.insert(job.name, r);
                started += 1;
            }
            Err(f) => eprintln!("tenure: SIGHUP: job {}: {}", job.name, f.message),
        }
    }
    eprintln!(
        "tenure: SIGHUP: crontab read again: {} job(s), {started} started",
        jobs.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_with_options_and_five_or_six_fields() {
        let jobs = parse_crontab(
            "# comment\n\n@every 1s echo one\nname=report on-failure=resign */5 * * * * ./report.sh --all\n0 0 9 * * MON echo six\n0 9 * * 1 echo five\n",
            "svc",
        )
        .unwrap();
        assert_eq!(jobs.len(), 4);
        assert_eq!(jobs[0].expr, "@every 1s");
        assert_eq!(jobs[0].command, "echo one");
        assert!(jobs[0].name.starts_with("svc.echo-"), "{}", jobs[0].name);
        assert_eq!(jobs[1].name, "report");
        assert!(jobs[1].resign_on_failure);
        assert_eq!(jobs[1].command, "./report.sh --all");
        assert_eq!(jobs[2].expr, "0 0 9 * * MON");
        assert_eq!(jobs[3].expr, "0 9 * * 1");
        assert_eq!(jobs[3].command, "echo five");
    }

    #[test]
    fn environment_lines_set_the_following_jobs_environment() {
        let jobs = parse_crontab(
            "MAILTO=\"\"\nPATH=/usr/bin:/bin\n@every 1s echo a\nSHELL = /bin/bash\nGREETING='hello world'\n@every 2s echo b \\% c\n",
            "s",
        )
        .unwrap();
        let env =
            |j: &Job| -> Vec<String> { j.env.iter().map(|(k, v)| format!("{k}={v}")).collect() };
        assert_eq!(env(&jobs[0]), ["MAILTO=", "PATH=/usr/bin:/bin"]);
        assert_eq!(jobs[0].argv()[0], "sh");
        assert_eq!(
            env(&jobs[1]),
            [
                "MAILTO=",
                "PATH=/usr/bin:/bin",
                "SHELL=/bin/bash",
                "GREETING=hello world"
            ]
        );
        assert_eq!(jobs[1].argv(), ["/bin/bash", "-c", "echo b % c"]);
        // Seven fields: a year last.
        let jobs = parse_crontab("0 0 12 * * ? 2099 echo far\n", "s").unwrap();
        assert_eq!(jobs[0].expr, "0 0 12 * * ? 2099");
        assert_eq!(jobs[0].command, "echo far");
    }

    #[test]
    fn names_come_from_content_not_position() {
        let a = parse_crontab("@every 1s echo a\n@every 3s echo b\n", "s").unwrap();
        let b = parse_crontab("@every 3s echo b\n@every 1s echo a\n", "s").unwrap();
        assert_eq!(a[0].name, b[1].name);
        assert_eq!(a[1].name, b[0].name);
        assert_ne!(a[0].name, a[1].name);
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, says) in [
            ("61 * * * * echo", "line 1: "),
            ("@every 1s", "a schedule and then a command"),
            ("colour=red @every 1s x", "unknown option"),
            ("*/5 * * * * *", "no command after the schedule"),
            ("* * * * * * * * echo", "8 fields"),
            ("name=x name=y @every 1s true", "name= given twice"),
            ("@every 1s date +%s", "'%' in the command"),
            ("@every 1ms true", "whole seconds"),
            ("99 * * * * 1 true", "second field"),
            ("@every 1s x\n@every 1s x\n", "line 2: a second job"),
            ("# nothing\n", "no job"),
        ] {
            let e = parse_crontab(text, "s").unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        let e = parse_crontab("61 * * * * echo", "s").unwrap_err();
        assert!(e.contains("minute must be 0-59, not 61"), "{e}");
    }
}
