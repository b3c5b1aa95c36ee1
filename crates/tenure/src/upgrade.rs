//! Rolling upgrades: which builds use a store, and finishing an upgrade.
//!
//! Builds of two consecutive releases share a store in any mix: a newer
//! build installs its format beside the older one and keeps the older
//! one's marker, so older builds go on working (docs/operations/upgrades.md).
//! Each session records the build and format that opened it
//! ([`Store::session_builds`]). Once every process runs the new build,
//! [`finish`] retires the older format: it refuses while a session of an
//! older build is live, then marks the store so that older builds refuse
//! it from their next connection on.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::store::{Build, SessionBuild, Store};

/// The format this build speaks on `store` (`""` for a store outside
/// tenure's table, or one that keeps nothing across processes).
pub fn this_format(store: &dyn Store) -> &'static str {
    let backend = store.capabilities().backend;
    crate::backends()
        .iter()
        .find(|b| b.name == backend)
        .and_then(|b| b.format())
        .unwrap_or("")
}

/// The sessions of `store` by the build that opened them, newest format
/// first; `None` gathers the sessions that recorded no build (builds of
/// release 0.1.0).
pub async fn builds_in_use(
    store: &Arc<dyn Store>,
) -> Result<Vec<(Option<Build>, Vec<SessionBuild>)>> {
    let mut groups: Vec<(Option<Build>, Vec<SessionBuild>)> = Vec::new();
    for s in store.session_builds().await? {
        match groups.iter_mut().find(|(b, _)| *b == s.build) {
            Some((_, sessions)) => sessions.push(s),
            None => groups.push((s.build.clone(), vec![s])),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(format_number(g.0.as_ref())));
    Ok(groups)
}

/// A format as a number, for ordering (`None` and anything not a number:
/// older than any).
fn format_number(build: Option<&Build>) -> Option<u64> {
    build.and_then(|b| b.format.parse().ok())
}

/// Whether a session's build speaks a format older than `ours`: one that
/// recorded none does, and one that is no number is taken to.
fn older(session: &SessionBuild, ours: &str) -> bool {
    let Some(build) = &session.build else {
        return true;
    };
    if build.format == ours {
        return false;
    }
    match (build.format.parse::<u64>(), ours.parse::<u64>()) {
        (Ok(theirs), Ok(ours)) => theirs < ours,
        _ => true,
    }
}

/// What [`finish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finished {
    /// The format the store is left at: this build's.
    pub format: String,
    /// What was changed, in words.
    pub retired: Vec<String>,
}

/// Finishes an upgrade to this build's format: refused with
/// [`Error::UpgradeUnfinished`], changing nothing, while any session of an
/// older build is live (a lease that lapsed but whose end the store has not
/// confirmed counts); otherwise retires the older formats
/// ([`Store::retire_older_formats`]). Finishing again changes nothing more.
/// A refusal is decided on two looks a second apart, so that a session of
/// this build that has opened but not yet recorded its build is not taken
/// for an older one.
pub async fn finish(store: &Arc<dyn Store>) -> Result<Finished> {
    let ours = this_format(store.as_ref());
    let mut old = older_sessions(store.session_builds().await?, ours);
    if !old.is_empty() {
        // A session records its build one round trip after it opens: one
        // of this build caught in between is listed with none. Looked at
        // again a moment later, only a session still older blocks.
        tokio::time::sleep(SETTLE).await;
        let again = older_sessions(store.session_builds().await?, ours);
        old.retain(|(tag, _)| again.iter().any(|(t, _)| t == tag));
    }
    if !old.is_empty() {
        return Err(Error::UpgradeUnfinished {
            backend: store.capabilities().backend,
            sessions: old.into_iter().map(|(_, text)| text).collect(),
        });
    }
    let retired = store.retire_older_formats().await?;
    Ok(Finished {
        format: ours.to_string(),
        retired,
    })
}

/// How long [`finish`] waits before it looks again at sessions listed as
/// older: far longer than the round trip between a session's opening and
/// the record of its build.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// The sessions of a build older than `ours`, by tag, each with a line
/// that names it for the operator.
fn older_sessions(sessions: Vec<SessionBuild>, ours: &str) -> Vec<(String, String)> {
    sessions
        .into_iter()
        .filter(|s| older(s, ours))
        .map(|s| {
            let build = s
                .build
                .as_ref()
                .map_or("no build recorded: 0.1.0".to_string(), |b| {
                    format!("{} format {}", b.release, b.format)
                });
            let text = format!("{} {:?} ({build})", s.tag, s.label);
            (s.tag, text)
        })
        .collect()
}
