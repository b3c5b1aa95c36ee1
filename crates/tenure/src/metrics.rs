//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade (cargo
//! feature `metrics`, on by default).
//!
//! tenure records; the application picks the exporter by installing a
//! recorder (such as `metrics-exporter-prometheus`). With no recorder
//! installed every call is a no-op. The series come from two places only:
//! the recipes and sessions (written once over the store contract), and one
//! store wrapper, [`Metered`], that [`open`](crate::open) puts around every
//! store it opens. No backend records anything itself, so every backend
//! reports the same series with the same labels.
//!
//! Names follow Prometheus' conventions: a `tenure_` prefix, base units
//! (seconds), `_total` on counters. [`METRICS`] lists them all; the
//! README's "Metrics" section shows the same table.
//!
//! # Bounded labels
//!
//! Label values come from small fixed sets (`backend`, `op`, `kind`,
//! `outcome`, `reason`, `to`), except `name`: the name of a lock, semaphore,
//! election or schedule. A schedule's per-tick claim names (`job@1717171717`)
//! and the keys of [`once`](crate::once) never become label values. Where an
//! application makes names without bound (one lock per user, say), cut the
//! `name` label to a prefix or turn it off with [`set_name_label`], once, at
//! start-up.
//!
//! ```
//! tenure::metrics::set_name_label(tenure::metrics::NameLabel::Prefix(8));
//! assert_eq!(tenure::metrics::name_label(), tenure::metrics::NameLabel::Prefix(8));
//! # tenure::metrics::set_name_label(tenure::metrics::NameLabel::Full);
//! ```
//!
//! # Cost, and turning it off
//!
//! By default ([`Recording::Auto`]) tenure records only while a recorder is
//! installed (globally, or for the thread), and with none it builds no key
//! and reads no clock: what it costs then is one look at the recorder per
//! operation. The `metrics` facade cannot say whether a recorder is
//! installed, only hand out the one in use, which is `metrics`' own no-op
//! recorder when there is none; tenure takes a recorder of zero size for
//! that no-op. An application whose own recorder is a zero-sized type
//! (one that forwards to statics) calls [`set_recording`]`(Recording::On)`.
//! [`set_recording`]`(Recording::Off)` (or [`set_enabled`]`(false)`) skips
//! everything, whatever is installed. Whether an acquisition, a hold, a
//! leadership or a session is recorded is decided once, when it starts, so
//! a recorder installed meanwhile never sees a gauge go below zero.
//!
//! # Descriptions
//!
//! Every metric is described (help text and unit) when a store is opened
//! with [`open`](crate::open) or wrapped with [`Metered::wrap`]. An
//! application that installs its recorder after that calls [`describe`].

// Without the feature the recording helpers are empty: what they would
// record goes unread.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
#[cfg(feature = "metrics")]
use std::sync::Arc;

use crate::error::Error;
#[cfg(feature = "metrics")]
pub use crate::metered::Metered;
use crate::store::Name;

/// What the `name` label of tenure's metrics shows (a process-wide setting,
/// see [`set_name_label`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NameLabel {
    /// The whole name (the default).
    #[default]
    Full,
    /// No `name` label at all: the series of all names are added up (gauges
    /// count holds, waiters and leaderships across names), and
    /// `tenure_fencing_token` is not recorded.
    Off,
    /// The first `n` characters of the name, so names that share a prefix
    /// share a series. `Prefix(0)` is [`NameLabel::Off`].
    Prefix(usize),
}

/// When tenure records, for the whole process ([`set_recording`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Recording {
    /// While a recorder other than `metrics`' no-op is installed (the
    /// default): nothing is timed or keyed without one.
    #[default]
    Auto,
    /// Always, even into the no-op recorder (for a recorder that is a
    /// zero-sized type, which `Auto` takes for the no-op).
    On,
    /// Never, whatever recorder is installed.
    Off,
}

/// The setting: 0 `Auto`, 1 `On`, 2 `Off`.
static RECORDING: AtomicU8 = AtomicU8::new(0);

/// Sets when tenure records, for the whole process. Call it once at
/// start-up: a gauge raised before and lowered after (a lock held across
/// the switch) stays raised.
pub fn set_recording(setting: Recording) {
    let raw = match setting {
        Recording::Auto => 0,
        Recording::On => 1,
        Recording::Off => 2,
    };
    RECORDING.store(raw, Ordering::Relaxed);
}

/// When tenure records now.
pub fn recording() -> Recording {
    match RECORDING.load(Ordering::Relaxed) {
        1 => Recording::On,
        2 => Recording::Off,
        _ => Recording::Auto,
    }
}

/// `set_enabled(true)` is [`Recording::On`], `false` [`Recording::Off`].
pub fn set_enabled(on: bool) {
    set_recording(if on { Recording::On } else { Recording::Off });
}

/// Whether tenure records metrics now, on this thread ([`Recording`]);
/// always false without the cargo feature `metrics`.
pub fn enabled() -> bool {
    #[cfg(feature = "metrics")]
    {
        match recording() {
            Recording::On => true,
            Recording::Off => false,
            // `metrics`' no-op recorder is a zero-sized type; a real one
            // keeps its series somewhere.
            Recording::Auto => metrics::with_recorder(|r| std::mem::size_of_val(r) != 0),
        }
    }
    #[cfg(not(feature = "metrics"))]
    false
}

/// The setting: `usize::MAX` for `Full`, `0` for `Off`, `n` for `Prefix(n)`.
static NAME_LABEL: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Sets what the `name` label shows, for the whole process. Call it once at
/// start-up, before the first lock is taken: a series recorded before keeps
/// its labels (a held-lock gauge, say, is then decremented on a series of
/// the new shape).
pub fn set_name_label(setting: NameLabel) {
    let raw = match setting {
        NameLabel::Full => usize::MAX,
        NameLabel::Off | NameLabel::Prefix(0) => 0,
        // `usize::MAX` characters is the whole name anyway.
        NameLabel::Prefix(n) => n,
    };
    NAME_LABEL.store(raw, Ordering::Relaxed);
}

/// What the `name` label shows now.
pub fn name_label() -> NameLabel {
    match NAME_LABEL.load(Ordering::Relaxed) {
        usize::MAX => NameLabel::Full,
        0 => NameLabel::Off,
        n => NameLabel::Prefix(n),
    }
}

impl NameLabel {
    /// The label value this setting gives `name`, or `None` for no label.
    pub fn apply<'a>(&self, name: &'a str) -> Option<&'a str> {
        match *self {
            NameLabel::Full => Some(name),
            NameLabel::Off | NameLabel::Prefix(0) => None,
            NameLabel::Prefix(n) => Some(match name.char_indices().nth(n) {
                Some((cut, _)) => &name[..cut],
                None => name,
            }),
        }
    }
}

/// The type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down, or is set.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

/// One metric tenure records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricInfo {
    /// The metric's name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricType,
    /// `"seconds"` or `""` (a count).
    pub unit: &'static str,
    /// Its label keys, in order (`name` is left out when
    /// [`NameLabel::Off`]).
    pub labels: &'static [&'static str],
    /// Its help text.
    pub help: &'static str,
}

macro_rules! metric_names {
    ($($(#[$doc:meta])* $konst:ident = $name:literal, $kind:ident, $unit:literal, [$($label:literal),*], $help:literal;)*) => {
        $(
            $(#[$doc])*
            #[doc = concat!("`", $name, "`: ", $help)]
            pub const $konst: &str = $name;
        )*
        /// Every metric tenure records, with its type, unit, labels and help.
        pub const METRICS: &[MetricInfo] = &[
            $(MetricInfo {
                name: $name,
                kind: MetricType::$kind,
                unit: $unit,
                labels: &[$($label),*],
                help: $help,
            }),*
        ];
    };
}

metric_names! {
    SESSIONS_OPEN = "tenure_sessions_open", Gauge, "", ["backend"],
        "Sessions open in this process.";
    SESSION_RENEWALS = "tenure_session_renewals_total", Counter, "", ["backend", "outcome"],
        "Session renewals by outcome: ok, lost (the store no longer has the session), error, timeout (unanswered at the local deadline).";
    RENEWAL_SLACK = "tenure_session_renewal_slack_seconds", Histogram, "seconds", ["backend"],
        "Time left until the lease's local deadline when a renewal was confirmed (negative: confirmed too late).";
    SESSIONS_LOST = "tenure_sessions_lost_total", Counter, "", ["backend", "reason"],
        "Sessions lost, by reason: expired, evicted, unconfirmed (closed sessions are not counted).";
    ACQUISITIONS = "tenure_acquisitions_total", Counter, "", ["kind", "name", "outcome"],
        "Acquisitions by kind (mutex, read, write, semaphore, election) and outcome: acquired, busy (a try found it taken), timeout, lost, error, cancelled.";
    ACQUIRE_WAIT = "tenure_acquire_wait_seconds", Histogram, "seconds", ["kind", "name"],
        "Time from asking to the grant, for acquisitions that were granted.";
    HOLD = "tenure_hold_seconds", Histogram, "seconds", ["kind", "name"],
        "Time from the grant to the release (or drop) of a hold.";
    HELD = "tenure_held", Gauge, "", ["kind", "name"],
        "Holds this process has now.";
    WAITING = "tenure_waiting", Gauge, "", ["kind", "name"],
        "Acquisitions of this process queued and waiting for their grant now.";
    FENCING_TOKEN = "tenure_fencing_token", Gauge, "", ["name"],
        "The last fencing token granted to this process, per name.";
    LEADER = "tenure_leader", Gauge, "", ["name"],
        "1 while this process leads the election, else 0.";
    /// client-go's name for [`LEADER`], so existing dashboards keep working.
    MASTER_STATUS = "leader_election_master_status", Gauge, "", ["name"],
        "1 while this process leads the election, else 0 (client-go's name for tenure_leader).";
    LEADER_TRANSITIONS = "tenure_leader_transitions_total", Counter, "", ["name", "to"],
        "Leadership changes of this process: to=leader when a term begins, to=follower when it ends.";
    CRON_TICKS = "tenure_cron_ticks_total", Counter, "", ["name", "outcome"],
        "Schedule ticks as this instance saw them: ran, claimed_elsewhere, not_leader, missed, paused, error.";
    CRON_RUN = "tenure_cron_run_seconds", Histogram, "seconds", ["name"],
        "How long the runs of a schedule's job took.";
    CRON_LAST_SUCCESS = "tenure_cron_last_success_timestamp_seconds", Gauge, "seconds", ["name"],
        "When a run of the job last finished on its own (not stopped), as a Unix time.";
    CRON_NEXT_TICK = "tenure_cron_next_tick_timestamp_seconds", Gauge, "seconds", ["name"],
        "When the schedule's next tick is due, as a Unix time.";
    ONCE = "tenure_once_total", Counter, "", ["outcome"],
        "Calls of once() by outcome: ran, recorded, failed, retry, in_progress, error.";
    STORE_OPERATION = "tenure_store_operation_seconds", Histogram, "seconds", ["backend", "op"],
        "Latency of store operations (not await_grant and wait_changed, which wait).";
    STORE_ERRORS = "tenure_store_errors_total", Counter, "", ["backend", "op", "kind"],
        "Store operations that failed, by error kind (session_lost, not_held, unavailable, …).";
}

/// Describes every metric (help text and unit) to the recorder installed
/// now. [`open`](crate::open) does this; call it after installing a
/// recorder if stores were opened before.
pub fn describe() {
    #[cfg(feature = "metrics")]
    for m in METRICS {
        let unit = if m.unit == "seconds" {
            metrics::Unit::Seconds
        } else {
            metrics::Unit::Count
        };
        match m.kind {
            MetricType::Counter => metrics::describe_counter!(m.name, unit, m.help),
            MetricType::Gauge => metrics::describe_gauge!(m.name, unit, m.help),
            MetricType::Histogram => metrics::describe_histogram!(m.name, unit, m.help),
        }
    }
}

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

/// A run of the schedule's job took `took`; `finished` if it ended on its
/// own (at Unix time `now`), not stopped.
#[cfg(feature = "schedule")]
pub(crate) fn cron_ran(name: &NameTag, took: std::time::Duration, finished: Option<f64>) {
    if !enabled() {
        return;
    }
    #[cfg(feature = "metrics")]
    {
        counter(CRON_TICKS, labels(&[("outcome", "ran")], name), 1);
        histogram(CRON_RUN, labels(&[], name), took.as_secs_f64());
        if let Some(now) = finished {
            gauge_set(CRON_LAST_SUCCESS, labels(&[], name), now);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, took, finished);
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

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;
    use std::time::Duration;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::MetricKind;

    use super::*;
    use crate::{Election, Mutex, RwLock, Semaphore, Session, SessionOptions, Store};

    /// The tests here that record, or change the name-label setting, one at
    /// a time: the setting is process-wide.
    static SETTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// One recorded series.
    #[derive(Debug)]
    struct Series {
        name: String,
        kind: MetricKind,
        labels: BTreeMap<String, String>,
        unit: Option<metrics::Unit>,
        described: bool,
        value: DebugValue,
    }

    fn snapshot(recorder: &DebuggingRecorder) -> Vec<Series> {
        recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, unit, description, value)| {
                let (kind, key) = key.into_parts();
                Series {
                    name: key.name().to_string(),
                    kind,
                    labels: key
                        .labels()
                        .map(|l| (l.key().to_string(), l.value().to_string()))
                        .collect(),
                    unit,
                    described: description.is_some(),
                    value,
                }
            })
            .collect()
    }

    /// The value of the one series of `name` whose labels include `labels`
    /// (a counter or gauge as f64; a histogram's observation count).
    fn value(all: &[Series], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Series> = all
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
        found.first().map(|s| match &s.value {
            DebugValue::Counter(n) => *n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(h) => h.len() as f64,
        })
    }

    fn ten_seconds() -> SessionOptions {
        SessionOptions::new().ttl(Duration::from_secs(10))
    }

    /// The scenario: a lock, a contended lock, a release, a timeout, the two
    /// sides of a read-write lock, a semaphore, an election, `once`, a
    /// schedule's tick and an evicted session.
    async fn scenario(store: &Arc<dyn Store>) -> u64 {
        let a = Session::with_options(store, ten_seconds()).await.unwrap();
        let b = Session::with_options(store, ten_seconds()).await.unwrap();
        a.renew().await.unwrap();
        let held = Mutex::new(&a, "metrics-lock")
            .unwrap()
            .lock()
            .await
            .unwrap();
        let mb = Mutex::new(&b, "metrics-lock").unwrap();
        assert!(mb.try_lock().await.unwrap().is_none());
        assert!(matches!(
            mb.lock_timeout(Duration::from_millis(20)).await,
            Err(Error::Timeout(_))
        ));
        let waiter = tokio::spawn(async move { mb.lock().await });
        let name = Name::new("metrics-lock").unwrap();
        while store.queue(&name).await.unwrap().entries.len() < 2 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        held.release().await.unwrap();
        let next = waiter.await.unwrap().unwrap();
        let token = next.token();
        next.release().await.unwrap();

        let read = RwLock::new(&a, "metrics-rw").unwrap().read().await.unwrap();
        read.release().await.unwrap();
        let permit = Semaphore::new(&a, "metrics-pool", 2)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        permit.release().await.unwrap();

        let term = Election::new(&a, "metrics-election")
            .unwrap()
            .campaign("a")
            .await
            .unwrap();
        term.proclaim("a2").await.unwrap();
        term.resign().await.unwrap();

        let job = || async { Ok(b"done".to_vec()) };
        let ttl = Duration::from_secs(10);
        let ran = crate::once(store, "unbounded-key-1", ttl, WhileRunning::Fail, job);
        assert!(matches!(ran.await.unwrap(), OnceOutcome::Ran(_)));
        let again = crate::once(store, "unbounded-key-1", ttl, WhileRunning::Fail, job);
        assert!(matches!(again.await.unwrap(), OnceOutcome::Recorded(_)));

        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        crate::Schedule::new(store, "metrics-cron", "* * * * * *")
            .unwrap()
            .run(
                move |_| {
                    let _ = tx.send(());
                    async {}
                },
                async move {
                    let _ = rx.recv().await;
                },
            )
            .await
            .unwrap();

        let evicted = Mutex::new(&b, "metrics-evict")
            .unwrap()
            .lock()
            .await
            .unwrap();
        let name = Name::new("metrics-evict").unwrap();
        assert_eq!(store.evict(&name).await.unwrap(), 1);
        assert!(matches!(b.renew().await, Err(Error::SessionLost(_))));
        drop(evicted);
        a.close().await.unwrap();
        token
    }

    use crate::{OnceOutcome, WhileRunning};

    /// A lost lease ends the held and leader gauges at once, not when the
    /// guard or term is dropped (which then changes nothing): no "two
    /// leaders" while a stale process still holds its `Term`.
    #[tokio::test]
    async fn a_lost_lease_ends_the_held_and_leader_gauges() {
        let _setting = SETTING.lock().await;
        set_name_label(NameLabel::Full);
        let recorder = DebuggingRecorder::new();
        let _local = metrics::set_default_local_recorder(&recorder);
        let store = crate::open("memory://").await.unwrap();
        let s = Session::with_options(&store, ten_seconds()).await.unwrap();
        let guard = Mutex::new(&s, "tied-lock").unwrap().lock().await.unwrap();
        let term = Election::new(&s, "tied-election")
            .unwrap()
            .campaign("v")
            .await
            .unwrap();
        let held = [("kind", "mutex"), ("name", "tied-lock")];
        let leader = [("name", "tied-election")];
        let all = snapshot(&recorder);
        assert_eq!(value(&all, HELD, &held), Some(1.0));
        assert_eq!(value(&all, LEADER, &leader), Some(1.0));
        assert_eq!(
            store.evict(&Name::new("tied-lock").unwrap()).await.unwrap(),
            1
        );
        assert!(matches!(s.renew().await, Err(Error::SessionLost(_))));
        // The debugging recorder's snapshots take what changed since the
        // last one (gauges start again from 0): each figure is a change.
        let all = snapshot(&recorder);
        assert_eq!(
            value(&all, HELD, &held),
            Some(-1.0),
            "held not ended by the loss"
        );
        assert_eq!(
            value(&all, LEADER, &leader),
            Some(-1.0),
            "leader not ended by the loss"
        );
        assert_eq!(value(&all, MASTER_STATUS, &leader), Some(-1.0));
        assert_eq!(value(&all, HOLD, &held), Some(1.0), "one hold time");
        drop(guard);
        drop(term);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let all = snapshot(&recorder);
        assert_eq!(value(&all, HELD, &held), Some(0.0), "ended twice");
        assert_eq!(value(&all, LEADER, &leader), Some(0.0), "ended twice");
        assert_eq!(value(&all, HOLD, &held), Some(0.0), "a second hold time");
    }

    #[tokio::test]
    async fn the_memory_scenario_records_every_metric_with_its_labels() {
        let _setting = SETTING.lock().await;
        set_name_label(NameLabel::Full);
        let recorder = DebuggingRecorder::new();
        let all = {
            let _local = metrics::set_default_local_recorder(&recorder);
            let store = crate::open("memory://").await.unwrap();
            let token = tokio::time::timeout(Duration::from_secs(20), scenario(&store))
                .await
                .expect("the scenario finished in time");
            // Everything dropped: background clean-up runs here, still
            // recorded locally.
            drop(store);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let all = snapshot(&recorder);
            assert_eq!(
                value(&all, FENCING_TOKEN, &[("name", "metrics-lock")]),
                Some(token as f64)
            );
            all
        };

        // Every metric of the table, with exactly its labels, its unit and
        // its description; nothing else.
        let table: BTreeMap<&str, &MetricInfo> = METRICS.iter().map(|m| (m.name, m)).collect();
        for s in &all {
            let m = table
                .get(s.name.as_str())
                .unwrap_or_else(|| panic!("{} is not in METRICS", s.name));
            let keys: BTreeSet<&str> = s.labels.keys().map(String::as_str).collect();
            let want: BTreeSet<&str> = m.labels.iter().copied().collect();
            assert_eq!(keys, want, "labels of {}", s.name);
            let kind = match m.kind {
                MetricType::Counter => MetricKind::Counter,
                MetricType::Gauge => MetricKind::Gauge,
                MetricType::Histogram => MetricKind::Histogram,
            };
            assert_eq!(s.kind, kind, "{}", s.name);
            assert!(s.described, "{} is not described", s.name);
            let unit = if m.unit == "seconds" {
                metrics::Unit::Seconds
            } else {
                metrics::Unit::Count
            };
            assert_eq!(s.unit, Some(unit), "{}", s.name);
            assert!(
                s.labels
                    .values()
                    .all(|v| !v.contains('@') && !v.contains("unbounded-key")),
                "a claim name or a once key became a label value: {s:?}"
            );
        }
        let recorded: BTreeSet<&str> = all.iter().map(|s| s.name.as_str()).collect();
        for m in METRICS {
            assert!(recorded.contains(m.name), "{} was not recorded", m.name);
        }

        // And the values the scenario implies.
        let lock = [("kind", "mutex"), ("name", "metrics-lock")];
        let with = |extra: (&'static str, &'static str)| {
            let mut v = lock.to_vec();
            v.push(extra);
            v
        };
        assert_eq!(
            value(&all, ACQUISITIONS, &with(("outcome", "acquired"))),
            Some(2.0)
        );
        assert_eq!(
            value(&all, ACQUISITIONS, &with(("outcome", "busy"))),
            Some(1.0)
        );
        assert_eq!(
            value(&all, ACQUISITIONS, &with(("outcome", "timeout"))),
            Some(1.0)
        );
        assert_eq!(value(&all, ACQUIRE_WAIT, &lock), Some(2.0));
        assert_eq!(value(&all, HOLD, &lock), Some(2.0));
        assert_eq!(value(&all, HELD, &lock), Some(0.0));
        assert_eq!(value(&all, WAITING, &lock), Some(0.0));
        for (kind, name) in [("read", "metrics-rw"), ("semaphore", "metrics-pool")] {
            let labels = [("kind", kind), ("name", name), ("outcome", "acquired")];
            assert_eq!(value(&all, ACQUISITIONS, &labels), Some(1.0), "{kind}");
        }
        let election = [("name", "metrics-election")];
        assert_eq!(value(&all, LEADER, &election), Some(0.0));
        assert_eq!(value(&all, MASTER_STATUS, &election), Some(0.0));
        for to in ["leader", "follower"] {
            let labels = [("name", "metrics-election"), ("to", to)];
            assert_eq!(value(&all, LEADER_TRANSITIONS, &labels), Some(1.0), "{to}");
        }
        assert_eq!(value(&all, ONCE, &[("outcome", "ran")]), Some(1.0));
        assert_eq!(value(&all, ONCE, &[("outcome", "recorded")]), Some(1.0));
        let cron = [("name", "metrics-cron")];
        assert_eq!(
            value(
                &all,
                CRON_TICKS,
                &[("name", "metrics-cron"), ("outcome", "ran")]
            ),
            Some(1.0)
        );
        assert_eq!(value(&all, CRON_RUN, &cron), Some(1.0));
        let now = chrono::Utc::now().timestamp() as f64;
        let last = value(&all, CRON_LAST_SUCCESS, &cron).unwrap();
        assert!((now - 5.0..=now + 1.0).contains(&last), "{last} vs {now}");
        assert!(value(&all, CRON_NEXT_TICK, &cron).unwrap() >= last - 1.0);
        let memory = [("backend", "memory")];
        assert_eq!(value(&all, SESSIONS_OPEN, &memory), Some(0.0));
        assert_eq!(
            value(
                &all,
                SESSIONS_LOST,
                &[("backend", "memory"), ("reason", "evicted")]
            ),
            Some(1.0)
        );
        let renewed = [("backend", "memory"), ("outcome", "ok")];
        assert!(value(&all, SESSION_RENEWALS, &renewed).unwrap() >= 1.0);
        let refused = [("backend", "memory"), ("outcome", "lost")];
        assert_eq!(value(&all, SESSION_RENEWALS, &refused), Some(1.0));
        let join = [("backend", "memory"), ("op", "join")];
        assert!(value(&all, STORE_OPERATION, &join).unwrap() >= 8.0);
        let lost = [
            ("backend", "memory"),
            ("op", "keep_alive"),
            ("kind", "session_lost"),
        ];
        assert_eq!(value(&all, STORE_ERRORS, &lost), Some(1.0));
        // Waits are not timed.
        assert!(all
            .iter()
            .all(|s| s.name != STORE_OPERATION || s.labels["op"] != "await_grant"));
    }

    #[tokio::test]
    async fn the_name_label_can_be_cut_or_left_out() {
        let _setting = SETTING.lock().await;
        let mut seen = Vec::new();
        for setting in [NameLabel::Prefix(7), NameLabel::Off] {
            set_name_label(setting);
            let recorder = DebuggingRecorder::new();
            {
                let _local = metrics::set_default_local_recorder(&recorder);
                let store = crate::open("memory://").await.unwrap();
                let work = async {
                    let s = Session::with_options(&store, ten_seconds()).await.unwrap();
                    for name in ["metrics-a", "metrics-b"] {
                        let g = Mutex::new(&s, name).unwrap().lock().await.unwrap();
                        g.release().await.unwrap();
                    }
                    s.close().await.unwrap();
                };
                tokio::time::timeout(Duration::from_secs(10), work)
                    .await
                    .expect("in time");
            }
            seen.push(snapshot(&recorder));
        }
        set_name_label(NameLabel::Full);
        let (prefix, off) = (&seen[0], &seen[1]);
        // Both names share the prefix "metrics": one series for the two.
        let acquired = [
            ("kind", "mutex"),
            ("name", "metrics"),
            ("outcome", "acquired"),
        ];
        assert_eq!(value(prefix, ACQUISITIONS, &acquired), Some(2.0));
        assert!(prefix
            .iter()
            .filter_map(|s| s.labels.get("name"))
            .all(|v| v == "metrics"));
        // Off: no name label, and no per-name token gauge.
        assert!(
            off.iter().all(|s| !s.labels.contains_key("name")),
            "{off:?}"
        );
        assert_eq!(
            value(
                off,
                ACQUISITIONS,
                &[("kind", "mutex"), ("outcome", "acquired")]
            ),
            Some(2.0)
        );
        assert!(off.iter().all(|s| s.name != FENCING_TOKEN));
    }

    #[tokio::test]
    async fn turned_off_nothing_is_recorded() {
        let _setting = SETTING.lock().await;
        set_enabled(false);
        let recorder = DebuggingRecorder::new();
        {
            let _local = metrics::set_default_local_recorder(&recorder);
            let work = async {
                let store = crate::open("memory://").await.unwrap();
                let s = Session::with_options(&store, ten_seconds()).await.unwrap();
                let g = Mutex::new(&s, "metrics-off").unwrap().lock().await.unwrap();
                g.release().await.unwrap();
                let term = Election::new(&s, "metrics-off-election")
                    .unwrap()
                    .campaign("a")
                    .await
                    .unwrap();
                term.resign().await.unwrap();
                s.close().await.unwrap();
            };
            tokio::time::timeout(Duration::from_secs(10), work)
                .await
                .expect("in time");
        }
        set_recording(Recording::Auto);
        let all = snapshot(&recorder);
        assert!(all.is_empty(), "{all:?}");
    }

    /// Auto records into a recorder that keeps series, not into `metrics`'
    /// no-op (nothing timed or keyed then); On records into either.
    #[tokio::test]
    async fn auto_records_only_into_a_real_recorder() {
        let _setting = SETTING.lock().await;
        let recorder = DebuggingRecorder::new();
        let noop = metrics::NoopRecorder;
        assert_eq!(recording(), Recording::Auto);
        assert!(metrics::with_local_recorder(&recorder, enabled));
        assert!(!metrics::with_local_recorder(&noop, enabled));
        set_recording(Recording::On);
        assert!(metrics::with_local_recorder(&noop, enabled));
        set_recording(Recording::Off);
        assert!(!metrics::with_local_recorder(&recorder, enabled));
        set_recording(Recording::Auto);
    }

    #[test]
    fn name_label_settings() {
        assert_eq!(NameLabel::Full.apply("jobs/report"), Some("jobs/report"));
        assert_eq!(NameLabel::Off.apply("jobs/report"), None);
        assert_eq!(NameLabel::Prefix(0).apply("jobs/report"), None);
        assert_eq!(NameLabel::Prefix(4).apply("jobs/report"), Some("jobs"));
        assert_eq!(
            NameLabel::Prefix(40).apply("jobs/report"),
            Some("jobs/report")
        );
        // Cut on characters, never inside one.
        assert_eq!(NameLabel::Prefix(2).apply("ééé"), Some("éé"));
    }

    #[test]
    fn the_table_follows_prometheus_conventions() {
        let mut names = BTreeSet::new();
        for m in METRICS {
            assert!(names.insert(m.name), "{} twice", m.name);
            assert!(
                m.name.starts_with("tenure_") || m.name == MASTER_STATUS,
                "{}",
                m.name
            );
            assert_eq!(
                m.name.ends_with("_total"),
                m.kind == MetricType::Counter,
                "{}",
                m.name
            );
            assert_eq!(
                m.unit == "seconds",
                m.name.ends_with("_seconds"),
                "{}",
                m.name
            );
            assert!(!m.help.is_empty());
        }
    }

    #[test]
    fn the_readme_lists_every_metric() {
        let readme = include_str!("../../../README.md");
        for m in METRICS {
            assert!(
                readme.contains(&format!("`{}`", m.name)),
                "{} is not in the README",
                m.name
            );
        }
    }
}
