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
pub(crate) mod leader;
mod lease;
pub(crate) mod lock;
pub(crate) mod man;
pub(crate) mod release;
pub(crate) mod schedule;
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
        _ => None,
    };
    if let Some(addr) = metrics {
        // Before the store opens, so its metrics are described and kept.
        let bound = process_metrics::serve(addr)
            .await
            .map_err(|m| Failure::new(exit::UNAVAILABLE, m))?;
        eprintln!("tenure: metrics on http://{bound}/metrics");
    }
    let store = tenure::open(&url).await?;
    match cli.command {
        Command::Lock(args) => lock::run(store, args).await,
        Command::Elect(args) => elect::run(store, args).await,
        Command::Leader(args) => leader::run(store, args).await,
        Command::Status(args) => status::run(store, args).await,
        Command::Release(args) => release::run(store, args).await,
        Command::Cron(args) => cron::run(store, args).await,
        Command::Crond(args) => crond::run(store, args).await,
        Command::Fence(args) => fence::run(store, args).await,
        Command::Torture(args) => torture::run(store, &url, args).await,
        Command::TortureWorker(args) => torture::worker(store, args).await,
        Command::Cell(command) => cell::run(store, command).await,
        Command::Schedule(command) => schedule::run(store, command).await,
        Command::Elector(command) => elector::run(store, command).await,
        Command::Console(args) => console::run(store, &url, args).await,
        Command::Upgrade(command) => upgrade::run(store, command).await,
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
