//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade (cargo
//! feature `metrics`, on by default).
//!
//! tenure records; the application picks the exporter by installing a
//! recorder (such as `metrics-exporter-prometheus`). With no recorder
//! installed every call is a no-op. The series come from two places only:
//! the recipes and sessions (written once over the store contract), and one
//! store wrapper, [`Metered`](crate::Metered), that [`open`](crate::open) puts around every
//! store it opens. No backend records anything itself, so every backend
//! reports the same series with the same labels.
//!
//! Names follow Prometheus' conventions: a `tenure_` prefix, base units
//! (seconds), `_total` on counters. [`METRICS`] lists them all; the
//! metrics page (`docs/operations/metrics.md`) shows the same table.
//!
//! # Bounded labels
//!
//! Label values come from small fixed sets (`backend`, `op`, `kind`,
//! `outcome`, `reason`, `to`), except `name`: the name of a lock, semaphore,
//! election or schedule. A schedule's per-tick claim names (`job@1717171717`)
//! and the keys of `tenure::once` never become label values. Where an
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
//! with [`open`](crate::open) or wrapped with [`Metered::wrap`](crate::Metered::wrap). An
//! application that installs its recorder after that calls [`describe`].

// Without the feature the recording helpers are empty: what they would
// record goes unread.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
#[cfg(feature = "metrics")]
use std::sync::Arc;

use crate::error::Error;
use crate::store::Name;

mod record;
pub(crate) use record::*;

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
        "Schedule ticks as this instance saw them: run here and succeeded, failed or stopped; claimed_elsewhere, not_leader, missed, paused, error.";
    CRON_RUN = "tenure_cron_run_seconds", Histogram, "seconds", ["name"],
        "How long the runs of a schedule's job took.";
    CRON_LAST_SUCCESS = "tenure_cron_last_success_timestamp_seconds", Gauge, "seconds", ["name"],
        "When a run of the job last succeeded (ended on its own, not failed or stopped), as a Unix time.";
    CRON_NEXT_TICK = "tenure_cron_next_tick_timestamp_seconds", Gauge, "seconds", ["name"],
        "When the schedule's next tick is due, as a Unix time.";
    SHARDS_OWNED = "tenure_shards_owned", Gauge, "", ["name"],
        "Shards of the group (name) this process owns now.";
    SHARD_HANDOVERS = "tenure_shard_handovers_total", Counter, "", ["name", "side"],
        "Shards of the group this process took (side=taken: granted after the map gave them to it) or gave up (side=given: released after a revocation).";
    SHARD_HANDOVER = "tenure_shard_handover_seconds", Histogram, "seconds", ["name", "side"],
        "side=taken: from the map giving this process a shard to its grant (the previous owner's drain included); side=given: from a revocation to the release.";
    SHARDS_SETTLED = "tenure_shards_settled_timestamp_seconds", Gauge, "seconds", ["name"],
        "When this member of the group last settled (owning exactly what the map gives it), as a Unix time; 0 while it is not settled.";
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
