//! Operators' audit records (`tenure release --force`, the console's
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

/// Who runs this command: `$USER`, else `$LOGNAME`, else the name of the
/// process's user id (cron and containers often set neither), else
/// `uid N`.
pub(crate) fn operator() -> String {
    let from_env = ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.trim().is_empty());
    from_env.or_else(user_of_uid).unwrap_or_else(|| {
        // SAFETY: getuid has no preconditions and cannot fail.
        format!("uid {}", unsafe { libc::getuid() })
    })
}

/// The user name of the process's uid, from the password database.
fn user_of_uid() -> Option<String> {
    // SAFETY: getpwuid_r writes into `pwd` and `buf`, both ours and alive
    // for the call; `result` is null or points at `pwd`, whose `pw_name`
    // points into `buf`, read before `buf` is dropped.
    unsafe {
        let uid = libc::getuid();
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result);
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(pwd.pw_name)
            .to_string_lossy()
            .into_owned();
        (!name.is_empty()).then_some(name)
    }
}

/// Records an operator's action: to the log always (a pause or a resume
/// at INFO, routine; a forced release at WARN), and as one JSON line
/// appended to `path` when given.
pub(crate) fn audit(
    path: Option<&std::path::Path>,
    record: &serde_json::Value,
) -> std::io::Result<()> {
    match record["action"].as_str() {
        Some("pause" | "resume") => {
            tracing::info!(target: "tenure::audit", record = %record, "operator action")
        }
        _ => tracing::warn!(target: "tenure::audit", record = %record, "forced action"),
    }
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
