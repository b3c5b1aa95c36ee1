//! The subcommands, one file each (`tenure <name>` is `commands/<name>.rs`),
//! and what runs before any of them: the checks that need no store, the
//! store's URL, the metrics endpoint.

pub(crate) mod backends;
pub(crate) mod cell;
pub(crate) mod completions;
pub(crate) mod console;
pub(crate) mod cron;
pub(crate) mod crond;
pub(crate) mod elect;
pub(crate) mod elector;
pub(crate) mod fence;
mod init;
pub(crate) mod leader;
mod lease;
pub(crate) mod lock;
pub(crate) mod man;
pub(crate) mod release;
pub(crate) mod schedule;
pub(crate) mod shards;
pub(crate) mod status;
pub(crate) mod torture;
pub(crate) mod upgrade;

use std::path::PathBuf;

use tenure::Error;

use crate::cli::{Cli, Command};
use crate::exit::{self, Failure};
use crate::output::escape_line;
use crate::process_metrics;

/// Runs the parsed command: checks its input, opens the store (and the
/// metrics endpoint), and hands it to its subcommand.
pub(crate) async fn run(cli: Cli) -> Result<u8, Failure> {
    match &cli.command {
        Command::Backends(args) => return backends::run(args.json),
        Command::Completions(args) => return completions::run(args.shell),
        Command::Man => return man::run(),
        _ => {}
    }
    validate(&cli.command)?;
    let url = store_url(cli.store)?;
    let metrics = match &cli.command {
        Command::Lock(a) => a.metrics.metrics,
        Command::Elect(a) => a.metrics.metrics,
        Command::Cron(a) => a.metrics.metrics,
        Command::Crond(a) => a.metrics.metrics,
        Command::Shards(a) => a.metrics.metrics,
        _ => None,
    };
    if let Some(addr) = metrics {
        // Before the store opens, so its metrics are described and kept.
        let bound = process_metrics::serve(addr)
            .await
            .map_err(|m| Failure::new(exit::UNAVAILABLE, m))?;
        eprintln!("tenure: metrics on http://{bound}/metrics");
    }
    // A runner catches signals from here on, and its wait covers a store
    // that is briefly unavailable at open as well.
    let mut runner = match &cli.command {
        Command::Lock(a) => Some(Runner::new(true, lease::Retry::new(a.no_wait, a.wait))?),
        Command::Elect(_) | Command::Cron(_) => {
            Some(Runner::new(true, lease::Retry::new(false, None))?)
        }
        Command::Crond(_) => Some(Runner::new(false, lease::Retry::new(false, None))?),
        Command::Shards(a) if a.runs() => Some(Runner::new(true, lease::Retry::new(false, None))?),
        _ => None,
    };
    let store = loop {
        match (tenure::open(&url).await, runner.as_mut()) {
            (Ok(store), _) => break store,
            (Err(e), Some(r)) if r.retry.may(&e) => {
                if let Err(code) = r.retry.pause(&e, &r.hub).await {
                    return Ok(code);
                }
            }
            (Err(e), _) => return Err(e.into()),
        }
    };
    let runner = runner.take();
    match (cli.command, runner) {
        (Command::Lock(args), Some(runner)) => lock::run(store, args, runner).await,
        (Command::Elect(args), Some(runner)) => elect::run(store, args, runner).await,
        (Command::Cron(args), Some(runner)) => cron::run(store, args, runner).await,
        (Command::Crond(args), Some(runner)) => crond::run(store, args, runner).await,
        (Command::Shards(args), Some(runner)) => shards::run(store, args, runner).await,
        (command, _) => run_plain(store, &url, command).await,
    }
}

/// What a runner (`lock`, `elect`, `cron`, `crond`, `shards`) gets before its store
/// opens: the process's signal hub, and its wait for a store briefly
/// unavailable.
pub(crate) struct Runner {
    pub(crate) hub: crate::child::SignalHub,
    pub(crate) retry: lease::Retry,
}

impl Runner {
    fn new(hup_stops: bool, retry: lease::Retry) -> Result<Runner, Failure> {
        Ok(Runner {
            hub: crate::child::SignalHub::start(hup_stops)?,
            retry,
        })
    }
}

/// The subcommands that are not runners.
async fn run_plain(
    store: std::sync::Arc<dyn tenure::Store>,
    url: &str,
    command: Command,
) -> Result<u8, Failure> {
    let url = url.to_string();
    match command {
        Command::Lock(_) | Command::Elect(_) | Command::Cron(_) | Command::Crond(_) => Err(
            Failure::new(exit::SOFTWARE, "a runner started without its signal hub"),
        ),
        Command::Shards(args) => shards::status(store, args).await,
        Command::Leader(args) => leader::run(store, args).await,
        Command::Status(args) => status::run(store, args).await,
        Command::Release(args) => release::run(store, args).await,
        Command::Fence(args) => fence::run(store, args).await,
        Command::Torture(args) => torture::run(store, &url, args).await,
        Command::TortureWorker(args) => torture::worker(store, args).await,
        Command::Cell(command) => cell::run(store, command).await,
        Command::Schedule(command) => schedule::run(store, command).await,
        Command::Elector(command) => elector::run(store, command).await,
        Command::Console(args) => console::run(store, &url, args).await,
        Command::Upgrade(command) => upgrade::run(store, command).await,
        Command::Init => init::run(store).await,
        Command::Backends(_) | Command::Completions(_) | Command::Man => Ok(0),
    }
}

/// Checks what can be checked without the store, so a mistake is reported
/// as one (64, 126, 127) whether or not the store answers.
fn validate(command: &Command) -> Result<(), Failure> {
    match command {
        Command::Schedule(command) => schedule::validate(command),
        Command::Elector(command) => elector::validate(command),
        Command::Release(args) => release::validate(args),
        Command::Fence(args) => fence::validate(args),
        Command::Cell(command) => cell::validate(command),
        Command::Lock(args) => lock::validate(args),
        Command::Elect(args) => elect::validate(args),
        Command::Cron(args) => cron::validate(args),
        Command::Crond(args) => crond::validate(args),
        Command::Shards(args) => shards::validate(args),
        _ => Ok(()),
    }
}

/// --store, else $TENURE_STORE (through clap), else the SQLite file in the
/// user's state directory, created on first use.
fn store_url(flag: Option<String>) -> Result<String, Failure> {
    if let Some(url) = flag {
        if url.trim().is_empty() {
            return Err(Failure::new(
                exit::USAGE,
                "the store URL (--store or $TENURE_STORE) is empty: give a URL, or leave both unset for the default SQLite store",
            ));
        }
        return Ok(url);
    }
    let dir = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(state) => PathBuf::from(state).join("tenure"),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".local/state/tenure"),
            None => {
                return Err(Failure::new(
                    exit::USAGE,
                    "no --store, no $TENURE_STORE, and no $HOME or $XDG_STATE_HOME for the default store",
                ))
            }
        },
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        Failure::new(
            exit::USAGE,
            format!(
                "cannot create the default store's directory {}: {e}",
                dir.display()
            ),
        )
    })?;
    Ok(format!("sqlite://{}", dir.join("tenure.db").display()))
}

/// A positive whole number given as `what` on the command line: digits
/// only, at most the largest token or version a store hands out.
pub(super) fn positive(what: &str, text: &str) -> Result<u64, Failure> {
    let n = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>()
            .ok()
            .filter(|n| *n > 0 && i64::try_from(*n).is_ok())
    } else {
        None
    };
    n.ok_or_else(|| {
        Failure::new(
            exit::USAGE,
            format!(
                "{what} must be a whole number from 1 to {}, not {:?}",
                i64::MAX,
                escape_line(text)
            ),
        )
    })
}

/// A fence's or a cell's name used as the other is bad input here: exit 64,
/// not 75, so that a retry loop on 75 does not spin on it.
pub(super) fn register_failure(e: Error) -> Failure {
    match e {
        Error::Conflict { .. } => Failure::new(exit::USAGE, e.to_string()),
        e => e.into(),
    }
}
