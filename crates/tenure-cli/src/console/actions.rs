//! `POST /api/release` and `/api/action`: whether an admin action may be
//! done (token, origin, host, CSRF header, the target typed again, a
//! reason), doing it, and its audit record.

use super::*;

#[derive(serde::Deserialize)]
struct ActionRequest {
    /// What the action is on: a name (release, step-down), a session's tag
    /// (end-session) or a job (pause, resume).
    name: String,
    /// The target typed again.
    confirm: String,
    /// Why (kept in the audit log).
    reason: String,
    /// `release` (a lock's holders), `step-down` (an election's leader: the
    /// same act, named as the operator meant it), `end-session`, `pause` or
    /// `resume` (a schedule, on every instance).
    #[serde(default)]
    action: Option<String>,
    /// A pause's length, in seconds; none: until resumed.
    #[serde(default)]
    for_seconds: Option<u64>,
}

fn refuse(code: StatusCode, why: &str) -> Response {
    (code, Json(serde_json::json!({ "error": why }))).into_response()
}

/// Equal in time whatever the inputs (up to their lengths).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Console {
    /// Whether `headers` may act: why not, if not.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), (StatusCode, &'static str)> {
        let Some(token) = &self.token else {
            return Err((
                StatusCode::FORBIDDEN,
                "read-only console: start it with --admin-token-file to allow actions",
            ));
        };
        // The Host is one of ours (`check_host` runs on every route).
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if let Some(origin) = headers.get(header::ORIGIN) {
            if origin.to_str().ok() != Some(&format!("http://{host}")) {
                return Err((StatusCode::FORBIDDEN, "cross-origin request refused"));
            }
        }
        if headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) != Some("1") {
            return Err((StatusCode::FORBIDDEN, "missing the CSRF header"));
        }
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), token) {
            return Err((StatusCode::UNAUTHORIZED, "wrong or missing admin token"));
        }
        Ok(())
    }
}

/// Every route: a `Host` that names this console (by its address, as
/// localhost, or an --allow-host). A page of another site that rebinds its
/// DNS name to this address sends its own name, and is refused.
pub(super) async fn check_host(
    State(c): State<Arc<Console>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !c.hosts.iter().any(|h| h == host) {
        return refuse(
            StatusCode::FORBIDDEN,
            "Host does not name this console (see --allow-host)",
        );
    }
    next.run(request).await
}

pub(super) async fn act(
    State(c): State<Arc<Console>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    c.count("action");
    if let Err((code, why)) = c.authorize(&headers) {
        tracing::warn!(%peer, why, "console: an admin action was refused");
        return refuse(code, why);
    }
    let Ok(req) = serde_json::from_slice::<ActionRequest>(&body) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "expected JSON {name, confirm, reason, action}",
        );
    };
    if req.confirm != req.name {
        return refuse(StatusCode::BAD_REQUEST, "type the name again to confirm");
    }
    let reason = req.reason.trim();
    if reason.is_empty() || reason.len() > 1000 {
        return refuse(
            StatusCode::BAD_REQUEST,
            "give a reason (at most 1000 bytes)",
        );
    }
    let action = match req.action.as_deref() {
        None | Some("release") => "release",
        Some("step-down") => "step-down",
        Some("end-session") => "end-session",
        Some("pause") => "pause",
        Some("resume") => "resume",
        Some(_) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "action is release, step-down, end-session, pause or resume",
            )
        }
    };
    let done = match action {
        "release" | "step-down" => release(&c, &req.name).await,
        "end-session" => end_session(&c, &req.name).await,
        _ => pause_or_resume(&c, action, &req, peer).await,
    };
    let (result, before, after) = match done {
        Ok(done) => done,
        Err(Refusal {
            code,
            why,
            tried: None,
        }) => return refuse(code, &why),
        // It may have taken effect in part: audited, with the error.
        Err(Refusal {
            code,
            why,
            tried: Some((before, after)),
        }) => {
            let record = serde_json::json!({
                "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                "who": "console admin token",
                "from": peer.to_string(),
                "action": action,
                "target": req.name,
                "reason": reason,
                "store": c.store_url,
                "error": why,
                "before": before,
                "after": after,
            });
            if let Err(e) = crate::audit::audit(c.audit_log.as_deref(), &record) {
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("{why}; and the audit log could not be written: {e}"),
                );
            }
            return refuse(code, &why);
        }
    };
    let mut record = serde_json::json!({
        "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        "who": "console admin token",
        "from": peer.to_string(),
        "action": action,
        "target": req.name,
        "reason": reason,
        "store": c.store_url,
        "before": before,
        "after": after,
    });
    if let (Some(r), Some(fields)) = (record.as_object_mut(), result.as_object()) {
        r.extend(fields.clone());
    }
    if let Err(e) = crate::audit::audit(c.audit_log.as_deref(), &record) {
        // The act is done; say that its record is not.
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("done, but the audit log could not be written: {e}"),
        );
    }
    c.demand.notify_one();
    let mut answer = result;
    answer["audit"] = record;
    Json(answer).into_response()
}

/// What an action did, and the target's state before and after it.
type Done = (serde_json::Value, serde_json::Value, serde_json::Value);

/// Why an action was not done; with `tried`, it may have taken effect in
/// part, and the audit keeps (before, after).
struct Refusal {
    code: StatusCode,
    why: String,
    tried: Option<(serde_json::Value, serde_json::Value)>,
}

impl From<(StatusCode, String)> for Refusal {
    fn from((code, why): (StatusCode, String)) -> Self {
        Refusal {
            code,
            why,
            tried: None,
        }
    }
}

fn refusal_after_trying(
    e: tenure::Error,
    before: serde_json::Value,
    after: serde_json::Value,
) -> Refusal {
    Refusal {
        tried: Some((before, after)),
        ..unavailable(e)
    }
}

fn unavailable(e: tenure::Error) -> Refusal {
    let code = match e {
        tenure::Error::Unsupported { .. }
        | tenure::Error::InvalidName { .. }
        | tenure::Error::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, e.to_string()).into()
}

async fn release(c: &Console, name: &str) -> Result<Done, Refusal> {
    let name = Name::new(name).map_err(unavailable)?;
    let before = c.store.queue(&name).await.map_err(unavailable)?;
    let evicted = c.store.evict(&name).await.map_err(unavailable)?;
    let after = c.store.queue(&name).await.unwrap_or_default();
    Ok((
        serde_json::json!({ "evicted_sessions": evicted }),
        crate::audit::entries_brief(&before),
        crate::audit::entries_brief(&after),
    ))
}

async fn end_session(c: &Console, tag: &str) -> Result<Done, Refusal> {
    crate::audit::check_session_tag(tag)
        .map_err(|m| Refusal::from((StatusCode::BAD_REQUEST, m)))?;
    let before = crate::audit::session_entries(c.store.as_ref(), tag).await;
    let ended = match c.store.evict_session(tag).await {
        Ok(ended) => ended,
        // It may have ended the session all the same (on some nodes of a
        // store of several, say): what was tried is audited.
        Err(e) => {
            let after = crate::audit::session_entries(c.store.as_ref(), tag).await;
            return Err(refusal_after_trying(e, before, after));
        }
    };
    if !ended {
        return Err((
            StatusCode::NOT_FOUND,
            format!("no live session has the tag {tag}"),
        )
            .into());
    }
    let after = crate::audit::session_entries(c.store.as_ref(), tag).await;
    Ok((serde_json::json!({ "ended": ended }), before, after))
}

async fn pause_or_resume(
    c: &Console,
    action: &str,
    req: &ActionRequest,
    peer: SocketAddr,
) -> Result<Done, Refusal> {
    let board = tenure::ScheduleBoard::new(&c.store, &req.name).map_err(unavailable)?;
    // Best effort: an unreadable pause is replaced or lifted all the same.
    let before = board.paused().await.ok().flatten();
    crate::commands::schedule::started_job(&c.store, &board, before.is_some())
        .await
        .map_err(|e| Refusal::from((StatusCode::NOT_FOUND, e)))?;
    let show = |p: &Option<tenure::Paused>| {
        crate::commands::schedule::record("", "", "", p, None)["before"].clone()
    };
    if action == "resume" {
        let was = board.resume().await.map_err(unavailable)?;
        return Ok((
            serde_json::json!({ "was_paused": was }),
            show(&before),
            serde_json::Value::Null,
        ));
    }
    let until = match req.for_seconds {
        None => None,
        Some(0) => {
            return Err((
                StatusCode::BAD_REQUEST,
                "for_seconds must be more than 0".into(),
            )
                .into())
        }
        Some(s) => {
            let too_long =
                || Refusal::from((StatusCode::BAD_REQUEST, "for_seconds is too long".into()));
            let d = chrono::Duration::try_seconds(i64::try_from(s).unwrap_or(i64::MAX))
                .ok_or_else(too_long)?;
            Some(
                chrono::Utc::now()
                    .checked_add_signed(d)
                    .ok_or_else(too_long)?,
            )
        }
    };
    let by = format!("console admin token from {peer}");
    let paused = board
        .pause(until, &by, req.reason.trim())
        .await
        .map_err(unavailable)?;
    Ok((
        serde_json::json!({ "paused": true }),
        show(&before),
        show(&Some(paused)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abcdefghijklmnop", b"abcdefghijklmnop"));
        assert!(!constant_time_eq(b"abcdefghijklmnop", b"abcdefghijklmnoq"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
