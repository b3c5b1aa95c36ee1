//! `tenure release NAME --force` or `--session TAG --force`: evict the
//! holders of a name, or end one session, with an audit record.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use clap::Args;
use tenure::{Name, Store};

use crate::audit::{audit, check_session_tag, entries_brief, session_entries};
use crate::exit::{self, Failure};

#[derive(Args, Debug)]
pub(crate) struct ReleaseArgs {
    /// The name to release.
    #[arg(required_unless_present = "session", conflicts_with = "session")]
    name: Option<String>,
    /// End this one session instead: everything it holds or waits for, on
    /// every name (its tag, as `tenure status` shows it).
    #[arg(long, value_name = "TAG")]
    session: Option<String>,
    /// Required: confirms you know this is unsafe without fencing.
    #[arg(long)]
    force: bool,
    /// Why (kept in the audit record).
    #[arg(long, default_value = "")]
    reason: String,
    /// Append the audit record (JSON, one line) to this file too; it always
    /// goes to the log (stderr at -v).
    #[arg(long, env = "TENURE_AUDIT_LOG")]
    audit_log: Option<PathBuf>,
}

/// Checks the session tag or the name before the store is opened.
pub(super) fn validate(args: &ReleaseArgs) -> Result<(), Failure> {
    match args {
        ReleaseArgs {
            session: Some(tag), ..
        } => check_session_tag(tag).map_err(|m| Failure::new(exit::USAGE, m)),
        ReleaseArgs {
            name: Some(name), ..
        } => Name::new(name).map(|_| ()).map_err(Into::into),
        _ => Ok(()),
    }
}

pub(super) async fn run(store: Arc<dyn Store>, args: ReleaseArgs) -> Result<u8, Failure> {
    if !args.force {
        return Err(Failure::new(
            exit::USAGE,
            "release evicts another process's lease: pass --force if you mean it (see --help)",
        ));
    }
    if let Some(tag) = &args.session {
        check_session_tag(tag).map_err(|m| Failure::new(exit::USAGE, m))?;
        let before = session_entries(store.as_ref(), tag).await;
        let ended = store.evict_session(tag).await;
        let after = session_entries(store.as_ref(), tag).await;
        // A failure may have ended the session all the same (on some nodes
        // of a store of several, say): it is audited too.
        let error = ended.as_ref().err().map(ToString::to_string);
        let record = serde_json::json!({
            "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            "who": crate::audit::operator(),
            "from": format!("tenure release on {}", tenure::default_label()),
            "action": "end-session",
            "target": tag,
            "reason": args.reason,
            "ended": ended.as_ref().ok(),
            "error": error,
            "before": before,
            "after": after,
        });
        audit(args.audit_log.as_deref(), &record).map_err(|e| {
            Failure::new(
                exit::SOFTWARE,
                format!("done, but the audit log could not be written: {e}"),
            )
        })?;
        if ended? {
            outln!("ended session {tag}");
            return Ok(0);
        }
        return Err(Failure::new(
            exit::NO_LEADER,
            format!("no live session has the tag {tag}"),
        ));
    }
    let Some(name) = &args.name else {
        return Err(Failure::new(exit::USAGE, "give a NAME or --session TAG"));
    };
    let name = Name::new(name)?;
    // The record's "before" is best effort: the release does not wait on it.
    let before = store.queue(&name).await.unwrap_or_default();
    let evicted = store.evict(&name).await?;
    let after = store.queue(&name).await.unwrap_or_default();
    let record = serde_json::json!({
        "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        "who": crate::audit::operator(),
        "from": format!("tenure release on {}", tenure::default_label()),
        "action": "release",
        "target": name.as_str(),
        "reason": args.reason,
        "evicted_sessions": evicted,
        "before": entries_brief(&before),
        "after": entries_brief(&after),
    });
    audit(args.audit_log.as_deref(), &record).map_err(|e| {
        Failure::new(
            exit::SOFTWARE,
            format!("released, but the audit log could not be written: {e}"),
        )
    })?;
    outln!("evicted {evicted} session(s) holding {name}");
    Ok(0)
}
