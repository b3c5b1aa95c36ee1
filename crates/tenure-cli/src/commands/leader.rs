//! `tenure leader NAME [--watch]`: who leads an election.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use tenure::{Name, Store};

use crate::child;
use crate::exit::{self, Failure};
use crate::output::escape_line;

#[derive(Args, Debug)]
pub(crate) struct LeaderArgs {
    /// The election's name.
    name: String,
    /// Print one line per change until interrupted.
    #[arg(long)]
    watch: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn unix_ms(t: Option<SystemTime>) -> Option<u128> {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis())
}

fn leader_line(name: &Name, leader: &Option<tenure::Leader>, json: bool) -> String {
    match (leader, json) {
        (Some(l), true) => serde_json::json!({
            "name": name.as_str(),
            "token": l.token,
            "value": l.value_str(),
            "label": l.label,
            "since_ms": unix_ms(l.since),
        })
        .to_string(),
        (None, true) => serde_json::json!({ "name": name.as_str(), "token": null }).to_string(),
        (Some(l), false) => format!(
            "{} token={} label={}",
            escape_line(&l.value_str()),
            l.token,
            escape_line(&l.label)
        ),
        (None, false) => "none".to_string(),
    }
}

pub(super) async fn run(store: Arc<dyn Store>, args: LeaderArgs) -> Result<u8, Failure> {
    let name = Name::new(&args.name)?;
    if !args.watch {
        let leader = tenure::leader(store.as_ref(), &name).await?;
        outln!("{}", leader_line(&name, &leader, args.json));
        return Ok(if leader.is_some() { 0 } else { exit::NO_LEADER });
    }
    let mut observer = tenure::Observer::new(store, name.clone());
    let hub = child::SignalHub::start(true)?;
    loop {
        tokio::select! {
            next = observer.next() => {
                let leader = next?;
                outln!("{}", leader_line(&name, &leader, args.json));
            }
            _ = hub.stopped() => return Ok(0),
        }
    }
}
