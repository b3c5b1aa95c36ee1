//! The recording hooks the sessions, the acquisitions, the recipes and the
//! `Metered` store wrapper call: what each event records, and nothing when
//! recording is off.

use super::*;

/// An error's kind, as the `kind` label of [`STORE_ERRORS`] shows it.
#[cfg(feature = "metrics")]
pub(crate) fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidName { .. } => "invalid_name",
        Error::InvalidArgument { .. } => "invalid_argument",
        Error::InvalidUrl { .. } => "invalid_url",
        Error::BackendDisabled { .. } => "backend_disabled",
        Error::Timeout(_) => "timeout",
        Error::SessionLost(_) => "session_lost",
        Error::NotHeld(_) => "not_held",
        Error::Conflict { .. } => "conflict",
        Error::StaleToken { .. } => "stale_token",
        Error::VersionMismatch { .. } => "version_mismatch",
        Error::InProgress(_) => "in_progress",
        Error::Unavailable { .. } => "unavailable",
        Error::Auth { .. } => "auth",
        Error::Unsupported { .. } => "unsupported",
        Error::SchemaMismatch { .. } => "schema_mismatch",
        Error::UpgradeUnfinished { .. } => "upgrade_unfinished",
        Error::Backend { .. } => "backend",
    }
}

// ---------------------------------------------------------------------------
// What the recipes and sessions call. Without the feature these are empty and
// compile away.

/// The `name` label value of one name, computed once per hold or schedule.
#[derive(Debug, Clone, Default)]
pub(crate) struct NameTag(#[cfg(feature = "metrics")] Option<metrics::SharedString>);

impl NameTag {
    pub(crate) fn of(name: &Name) -> NameTag {
        #[cfg(feature = "metrics")]
        {
            let setting = name_label();
            NameTag(match setting.apply(name.as_str()) {
                None => None,
                Some(cut) if cut.len() == name.as_str().len() => {
                    Some(metrics::SharedString::from(Arc::clone(name.shared())))
                }
                Some(cut) => Some(metrics::SharedString::from(cut.to_string())),
            })
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = name;
            NameTag()
        }
    }
}

#[cfg(feature = "metrics")]
mod emit {
    use super::NameTag;
    use metrics::{Label, SharedString};

    /// Labels: the fixed ones, then `name` if the tag has one.
    pub(super) fn labels(fixed: &[(&'static str, &'static str)], name: &NameTag) -> Vec<Label> {
        let mut labels = Vec::with_capacity(fixed.len() + 1);
        labels.extend(fixed.iter().map(|&(k, v)| Label::from_static_parts(k, v)));
        if let Some(value) = &name.0 {
            labels.push(Label::new("name", SharedString::clone(value)));
        }
        labels
    }

    pub(super) fn counter(metric: &'static str, labels: Vec<Label>, by: u64) {
        metrics::counter!(metric, labels).increment(by);
    }

    pub(super) fn gauge_add(metric: &'static str, labels: Vec<Label>, delta: f64) {
        metrics::gauge!(metric, labels).increment(delta);
    }

    pub(super) fn gauge_set(metric: &'static str, labels: Vec<Label>, value: f64) {
        metrics::gauge!(metric, labels).set(value);
    }

    pub(super) fn histogram(metric: &'static str, labels: Vec<Label>, value: f64) {
        metrics::histogram!(metric, labels).record(value);
    }
}

#[cfg(feature = "metrics")]
use emit::{counter, gauge_add, gauge_set, histogram, labels};

/// A session was opened; whether it was counted (then [`session_ended`]
/// follows, once).
pub(crate) fn session_opened(backend: &'static str) -> bool {
    if !enabled() {
        return false;
    }
    #[cfg(feature = "metrics")]
    gauge_add(
        SESSIONS_OPEN,
        labels(&[("backend", backend)], &NameTag::default()),
        1.0,
    );
    #[cfg(not(feature = "metrics"))]
    let _ = backend;
    true
}

/// A session ended (closed, lost or dropped), once per session.
pub(crate) fn session_ended(backend: &'static str) {
    #[cfg(feature = "metrics")]
    gauge_add(
        SESSIONS_OPEN,
        labels(&[("backend", backend)], &NameTag::default()),
        -1.0,
    );
    #[cfg(not(feature = "metrics"))]
    let _ = backend;
}

/// A renewal's outcome, with the slack (seconds left to the local deadline
/// when it was confirmed) of a confirmed one.
pub(crate) fn renewal(backend: &'static str, outcome: &'static str, slack: Option<f64>) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        let none = NameTag::default();
        counter(
            SESSION_RENEWALS,
            labels(&[("backend", backend), ("outcome", outcome)], &none),
            1,
        );
        if let Some(slack) = slack {
            histogram(RENEWAL_SLACK, labels(&[("backend", backend)], &none), slack);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, outcome, slack);
}

/// A session was lost for `reason` (not closed by its owner).
pub(crate) fn session_lost(backend: &'static str, reason: crate::error::LostReason) {
    if !enabled() {
        return;
    }
    use crate::error::LostReason;
    let reason = match reason {
        LostReason::Expired => "expired",
        LostReason::Evicted => "evicted",
        LostReason::Unconfirmed => "unconfirmed",
        LostReason::Forgotten => "forgotten",
        LostReason::Closed => return,
    };
    #[cfg(feature = "metrics")]
    counter(
        SESSIONS_LOST,
        labels(
            &[("backend", backend), ("reason", reason)],
            &NameTag::default(),
        ),
        1,
    );
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, reason);
}

/// Seconds from `a` to `b`, negative when `b` is earlier.
pub(crate) fn signed_secs(from: tokio::time::Instant, to: tokio::time::Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64()
    } else {
        -(from - to).as_secs_f64()
    }
}

/// The recipe an acquisition is for: the `kind` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recipe {
    Mutex,
    Read,
    Write,
    Semaphore,
    Election,
}

impl Recipe {
    fn as_str(self) -> &'static str {
        match self {
            Recipe::Mutex => "mutex",
            Recipe::Read => "read",
            Recipe::Write => "write",
            Recipe::Semaphore => "semaphore",
            Recipe::Election => "election",
        }
    }
}

/// One acquisition under way: counts its outcome once (`cancelled` if
/// dropped first) and keeps the waiting gauge while it waits.
#[derive(Debug)]
pub(crate) struct Acquiring {
    recipe: Recipe,
    name: NameTag,
    started: std::time::Instant,
    waiting: bool,
    done: bool,
}

impl Acquiring {
    pub(crate) fn start(recipe: Recipe, name: &Name) -> Acquiring {
        Acquiring {
            recipe,
            name: NameTag::of(name),
            started: std::time::Instant::now(),
            waiting: false,
            done: false,
        }
    }

    /// The entry was queued and waits for its grant.
    pub(crate) fn waiting(&mut self) {
        if !self.waiting {
            self.waiting = true;
            self.waiting_gauge(1.0);
        }
    }

    fn waiting_gauge(&self, delta: f64) {
        #[cfg(feature = "metrics")]
        gauge_add(
            WAITING,
            labels(&[("kind", self.recipe.as_str())], &self.name),
            delta,
        );
        #[cfg(not(feature = "metrics"))]
        let _ = delta;
    }

    fn outcome(&mut self, outcome: &'static str) {
        self.done = true;
        if self.waiting {
            self.waiting = false;
            self.waiting_gauge(-1.0);
        }
        #[cfg(feature = "metrics")]
        counter(
            ACQUISITIONS,
            labels(
                &[("kind", self.recipe.as_str()), ("outcome", outcome)],
                &self.name,
            ),
            1,
        );
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }

    /// Granted with fencing token `token`: the hold's metrics, to keep until
    /// it is released.
    pub(crate) fn granted(mut self, token: u64) -> HeldMetric {
        self.outcome("acquired");
        #[cfg(feature = "metrics")]
        {
            let kind = [("kind", self.recipe.as_str())];
            histogram(
                ACQUIRE_WAIT,
                labels(&kind, &self.name),
                self.started.elapsed().as_secs_f64(),
            );
            gauge_add(HELD, labels(&kind, &self.name), 1.0);
            // Only per whole name: names cut to one prefix would share a
            // series whose value jumps between their tokens.
            if self.name.0.is_some() && name_label() == NameLabel::Full {
                // f64 holds every integer up to 2^53 exactly.
                gauge_set(FENCING_TOKEN, labels(&[], &self.name), token as f64);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = token;
        HeldMetric {
            recipe: self.recipe,
            name: std::mem::take(&mut self.name),
            since: std::time::Instant::now(),
        }
    }

    /// Ended without a grant: `busy` (`None` from a try), or an error.
    pub(crate) fn failed(mut self, error: Option<&Error>) {
        self.outcome(match error {
            None => "busy",
            Some(Error::Timeout(_)) => "timeout",
            Some(Error::SessionLost(_)) => "lost",
            Some(_) => "error",
        });
    }
}

impl Drop for Acquiring {
    fn drop(&mut self) {
        if !self.done {
            self.outcome("cancelled");
        }
    }
}

/// A hold's metrics: the held gauge while it lives, and its hold time when
/// it is released or dropped.
#[derive(Debug)]
pub(crate) struct HeldMetric {
    recipe: Recipe,
    name: NameTag,
    since: std::time::Instant,
}

impl Drop for HeldMetric {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        {
            let kind = [("kind", self.recipe.as_str())];
            histogram(
                HOLD,
                labels(&kind, &self.name),
                self.since.elapsed().as_secs_f64(),
            );
            gauge_add(HELD, labels(&kind, &self.name), -1.0);
        }
    }
}

/// Leadership of one election while a term lives: the leader gauges and the
/// transitions.
#[derive(Debug)]
pub(crate) struct LeaderMetric {
    name: NameTag,
}

impl LeaderMetric {
    pub(crate) fn elected(name: &Name) -> LeaderMetric {
        let metric = LeaderMetric {
            name: NameTag::of(name),
        };
        metric.change(1.0, "leader");
        metric
    }

    fn change(&self, delta: f64, to: &'static str) {
        #[cfg(feature = "metrics")]
        {
            gauge_add(LEADER, labels(&[], &self.name), delta);
            gauge_add(MASTER_STATUS, labels(&[], &self.name), delta);
            counter(LEADER_TRANSITIONS, labels(&[("to", to)], &self.name), 1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (delta, to);
    }
}

impl Drop for LeaderMetric {
    fn drop(&mut self) {
        self.change(-1.0, "follower");
    }
}

/// A member of the shard group `name` now owns `delta` more shards.
pub(crate) fn shards_owned(name: &NameTag, delta: f64) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    gauge_add(SHARDS_OWNED, labels(&[], name), delta);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, delta);
}

/// A shard of the group `name` changed hands on this member's side
/// (`taken` or `given`), after `secs`.
pub(crate) fn shard_handover(name: &NameTag, side: &'static str, secs: f64) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        counter(SHARD_HANDOVERS, labels(&[("side", side)], name), 1);
        histogram(SHARD_HANDOVER, labels(&[("side", side)], name), secs);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, side, secs);
}

/// A member of the group `name` settled at the Unix time `at`, or is no
/// longer settled (0).
pub(crate) fn shards_settled(name: &NameTag, at: f64) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    gauge_set(SHARDS_SETTLED, labels(&[], name), at);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, at);
}

/// What became of a schedule's tick, as this instance saw it.
#[cfg(feature = "schedule")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TickOutcome {
    ClaimedElsewhere,
    NotLeader,
    Missed,
    Paused,
    /// The tick was claimed but whether it may run could not be read (the
    /// schedule's pause): skipped.
    Error,
}

/// `count` ticks of the schedule `name` ended as `outcome`.
#[cfg(feature = "schedule")]
pub(crate) fn cron_ticks(name: &NameTag, outcome: TickOutcome, count: usize) {
    if !enabled() {
        return;
    }
    if count == 0 {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        let outcome = match outcome {
            TickOutcome::ClaimedElsewhere => "claimed_elsewhere",
            TickOutcome::NotLeader => "not_leader",
            TickOutcome::Missed => "missed",
            TickOutcome::Paused => "paused",
            TickOutcome::Error => "error",
        };
        counter(
            CRON_TICKS,
            labels(&[("outcome", outcome)], name),
            count as u64,
        );
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome);
}

/// How a run of a schedule's job ended.
#[cfg(feature = "schedule")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    Succeeded,
    Failed,
    Stopped,
}

/// A run of the schedule's job took `took` and ended as `outcome`;
/// `finished`, the Unix time it succeeded at.
#[cfg(feature = "schedule")]
pub(crate) fn cron_ran(
    name: &NameTag,
    outcome: RunOutcome,
    took: std::time::Duration,
    finished: Option<f64>,
) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        let outcome = match outcome {
            RunOutcome::Succeeded => "succeeded",
            RunOutcome::Failed => "failed",
            RunOutcome::Stopped => "stopped",
        };
        counter(CRON_TICKS, labels(&[("outcome", outcome)], name), 1);
        histogram(CRON_RUN, labels(&[], name), took.as_secs_f64());
        if let Some(now) = finished {
            gauge_set(CRON_LAST_SUCCESS, labels(&[], name), now);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome, took, finished);
}

/// The schedule's next tick is due at Unix time `at`.
#[cfg(feature = "schedule")]
pub(crate) fn cron_next_tick(name: &NameTag, at: f64) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    gauge_set(CRON_NEXT_TICK, labels(&[], name), at);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, at);
}

/// How a call of `once` ended.
pub(crate) fn once_outcome(outcome: &'static str) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    counter(
        ONCE,
        labels(&[("outcome", outcome)], &NameTag::default()),
        1,
    );
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}

/// A store operation took `took` (`None`: a wait, not timed) and failed with
/// `error`, if any.
#[cfg(feature = "metrics")]
pub(crate) fn store_op(
    backend: &'static str,
    op: &'static str,
    took: Option<std::time::Duration>,
    error: Option<&Error>,
) {
    if !enabled() {
        return;
    }
    let none = NameTag::default();
    if let Some(took) = took {
        histogram(
            STORE_OPERATION,
            labels(&[("backend", backend), ("op", op)], &none),
            took.as_secs_f64(),
        );
    }
    if let Some(e) = error {
        counter(
            STORE_ERRORS,
            labels(
                &[("backend", backend), ("op", op), ("kind", error_kind(e))],
                &none,
            ),
            1,
        );
    }
}
