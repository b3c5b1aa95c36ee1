//! `tenure status [PREFIX]`: names with their holders and waiters, in
//! queue order (its JSON is also the console's `/api/status`).

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tenure::Store;

use crate::exit::Failure;
use crate::output::escape_line;

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// Only names that start with this.
    #[arg(default_value = "")]
    prefix: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `tenure status --json`'s answer (also the console's `/api/status`).
pub(crate) async fn status_json(
    store: &dyn Store,
    prefix: &str,
) -> tenure::Result<serde_json::Value> {
    // Where the store does not tell (ZooKeeper), the time left is null,
    // not zero.
    let told = store.capabilities().expiry_times;
    let mut all = Vec::new();
    for name in store.names(prefix).await? {
        let queue = store.queue(&name).await?;
        let entries: Vec<_> = queue
            .entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "token": e.seq,
                    "state": if e.granted { "holder" } else { "waiter" },
                    "kind": format!("{:?}", e.kind),
                    "label": e.label,
                    "session": e.session_tag,
                    "holds": e.holds,
                    "ttl_left_ms": told.then(|| e.expires_in.as_millis()),
                    "value": String::from_utf8_lossy(&e.value),
                })
            })
            .collect();
        all.push(serde_json::json!({ "name": name.as_str(), "entries": entries }));
    }
    Ok(serde_json::Value::Array(all))
}

pub(super) async fn run(store: Arc<dyn Store>, args: StatusArgs) -> Result<u8, Failure> {
    if args.json {
        outln!("{}", status_json(store.as_ref(), &args.prefix).await?);
        return Ok(0);
    }
    let told = store.capabilities().expiry_times;
    for name in store.names(&args.prefix).await? {
        let queue = store.queue(&name).await?;
        outln!("{name}");
        for e in &queue.entries {
            outln!(
                "  {:<6} token={} {:?} label={} session={} ttl_left={}",
                if e.granted { "holder" } else { "waiter" },
                e.seq,
                e.kind,
                escape_line(&e.label),
                e.session_tag,
                if told {
                    humantime::format_duration(Duration::from_millis(
                        e.expires_in.as_millis() as u64
                    ))
                    .to_string()
                } else {
                    "unknown".to_string()
                },
            );
        }
    }
    // Which builds use the store (`tenure upgrade status` for more); a
    // store of your own that lists none says nothing here.
    match super::upgrade::builds_lines(&store).await {
        Ok(lines) if !lines.is_empty() => {
            outln!("builds in use:");
            for line in lines {
                outln!("  {}", escape_line(&line));
            }
        }
        _ => {}
    }
    Ok(0)
}
