//! `tenure elect NAME [-- COMMAND]`: campaign for leadership; hold it, or
//! run a command while leader.

use std::sync::Arc;

use clap::Args;
use tenure::{Election, Store};

use super::lease::{bounded_close, check_ttl, finish, kill_grace, open};
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
    let super::Runner { hub, mut retry } = runner;
    let (session, term) = loop {
        let opened = tokio::select! {
            opened = open(&store, &args.lease) => opened,
            signal = hub.stopped() => return Ok(128 + signal as u8),
        };
        let session = match opened {
            Ok(session) => session,
            Err(e) if retry.may(&e) => match retry.pause(&e, &hub).await {
                Ok(()) => continue,
                Err(code) => return Ok(code),
            },
            Err(e) => return Err(e.into()),
        };
        let election = Election::new(&session, &args.name)?;
        let term = tokio::select! {
            term = election.campaign(value.clone()) => term,
            signal = hub.stopped() => {
                let _ = session.close().await;
                return Ok(128 + signal as u8);
            }
        };
        match term {
            Ok(term) => break (session, term),
            Err(e) if retry.may(&e) => {
                let _ = bounded_close(&session).await;
                if let Err(code) = retry.pause(&e, &hub).await {
                    return Ok(code);
                }
            }
            Err(e) => {
                let _ = bounded_close(&session).await;
                return Err(e.into());
            }
        }
    };
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
    let lost = async { term.lost().await.to_string() };
    let outcome = match child::supervise(&run, &session, lost, std::future::pending(), &hub).await {
        Ok(outcome) => outcome,
        Err(f) => {
            let _ = term.resign().await;
            let _ = bounded_close(&session).await;
            return Err(f);
        }
    };
    finish(outcome, term.resign(), &session).await
}
