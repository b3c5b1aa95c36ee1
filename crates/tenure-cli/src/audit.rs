//! Forced actions' audit records (`tenure release --force`, the console's
//! actions, `tenure schedule pause|resume`) and the session tags they name.

use tenure::Store;

/// A queue as an audit record keeps it: each entry's token, state, session
/// and label (the console's actions and `release --force` alike).
pub(crate) fn entries_brief(q: &tenure::store::Queue) -> serde_json::Value {
    q.entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "token": e.seq,
                "state": if e.granted { "holder" } else { "waiter" },
                "session": e.session_tag,
                "label": e.label,
            })
        })
        .collect()
}

/// Records a forced action: to the log always, and as one JSON line
/// appended to `path` when given.
pub(crate) fn audit(
    path: Option<&std::path::Path>,
    record: &serde_json::Value,
) -> std::io::Result<()> {
    tracing::warn!(target: "tenure::audit", record = %record, "forced action");
    let Some(path) = path else {
        return Ok(());
    };
    use std::io::Write;
    let mut line = record.to_string();
    line.push('\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(line.as_bytes())
}

/// The entries of the session `tag`, on every name, as an audit record
/// keeps them (best effort: a name that cannot be read is left out).
pub(crate) async fn session_entries(store: &dyn Store, tag: &str) -> serde_json::Value {
    let mut found = Vec::new();
    for name in store.names("").await.unwrap_or_default() {
        let Ok(q) = store.queue(&name).await else {
            continue;
        };
        for e in q.entries.iter().filter(|e| e.session_tag == tag) {
            found.push(serde_json::json!({
                "name": name.as_str(),
                "token": e.seq,
                "state": if e.granted { "holder" } else { "waiter" },
                "label": e.label,
            }));
        }
    }
    serde_json::Value::Array(found)
}

/// Checks a session tag typed by a user (any text is safe to pass on; this
/// only says early that it cannot be one).
pub(crate) fn check_session_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() || tag.len() > 128 || tag.chars().any(char::is_control) {
        return Err(format!(
            "{:?} is not a session tag (1 to 128 characters, as `tenure status` shows it)",
            tag.escape_debug().take(40).collect::<String>()
        ));
    }
    Ok(())
}
