//! `tenure shards NAME --shards N -- COMMAND`: be one member of a shard
//! group and run COMMAND once per shard this instance owns; `tenure shards
//! status NAME`: the members and the shard map.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use tenure::{Session, SessionOptions, Shard, ShardOwner, Shards, Store};

use super::lease::{check_ttl, check_ttl_on, kill_grace};
use crate::child::{self, SignalHub};
use crate::cli::{parse_duration, LeaseArgs, MetricsArg};
use crate::exit::{self, Failure};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct ShardsArgs {
    #[command(subcommand)]
    command: Option<ShardsCommand>,
    /// The group's name.
    #[arg(required = true)]
    name: Option<String>,
    /// How many shards the group has (1 to 65536): the same on every member.
    #[arg(long, required = true)]
    shards: Option<u32>,
    /// This member's weight: members own shards in proportion; 0 owns none.
    #[arg(long, default_value_t = 1)]
    weight: u32,
    /// This member's value in the group's list (default: host:pid).
    #[arg(long)]
    value: Option<String>,
    #[command(flatten)]
    lease: LeaseArgs,
    /// When a shard is revoked (or tenure is stopped): time between SIGTERM
    /// to its run's process group and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    grace: Duration,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
    /// The command to run for each shard owned.
    #[arg(last = true, required = true)]
    run: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum ShardsCommand {
    /// Show a group's members and its shard map.
    Status {
        /// The group's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl ShardsArgs {
    /// Whether this runs members (rather than showing a status).
    pub(super) fn runs(&self) -> bool {
        self.command.is_none()
    }
}

/// A run whose command ended on its own while its shard is still owned is
/// started again this much later.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// The library releases a revoked shard by itself only this long after the
/// run's grace: the runner releases it as soon as nothing of the run is
/// left, which the supervisor makes sure of by the grace.
const RELEASE_BACKSTOP: Duration = Duration::from_secs(30);

pub(super) fn validate(args: &ShardsArgs) -> Result<(), Failure> {
    if !args.runs() {
        return Ok(());
    }
    check_ttl(args.lease.ttl)?;
    kill_grace(&args.lease)?;
    match args.shards {
        Some(n) if (1..=tenure::MAX_SHARDS).contains(&n) => {}
        n => {
            return Err(Failure::new(
                exit::USAGE,
                format!(
                    "--shards {}: a group has 1 to {} shards",
                    n.unwrap_or(0),
                    tenure::MAX_SHARDS
                ),
            ))
        }
    }
    child::check_command(&args.run)
}

/// Prints one line of what the runner does, with the time: the log a user
/// reads to see which shard ran where and when.
fn say(message: std::fmt::Arguments<'_>) {
    eprintln!(
        "{} tenure: {message}",
        humantime::format_rfc3339_millis(std::time::SystemTime::now())
    );
}

pub(super) async fn run(
    store: Arc<dyn Store>,
    args: ShardsArgs,
    runner: super::Runner,
) -> Result<u8, Failure> {
    check_ttl_on(&store, args.lease.ttl)?;
    let kill_grace = kill_grace(&args.lease)?;
    let name = args.name.clone().unwrap_or_default();
    let shards = args.shards.unwrap_or(1);
    let value = args.value.clone().unwrap_or_else(tenure::default_label);
    let hub = Arc::new(runner.hub);
    let mut retry = runner.retry;
    let setup = Arc::new(Setup {
        name: name.clone(),
        shards,
        command: args.run.clone(),
        grace: args.grace,
        kill_grace,
    });
    loop {
        // Joined once per session: a member whose session is lost joins
        // again, with a new session, once its runs are gone.
        let joined = tokio::select! {
            joined = join(&store, &args, &name, shards, &value) => joined,
            signal = hub.stopped() => return Ok(128u8.saturating_add(signal as u8)),
        };
        let (session, owner) = match joined {
            Ok(joined) => joined,
            Err(e) if retry.may(&e) => match retry.pause(&e, &hub).await {
                Ok(()) => continue,
                Err(code) => return Ok(code),
            },
            Err(e) => return Err(e.into()),
        };
        say(format_args!(
            "shards {name}: joined as member {} ({} shards, weight {})",
            owner.member_id(),
            shards,
            args.weight
        ));
        match member(owner, &session, &setup, &hub).await {
            Ended::Stopped => {
                let _ = tokio::time::timeout(Duration::from_secs(1), session.close()).await;
                say(format_args!("shards {name}: left the group"));
                return Ok(0);
            }
            Ended::Lost(why) => {
                say(format_args!(
                    "shards {name}: {why}; every run was stopped; joining again"
                ));
                let _ = tokio::time::timeout(Duration::from_secs(1), session.close()).await;
            }
        }
    }
}

async fn join(
    store: &Arc<dyn Store>,
    args: &ShardsArgs,
    name: &str,
    shards: u32,
    value: &str,
) -> tenure::Result<(Session, ShardOwner)> {
    let session = Session::with_options(store, SessionOptions::new().ttl(args.lease.ttl)).await?;
    let joined = Shards::new(&session, name, shards)?
        .weight(args.weight)
        .value(value)
        .grace(args.grace + args.lease.kill_grace.unwrap_or(args.lease.ttl / 6) + RELEASE_BACKSTOP)
        .join()
        .await;
    match joined {
        Ok(owner) => Ok((session, owner)),
        Err(e) => {
            let _ = tokio::time::timeout(Duration::from_secs(1), session.close()).await;
            Err(e)
        }
    }
}

/// What every shard's run shares.
struct Setup {
    name: String,
    shards: u32,
    command: Vec<String>,
    grace: Duration,
    kill_grace: Duration,
}

enum Ended {
    /// Stopped by a signal to tenure: every run ended, the member left.
    Stopped,
    /// The session was lost: every run ended.
    Lost(String),
}

/// One member's life: a run per shard granted, until a signal or the
/// session's loss; returns once no run is left.
async fn member(
    mut owner: ShardOwner,
    session: &Session,
    setup: &Arc<Setup>,
    hub: &Arc<SignalHub>,
) -> Ended {
    let mut runs = tokio::task::JoinSet::new();
    let ended = loop {
        tokio::select! {
            shard = owner.next() => match shard {
                Ok(shard) => {
                    runs.spawn(run_shard(shard, session.clone(), setup.clone(), hub.clone()));
                }
                Err(e) => break Ended::Lost(e.to_string()),
            },
            _ = hub.stopped() => break Ended::Stopped,
            Some(_) = runs.join_next(), if !runs.is_empty() => {}
        }
    };
    if let Ended::Stopped = ended {
        // Each run got the signal through its supervisor (TERM, the grace,
        // KILL); the leave releases each shard as its run is gone.
        let (left, ()) = tokio::join!(owner.leave(), async {
            while runs.join_next().await.is_some() {}
        });
        if let Err(e) = left {
            tracing::warn!(error = %e, "leaving the group");
        }
    } else {
        while runs.join_next().await.is_some() {}
        drop(owner);
    }
    ended
}

/// Runs the command for one shard while it is owned: started again after
/// [`RESTART_DELAY`] when it ends on its own, stopped (TERM, the grace,
/// KILL) when the shard is revoked or tenure is stopped, and by the lease's
/// local deadline whatever happens to tenure. The shard is given back once
/// nothing of the run is left.
async fn run_shard(shard: Shard, session: Session, setup: Arc<Setup>, hub: Arc<SignalHub>) {
    let (name, index, token) = (&setup.name, shard.index(), shard.token());
    let env = [
        ("TENURE_GROUP", setup.name.clone()),
        ("TENURE_SHARD", index.to_string()),
        ("TENURE_SHARDS", setup.shards.to_string()),
        ("TENURE_FENCE", token.to_string()),
    ];
    let run = child::Run {
        command: &setup.command,
        env: &env,
        lease_grace: setup.kill_grace,
        stop_grace: setup.grace,
    };
    say(format_args!(
        "shards {name}: shard {index} granted (token {token}): running the command"
    ));
    loop {
        let lost = {
            let lost = session.lost();
            async move { format!("the session was lost: {}", lost.await) }
        };
        let revoked = {
            let revoked = shard.revoked();
            async move {
                revoked.await;
                format!("shard {index} revoked")
            }
        };
        let outcome = child::supervise(&run, &session, lost, revoked, &hub).await;
        let again = match outcome {
            Ok(child::Outcome::Exited(code)) => {
                say(format_args!(
                    "shards {name}: shard {index}: the command exited with {code}"
                ));
                true
            }
            Ok(child::Outcome::Stopped { why, code }) => {
                say(format_args!(
                    "shards {name}: shard {index}: the run was stopped ({why}), exit {code}"
                ));
                false
            }
            Ok(child::Outcome::LeaseLost(why)) => {
                say(format_args!(
                    "shards {name}: shard {index}: lease lost ({why}): the run was stopped"
                ));
                false
            }
            Err(f) => {
                say(format_args!(
                    "shards {name}: shard {index}: the command could not run: {}",
                    f.message
                ));
                true
            }
        };
        if !again || shard.is_revoked() || hub.stop_requested().is_some() {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(RESTART_DELAY) => {}
            _ = shard.revoked() => break,
            _ = hub.stopped() => break,
        }
    }
    if session.is_lost() {
        say(format_args!(
            "shards {name}: shard {index} lost with the session"
        ));
    } else {
        say(format_args!("shards {name}: shard {index} released"));
    }
    shard.release();
}

/// `tenure shards status NAME [--json]`.
pub(super) async fn status(store: Arc<dyn Store>, args: ShardsArgs) -> Result<u8, Failure> {
    let Some(ShardsCommand::Status { name, json }) = args.command else {
        return Err(Failure::new(exit::SOFTWARE, "no status asked for"));
    };
    let view = tenure::Group::new(&store, &name)?.shard_view().await?;
    if json {
        outln!("{}", view_json(&name, &view));
        return Ok(0);
    }
    outln!(
        "group {name}: {} member(s), {} shard(s)",
        view.members.len(),
        view.shards
    );
    for m in &view.members {
        let owned = view
            .shard_map
            .iter()
            .filter(|s| s.owner == Some(m.id))
            .count();
        outln!(
            "  member {} {} weight {} owns {owned} value {}",
            m.id,
            crate::output::escape_line(&m.label),
            m.weight,
            crate::output::escape_line(&String::from_utf8_lossy(&m.value))
        );
    }
    for s in &view.shard_map {
        let owner = s.owner.map_or("-".to_string(), |o| o.to_string());
        outln!(
            "  shard {} owner {owner} token {} {}",
            s.index,
            s.token.map_or("-".to_string(), |t| t.to_string()),
            if s.moving { "moving" } else { "settled" }
        );
    }
    Ok(0)
}

fn unix_ms(at: Option<std::time::SystemTime>) -> serde_json::Value {
    at.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(serde_json::Value::Null, |d| {
            serde_json::Value::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
}

/// The view as `tenure shards status --json` prints it.
fn view_json(name: &str, view: &tenure::ShardView) -> serde_json::Value {
    let members: Vec<serde_json::Value> = view
        .members
        .iter()
        .map(|m| {
            serde_json::json!({
                "id": m.id,
                "label": m.label,
                "session": m.session_tag,
                "value": String::from_utf8_lossy(&m.value),
                "weight": m.weight,
                "since_ms": unix_ms(m.since),
                "lapsed": m.lapsed,
                "owns": view.shard_map.iter().filter(|s| s.owner == Some(m.id)).count(),
            })
        })
        .collect();
    let shards: Vec<serde_json::Value> = view
        .shard_map
        .iter()
        .map(|s| {
            serde_json::json!({
                "index": s.index,
                "owner": s.owner,
                "holder": s.holder_label,
                "token": s.token,
                "since_ms": unix_ms(s.since),
                "assigned": s.assigned,
                "waiting": s.waiting,
                "moving": s.moving,
            })
        })
        .collect();
    serde_json::json!({
        "group": name,
        "shards": view.shards,
        "members": members,
        "shard_map": shards,
    })
}
