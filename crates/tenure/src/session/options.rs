//! How a session is opened, and the checks on it.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::Capabilities;

/// The smallest clock-drift allowance: stores count expiry in whole
/// milliseconds, so their deadline may round a millisecond or two earlier.
pub const MIN_DRIFT: Duration = Duration::from_millis(2);

/// The default session TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// How a session is opened.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    ttl: Duration,
    renew_every: Option<Duration>,
    drift: Option<Duration>,
    pub(super) label: Option<String>,
    pub(super) auto_renew: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: DEFAULT_TTL,
            renew_every: None,
            drift: None,
            label: None,
            auto_renew: true,
        }
    }
}

impl SessionOptions {
    /// Default options: a 15 s TTL renewed every 5 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the store keeps the session after its last renewal.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The TTL these options give a session.
    pub(crate) fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    /// How often to renew (default: a third of the TTL).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// How much faster the store's clock may run than ours over one TTL
    /// (default: 1% of the TTL plus 2 ms). The local deadline is this much
    /// earlier than the store's.
    pub fn drift(mut self, drift: Duration) -> Self {
        self.drift = Some(drift);
        self
    }

    /// A public label shown to others, such as `host:pid` (the default).
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Whether a background task renews the lease (default: yes). Without it
    /// the owner calls [`Session::renew`](crate::Session::renew) in time, and the session is lost at
    /// its local deadline otherwise.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }
}

impl SessionOptions {
    /// The TTL, drift allowance and renew interval these options give on a
    /// backend, checked against each other and the backend's TTL range.
    pub(super) fn checked(&self, caps: &Capabilities) -> Result<(Duration, Duration, Duration)> {
        let ttl = self.ttl;
        if ttl < caps.min_ttl || ttl > caps.max_ttl {
            return Err(Error::InvalidArgument {
                what: "session TTL",
                reason: format!(
                    "{ttl:?} is outside the {} backend's range {:?}..={:?}",
                    caps.backend, caps.min_ttl, caps.max_ttl
                ),
            });
        }
        let drift = self.drift.unwrap_or(ttl / 100 + Duration::from_millis(2));
        let renew_every = self.renew_every.unwrap_or(ttl / 3);
        if drift < MIN_DRIFT || drift >= ttl / 2 {
            return Err(Error::InvalidArgument {
                what: "clock drift allowance",
                reason: format!(
                    "{drift:?} must be at least {MIN_DRIFT:?} (stores count in milliseconds) and under half the TTL {ttl:?}"
                ),
            });
        }
        if renew_every.is_zero() || renew_every >= ttl - drift {
            return Err(Error::InvalidArgument {
                what: "renew interval",
                reason: format!(
                    "{renew_every:?} must be above zero and below the TTL minus the drift allowance ({:?})",
                    ttl - drift
                ),
            });
        }
        Ok((ttl, drift, renew_every))
    }
}
