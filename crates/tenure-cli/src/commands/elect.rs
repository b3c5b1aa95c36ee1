//! `tenure elect NAME [-- COMMAND]`: campaign for leadership; hold it, or
//! run a command while leader.

use std::sync::Arc;

use clap::Args;
use tenure::{Election, Store};

use super::lease::{check_ttl, kill_grace, open_and_take, run_held};
use crate::child;
use crate::cli::{LeaseArgs, MetricsArg};
use crate::exit::{self, Failure};

#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    /// The election's name.
    name: String,
    /// The value to lead with (default: host:pid).
    #[arg(long)]
    value: Option<String>,
    #[command(flatten)]
    lease: LeaseArgs,
    #[command(flatten)]
    pub(super) metrics: MetricsArg,
    /// A command to run only while leader.
    #[arg(last = true, num_args = 0..)]
    command: Vec<String>,
}

/// Checks the TTL and the command, if any, before the store is opened.
pub(super) fn validate(args: &ElectArgs) -> Result<(), Failure> {
    check_ttl(args.lease.ttl)?;
    if args.command.is_empty() {
        Ok(())
    } else {
        child::check_command(&args.command)
    }
}

pub(super) async fn run(
    store: Arc<dyn Store>,
    args: ElectArgs,
    runner: super::Runner,
) -> Result<u8, Failure> {
    let grace = kill_grace(&args.lease)?;
    let value = args.value.clone().unwrap_or_else(tenure::default_label);
    // A campaign waits for ever: a store briefly unavailable is tried again.
    let mut runner = runner;
    let taken = open_and_take(&store, &args.lease, &mut runner, |session, _| {
        let (name, value) = (&args.name, value.clone());
        async move { Election::new(&session, name)?.campaign(value).await }
    })
    .await?;
    let (session, term) = match taken {
        Ok(taken) => taken,
        Err(code) => return Ok(code),
    };
    let hub = runner.hub;
    tracing::info!(name = %args.name, token = term.token(), "elected");
    if args.command.is_empty() {
        outln!("elected {}", term.token());
        let lost = term.lost();
        tokio::select! {
            reason = lost => {
                return Err(Failure::new(exit::LEASE_LOST, format!("leadership lost: {reason}")));
            }
            _ = hub.stopped() => {}
        }
        let _ = term.resign().await;
        let _ = session.close().await;
        return Ok(0);
    }
    let env = [
        ("TENURE_ELECTION", args.name.clone()),
        ("TENURE_FENCE", term.token().to_string()),
        ("TENURE_LEADER_VALUE", value),
    ];
    let run = child::Run {
        command: &args.command,
        env: &env,
        lease_grace: grace,
        stop_grace: grace,
    };
    let lost = term.lost();
    run_held(&run, &session, lost, &hub, move || term.resign()).await
}
