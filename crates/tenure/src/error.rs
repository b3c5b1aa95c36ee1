//! The one error type of tenure.

use std::fmt;
use std::time::Duration;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong, each variant something a caller can act on.
///
/// No variant ever carries a password: URLs are shown with their password
/// replaced by `***`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock, election or semaphore name was rejected.
    #[error("invalid name \"{name}\": {reason}")]
    InvalidName {
        /// The name, shortened and escaped for display.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// An argument such as a TTL or a permit count was out of range.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// A store URL could not be parsed or names something unknown.
    #[error("invalid store URL {url}: {reason}")]
    InvalidUrl {
        /// The URL with any password masked.
        url: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The URL names a backend that this build does not include.
    #[error(
        "the {backend} backend is not built in: enable the cargo feature `{feature}` of tenure"
    )]
    BackendDisabled {
        /// The backend's name.
        backend: &'static str,
        /// The cargo feature that turns it on.
        feature: &'static str,
    },

    /// The operation did not complete within the time the caller allowed.
    #[error("timed out after {0:?}")]
    Timeout(Duration),

    /// The session's lease is gone or may be gone: everything it held is (or
    /// soon will be) released by the store. Open a new session to go on.
    #[error("session lost: {0}")]
    SessionLost(LostReason),

    /// The caller does not hold what it tried to release, renew or proclaim.
    #[error("not held: {0}")]
    NotHeld(&'static str),

    /// The request conflicts with what others hold on the same name, such as
    /// a semaphore with another permit limit, or a mutex on a semaphore's name.
    #[error("conflict on {name:?}: {reason}")]
    Conflict {
        /// The name.
        name: String,
        /// What conflicts.
        reason: String,
    },

    /// A fence refused a token lower than the highest it has seen: the
    /// holder that presented it may have lost its lock to a later holder
    /// (see the `fencing` module). Nothing was written through it.
    #[error("fence {fence:?} refused token {token}: it has seen {highest}")]
    StaleToken {
        /// The fence's name.
        fence: String,
        /// The token presented.
        token: u64,
        /// The highest token the fence has admitted.
        highest: u64,
    },

    /// A cell was not at the version a write expected (see
    /// [`Cell`](crate::Cell)): nothing was written. Read it again and retry.
    #[error("cell {cell:?} {}, but the write expected {}", show_version(*.current, "has"), show_version(*.expected, "expected"))]
    VersionMismatch {
        /// The cell's name.
        cell: String,
        /// The version the write expected; `None`: no value.
        expected: Option<u64>,
        /// The cell's current version; `None`: it has no value.
        current: Option<u64>,
    },

    /// Another call is running the same idempotent job (see `tenure::once`).
    #[error("the job for key {0:?} is already running elsewhere")]
    InProgress(String),

    /// The store could not be reached or did not answer; trying again later may
    /// succeed.
    #[error("{backend} store unavailable: {source}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },

    /// The store refused the credentials.
    #[error("{backend} store refused the credentials: {reason}")]
    Auth {
        /// The backend's name.
        backend: &'static str,
        /// The store's reason, without the password.
        reason: String,
    },

    /// This backend cannot do what was asked (see its [`Capabilities`](crate::Capabilities)).
    #[error("the {backend} backend does not support {what}")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// What is unsupported.
        what: &'static str,
    },

    /// The store holds tenure's data in another layout (a schema or key
    /// layout of another version of tenure): nothing was changed.
    #[error("{backend} store at {url}: {found}, but this build of tenure uses {expected}")]
    SchemaMismatch {
        /// The backend's name.
        backend: &'static str,
        /// Where: the URL with any password masked.
        url: String,
        /// What the store holds.
        found: String,
        /// What this build expects.
        expected: String,
    },

    /// An upgrade cannot be finished yet: sessions of older builds (or of
    /// builds that recorded none) are still live on the store. Nothing was
    /// changed; finish again once they have ended.
    #[error("{backend} store: {} session(s) of older builds still live ({}); finish the upgrade once they have ended", sessions.len(), sessions.join(", "))]
    UpgradeUnfinished {
        /// The backend's name.
        backend: &'static str,
        /// Each such session: its tag, label and build.
        sessions: Vec<String>,
    },

    /// The store answered with an error that fits no other variant.
    #[error("{backend} store error: {source}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Whether retrying the same call later may succeed.
    pub fn is_temporary(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Timeout(_))
    }

    pub(crate) fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    #[allow(dead_code)] // used by the server backends
    pub(crate) fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            backend,
            source: source.into(),
        }
    }

    /// [`Error::Unavailable`] for a call the store answered by refusing it
    /// or rolling it back (a deadlock, a busy database, too many
    /// connections): it took no effect. Said the same way.
    #[allow(dead_code)] // used by the database backends
    pub(crate) fn refused(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            backend,
            source: Box::new(Refused(source.into())),
        }
    }

    /// Whether the call that failed so may still have taken effect in the
    /// store: it went unanswered (a lost connection, a timeout), rather than
    /// being refused or rolled back.
    pub(crate) fn may_have_taken_effect(&self) -> bool {
        match self {
            Error::Unavailable { source, .. } => !source.is::<Refused>(),
            _ => false,
        }
    }
}

/// The source of an [`Error::Unavailable`] that the store answered: the
/// call took no effect. Shown as the error it wraps.
#[derive(Debug)]
struct Refused(BoxError);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl Error {
    /// A store that could not be reached or did not answer, said with the
    /// servers the URL names (never its user or password) and each of its
    /// causes once; any other error as it is.
    pub(crate) fn at_servers(self, servers: &str) -> Error {
        match self {
            Error::Unavailable { backend, source } if !servers.is_empty() => {
                let said: BoxError = format!("at {servers}: {}", said_once(source.as_ref())).into();
                // Still marked if the store refused the call.
                let source = match source.is::<Refused>() {
                    true => Box::new(Refused(said)),
                    false => said,
                };
                Error::Unavailable { backend, source }
            }
            e => e,
        }
    }
}

/// An error and its causes in one line, each part said once: drivers nest
/// errors that repeat their cause's text (`tcp connect error: tcp connect
/// error: …`, `Input/output error: Input/output error: …`).
pub(crate) fn said_once(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = next {
        for part in cause.to_string().split(": ") {
            let part = part.trim();
            if !part.is_empty() && !parts.iter().any(|p| p == part) {
                parts.push(part.to_string());
            }
        }
        next = cause.source();
    }
    parts.join(": ")
}

fn show_version(version: Option<u64>, verb: &str) -> String {
    match (version, verb) {
        (Some(v), "has") => format!("is at version {v}"),
        (None, "has") => "has no value".to_string(),
        (Some(v), _) => format!("version {v}"),
        (None, _) => "no value".to_string(),
    }
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The store said it no longer has the session, once the lease could
    /// have run out by the store's clock: it expired.
    Expired,
    /// The store said it no longer has the session while the lease still had
    /// time left by this client's clock, which no expiry explains: someone
    /// ended it, such as an administrator's forced release (`evict`, `tenure
    /// release --force`) — or the store's clock stepped forward.
    Evicted,
    /// No renewal was confirmed before the local deadline, so the store may
    /// already have expired the session; or a release or a join went
    /// unanswered, so the session no longer knows what it holds and ends.
    Unconfirmed,
    /// The session was closed by its owner.
    Closed,
    /// The store lost what it held, this session with it: its data came back
    /// empty (a Redis restarted without persistence, or a failover to a
    /// replica that had none of it). The store grants nothing until every
    /// lease it could have held has lapsed.
    Forgotten,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the store expired the session",
            LostReason::Evicted => {
                "the store ended the session before its lease ran out (evicted by a forced \
                 release, or the store's clock stepped forward)"
            }
            LostReason::Unconfirmed => {
                "no renewal was confirmed before the lease's local deadline, or the store did not \
                 answer a release or a lock, so the session no longer knows what it holds"
            }
            LostReason::Closed => "the session was closed",
            LostReason::Forgotten => {
                "the store lost what it held (its data came back empty: a restart without \
                 persistence, or a failover to a replica that had none of it)"
            }
        })
    }
}

/// `Result` with tenure's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naming_the_servers_keeps_a_refusal_marked() {
        let refused = Error::refused("mysql", "Deadlock found").at_servers("db1:3306");
        assert!(!refused.may_have_taken_effect());
        assert_eq!(
            refused.to_string(),
            "mysql store unavailable: at db1:3306: Deadlock found"
        );
        let unanswered = Error::unavailable("mysql", "no answer within 5s").at_servers("db1:3306");
        assert!(unanswered.may_have_taken_effect());
        assert_eq!(
            unanswered.to_string(),
            "mysql store unavailable: at db1:3306: no answer within 5s"
        );
    }
}
