//! `tenure elector pause|resume|status NAME`: an elector's cluster-wide
//! pause, for maintenance, and who leads it.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use tenure::{ElectorBoard, Name, Store};

use crate::audit::audit;
use crate::exit::{self, Failure};
use crate::output::escape_line;

#[derive(Subcommand, Debug)]
pub enum ElectorCommand {
    /// Pause an elector on every instance: none campaigns, the leader steps down.
    #[command(
        after_help = "Example:\n  tenure elector pause scheduler --for 30m --reason 'database failover'\n\n\
        Every instance of the elector (a `tenure crond`, or the library's Elector) reads the pause\n\
        once per renew interval: the leader steps down and nobody campaigns until it is resumed or\n\
        --for has passed (judged by each instance's clock). Needs a store with cells (`tenure\n\
        backends` says `cells (and so pauses): yes`). Exits 3 when no instance of NAME has started on the store."
    )]
    Pause(PauseArgs),
    /// Lift an elector's pause.
    #[command(after_help = "Example:\n  tenure elector resume scheduler")]
    Resume(ResumeArgs),
    /// Who leads an elector, since when, and whether it is paused.
    #[command(after_help = "Example:\n  tenure elector status scheduler --json")]
    Status(StatusArgs),
}

#[derive(Args, Debug)]
pub struct PauseArgs {
    /// The election's name.
    pub name: String,
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
    /// The election's name.
    pub name: String,
    /// Why (kept in the audit record).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Append the audit record (JSON, one line) to this file too.
    #[arg(long, env = "TENURE_AUDIT_LOG")]
    pub audit_log: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The election's name.
    pub name: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Checks a command's input before the store is opened.
pub fn validate(command: &ElectorCommand) -> Result<(), Failure> {
    let name = match command {
        ElectorCommand::Pause(a) => {
            super::schedule::check_for(a.for_)?;
            &a.name
        }
        ElectorCommand::Resume(a) => &a.name,
        ElectorCommand::Status(a) => &a.name,
    };
    // The board's cells carry the name: one too long for them is refused here.
    Name::new(format!("tenure.elector-pause:{name}"))?;
    Name::new(name)?;
    Ok(())
}

/// Refuses an elector no instance has started on this store, unless it is
/// paused already (so that such a pause can still be lifted).
async fn started(
    store: &Arc<dyn Store>,
    board: &ElectorBoard,
    paused: bool,
) -> Result<(), Failure> {
    if !store.capabilities().cells || paused || board.exists().await? {
        return Ok(());
    }
    let known = ElectorBoard::electors(store).await.unwrap_or_default();
    let started = if known.is_empty() {
        "none has".to_string()
    } else {
        format!("started: {}", known.join(", "))
    };
    Err(Failure::new(
        exit::NO_LEADER,
        escape_line(&format!(
            "no elector named {} has started on this store ({started})",
            board.name()
        )),
    ))
}

pub async fn run(store: Arc<dyn Store>, command: ElectorCommand) -> Result<u8, Failure> {
    match command {
        ElectorCommand::Pause(args) => {
            let board = ElectorBoard::new(&store, &args.name)?;
            let before = board.paused().await.ok().flatten();
            started(&store, &board, before.is_some()).await?;
            let (until, by) = super::schedule::pause_of(args.for_)?;
            let paused = board.pause(until, &by, args.reason.trim()).await?;
            let record = record("pause", &args.name, &args.reason, &before, Some(&paused));
            audit(args.audit_log.as_deref(), &record).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("paused, but the audit log could not be written: {e}"),
                )
            })?;
            match paused.until() {
                Some(until) => outln!(
                    "paused elector {} until {}",
                    args.name,
                    until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                ),
                None => outln!("paused elector {} until resumed", args.name),
            }
            Ok(0)
        }
        ElectorCommand::Resume(args) => {
            let board = ElectorBoard::new(&store, &args.name)?;
            let before = board.paused().await.ok().flatten();
            started(&store, &board, before.is_some()).await?;
            let was = board.resume().await?;
            let record = record("resume", &args.name, &args.reason, &before, None);
            audit(args.audit_log.as_deref(), &record).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("resumed, but the audit log could not be written: {e}"),
                )
            })?;
            if was {
                outln!("resumed elector {}", args.name);
            } else {
                outln!("elector {} was not paused", args.name);
            }
            Ok(0)
        }
        ElectorCommand::Status(args) => {
            let board = ElectorBoard::new(&store, &args.name)?;
            let paused = board.paused().await?;
            started(&store, &board, paused.is_some()).await?;
            let name = Name::new(&args.name)?;
            let leader = tenure::leader(store.as_ref(), &name).await?;
            let since = |t: Option<std::time::SystemTime>| {
                t.map(chrono::DateTime::<chrono::Utc>::from)
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            };
            if args.json {
                let json = serde_json::json!({
                    "name": args.name,
                    "leader": leader.as_ref().map(|l| serde_json::json!({
                        "token": l.token,
                        "value": l.value_str(),
                        "label": l.label,
                        "session": l.session_tag,
                        "since": since(l.since),
                    })),
                    "paused": paused.as_ref().map(super::schedule::paused_json),
                });
                outln!("{json}");
                return Ok(0);
            }
            match &leader {
                Some(l) => outln!(
                    "{}: led by {} (token {}, label {}{})",
                    escape_line(&args.name),
                    escape_line(&l.value_str()),
                    l.token,
                    escape_line(&l.label),
                    since(l.since)
                        .map(|s| format!(", since {s}"))
                        .unwrap_or_default()
                ),
                None => outln!("{}: nobody leads", escape_line(&args.name)),
            }
            if let Some(p) = &paused {
                outln!(
                    "  paused by {} until {}: {}",
                    escape_line(&p.by),
                    p.until()
                        .map(|u| u.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                        .unwrap_or_else(|| "resumed".into()),
                    escape_line(&p.reason)
                );
            }
            Ok(0)
        }
    }
}

/// An audit record of a pause or resume, as `tenure schedule` writes them.
fn record(
    action: &str,
    name: &str,
    reason: &str,
    before: &Option<tenure::Paused>,
    after: Option<&tenure::Paused>,
) -> serde_json::Value {
    let mut record = super::schedule::record(action, name, reason, before, after);
    record["from"] = format!("tenure elector on {}", tenure::default_label()).into();
    record["target"] = format!("elector {name}").into();
    record
}
