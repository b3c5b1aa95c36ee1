//! `tenure status [PREFIX]`: names with their holders and waiters, in
//! queue order (its JSON is also the console's `/api/status`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tenure::store::{Entry, EntryKind};
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

/// What a name is, as status and the console show it. The store keeps an
/// entry's mode (exclusive, shared, permits), not the recipe that made it:
/// the rest comes from what tenure's recipes leave in the store. A name an
/// elector or a leader-mode schedule campaigns on is listed in their
/// registries; a per-tick schedule claims `JOB@UNIX_SECONDS`; an election
/// started by other means (a library `Election`, or a build from before
/// the registries) is known by its leader's value.
pub(crate) struct Recipes {
    electors: HashSet<String>,
    jobs: HashSet<String>,
}

impl Recipes {
    /// The registries, read once per listing; a store without cells (or
    /// one that fails to answer here) lists none, and kinds come from the
    /// entries alone.
    pub(crate) async fn read(store: &Arc<dyn Store>) -> Recipes {
        let electors = tenure::ElectorBoard::electors(store)
            .await
            .unwrap_or_default();
        let jobs = tenure::ScheduleBoard::jobs(store).await.unwrap_or_default();
        Recipes {
            electors: electors.into_iter().collect(),
            jobs: jobs.into_iter().collect(),
        }
    }

    /// "lock", "read/write lock", "semaphore", "election", "tick claim",
    /// "non-fair waiters" (a lock's wake-up line), "group" (its members) or
    /// "shard" (one shard of a group).
    pub(crate) fn kind(&self, name: &str, entries: &[Entry]) -> &'static str {
        if name.starts_with(tenure::queue::WAKE_LINE_PREFIX) {
            return "non-fair waiters";
        }
        if name.starts_with(tenure::GROUP_PREFIX) {
            return "group";
        }
        if name.starts_with(tenure::SHARD_PREFIX) {
            return "shard";
        }
        let claim_of = name
            .rsplit_once('@')
            .filter(|(_, at)| !at.is_empty() && at.bytes().all(|b| b.is_ascii_digit()))
            .map(|(job, _)| job);
        if claim_of.is_some_and(|job| self.jobs.contains(job)) {
            "tick claim"
        } else if self.electors.contains(name) || self.jobs.contains(name) {
            "election"
        } else if entries.iter().any(|e| e.kind == EntryKind::Shared) {
            "read/write lock"
        } else if entries
            .iter()
            .any(|e| matches!(e.kind, EntryKind::Permits { .. }))
        {
            "semaphore"
        } else if entries.iter().any(|e| e.granted && !e.value.is_empty()) {
            "election"
        } else {
            "lock"
        }
    }
}

/// An entry's mode in words: "exclusive", "shared", "1 of 3 permits".
fn mode(kind: EntryKind) -> String {
    match kind {
        EntryKind::Exclusive => "exclusive".into(),
        EntryKind::Shared => "shared".into(),
        EntryKind::Permits { count, limit } => format!("{count} of {limit} permits"),
    }
}

/// `tenure status --json`'s answer (also the console's `/api/status`):
/// each name with its kind and its entries in queue order. An entry's
/// `kind` is its mode as the store keeps it (`Exclusive`, `Shared`,
/// `Permits(N)`), kept as it was for scripts that read it.
pub(crate) async fn status_json(
    store: &Arc<dyn Store>,
    prefix: &str,
) -> tenure::Result<serde_json::Value> {
    // Where the store does not tell how long a session has left
    // (`expiry_times` is false), the time left is null, not zero.
    let told = store.capabilities().expiry_times;
    let recipes = Recipes::read(store).await;
    let mut all = Vec::new();
    for name in store.names(prefix).await? {
        let queue = store.queue(&name).await?;
        let kind = recipes.kind(name.as_str(), &queue.entries);
        let entries: Vec<_> = queue
            .entries
            .iter()
            .map(|e| {
                let member = member_of(kind, e);
                let mut entry = serde_json::json!({
                    "token": e.seq,
                    "state": if e.granted { "holder" } else { "waiter" },
                    "kind": format!("{:?}", e.kind),
                    "mode": mode(e.kind),
                    "label": e.label,
                    "session": e.session_tag,
                    "holds": e.holds,
                    "ttl_left_ms": told.then_some(e.expires_in.as_millis()),
                    "value": String::from_utf8_lossy(
                        member.as_ref().map_or(&e.value[..], |m| &m.value[..])
                    ),
                });
                if let Some(m) = &member {
                    entry["weight"] = m.weight.into();
                    entry["shards"] = m.shards.into();
                }
                entry
            })
            .collect();
        all.push(serde_json::json!({
            "name": name.as_str(),
            "kind": kind,
            "entries": entries,
        }));
    }
    Ok(serde_json::Value::Array(all))
}

/// A group member's entry read as the member (its own value, weight and
/// shard count), rather than as the store keeps it.
fn member_of(kind: &str, entry: &Entry) -> Option<tenure::Member> {
    (kind == "group")
        .then(|| tenure::Member::from_entry(entry, false))
        .flatten()
}

/// What an entry is called in a name of `kind`: an election's leader and
/// candidates, a claimed tick, a lock's holders and waiters.
fn role(kind: &str, granted: bool) -> &'static str {
    match (kind, granted) {
        ("election", true) => "leader",
        ("election", false) => "candidate",
        ("tick claim", _) => "claimed",
        // The first of a lock's non-fair waiters watches the lock.
        ("non-fair waiters", true) => "watching",
        ("non-fair waiters", false) => "waiting",
        (_, true) => "holder",
        (_, false) => "waiter",
    }
}

pub(super) async fn run(store: Arc<dyn Store>, args: StatusArgs) -> Result<u8, Failure> {
    if args.json {
        outln!("{}", status_json(&store, &args.prefix).await?);
        return Ok(0);
    }
    let told = store.capabilities().expiry_times;
    let recipes = Recipes::read(&store).await;
    for name in store.names(&args.prefix).await? {
        let queue = store.queue(&name).await?;
        let kind = recipes.kind(name.as_str(), &queue.entries);
        outln!("{name}  ({kind})");
        for e in &queue.entries {
            // The mode says something only where it can differ.
            let mode = match kind {
                "read/write lock" | "semaphore" => format!(" {}", mode(e.kind)),
                _ => String::new(),
            };
            // A group's member: its own value, after its weight and count.
            let member = member_of(kind, e);
            let (shown, member_fields) = match &member {
                Some(m) => (
                    &m.value[..],
                    format!(" weight={} shards={}", m.weight, m.shards),
                ),
                None => (&e.value[..], String::new()),
            };
            let value = if shown.is_empty() || kind == "tick claim" {
                String::new()
            } else {
                format!(" value={}", escape_line(&String::from_utf8_lossy(shown)))
            };
            outln!(
                "  {:<9} token={}{mode}{member_fields} label={} session={} ttl_left={}{value}",
                role(kind, e.granted),
                e.seq,
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
    // Each schedule's last outcome, and a run in progress (`tenure
    // schedule list` for more); a store without cells lists none.
    if let Ok(schedules) = super::schedule::schedules_json(&store, &args.prefix).await {
        let schedules = schedules.as_array().cloned().unwrap_or_default();
        if !schedules.is_empty() {
            outln!("schedules:");
        }
        for s in schedules {
            let job = escape_line(s["job"].as_str().unwrap_or_default());
            let last = &s["last_run"];
            let last = if last.is_null() {
                "never ran".to_string()
            } else {
                format!(
                    "last run {} ({})",
                    last["result"].as_str().unwrap_or_default(),
                    escape_line(last["outcome"].as_str().unwrap_or_default())
                )
            };
            let running = s["running"]["tick"]
                .as_str()
                .map(|tick| format!(", running tick {tick}"))
                .unwrap_or_default();
            let paused = if s["paused"].is_null() {
                ""
            } else {
                ", PAUSED"
            };
            outln!("  {job}: {last}{running}{paused}");
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
