//! Exit codes, documented in `--help` and docs/cli.md: the codes, the table
//! `--help` shows, and the one mapping from the library's errors to them.

use tenure::Error;

/// Bad usage: a bad URL, duration, name or flag.
pub const USAGE: u8 = 64;
/// The store cannot be reached.
pub const UNAVAILABLE: u8 = 69;
/// Any other failure of tenure itself.
pub const SOFTWARE: u8 = 70;
/// The lock was not acquired within `--wait` (or at once with `--no-wait`),
/// or others hold the name in a way that conflicts.
pub const NOT_ACQUIRED: u8 = 75;
/// The session's lease was lost (or at risk): while waiting, while
/// leading, or while the command ran (its process group was terminated).
pub const LEASE_LOST: u8 = 79;
/// The command was found but could not be run.
pub const NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;
/// `tenure leader`: nobody leads; `tenure cell get`: no value;
/// `tenure release --session`: no live session has the tag; `tenure
/// schedule pause|resume`: no instance of the job has started.
pub const NO_LEADER: u8 = 3;

/// The table every `--help` ends with.
pub(crate) const EXIT_CODES: &str = "\
Exit codes (the same in every subcommand):
  the command's own code   when tenure ran a command (128+N if it died of signal N)
  126 the command was found but is not executable
  127 the command was not found
  64  usage error: bad URL, duration, name, flag or schedule (invalid input),
      or a store holding another version's schema or key layout
  69  store unavailable, or it refused the credentials
  70  other failure (a store error of another kind, an internal error)
  75  not acquired: within --wait, at once with --no-wait, or the name is held
      in a conflicting way; a fence refused a stale token; a cell was not at
      the version a write expected; `tenure upgrade finish`: sessions of
      older builds are still live
  79  the session's lease was lost: while waiting, while leading, or while the
      command ran (its process group was killed first)
  3   `tenure leader`: nobody leads; `tenure cell get`: the cell has no value;
      `tenure release --session`: no live session has that tag;
      `tenure schedule pause|resume`: no instance of that job has started";

/// A failure with its exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// The one mapping from the library's errors to exit codes, used by every
/// subcommand (the table is `EXIT_CODES`, and docs/cli.md's).
fn exit_code(e: &Error) -> u8 {
    match e {
        Error::InvalidName { .. }
        | Error::InvalidArgument { .. }
        | Error::InvalidUrl { .. }
        | Error::SchemaMismatch { .. }
        | Error::BackendDisabled { .. }
        | Error::Unsupported { .. } => USAGE,
        Error::Unavailable { .. } | Error::Auth { .. } => UNAVAILABLE,
        Error::Timeout(_)
        | Error::Conflict { .. }
        | Error::StaleToken { .. }
        | Error::VersionMismatch { .. }
        | Error::UpgradeUnfinished { .. } => NOT_ACQUIRED,
        Error::SessionLost(_) => LEASE_LOST,
        _ => SOFTWARE,
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::new(exit_code(&e), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// One error kind, one exit code, whichever subcommand meets it.
    #[test]
    fn each_error_kind_has_one_exit_code() {
        let boxed = || -> tenure::BoxError { "x".into() };
        for (e, code) in [
            (Error::SessionLost(tenure::LostReason::Expired), LEASE_LOST),
            (
                Error::SchemaMismatch {
                    backend: "redis",
                    url: "u".into(),
                    found: "layout 1".into(),
                    expected: "layout 2".into(),
                },
                USAGE,
            ),
            (Error::Timeout(Duration::from_secs(1)), NOT_ACQUIRED),
            (
                Error::Conflict {
                    name: "n".into(),
                    reason: "r".into(),
                },
                NOT_ACQUIRED,
            ),
            (
                Error::InvalidUrl {
                    url: "u".into(),
                    reason: "r".into(),
                },
                USAGE,
            ),
            (
                Error::Unavailable {
                    backend: "b",
                    source: boxed(),
                },
                UNAVAILABLE,
            ),
            (
                Error::Backend {
                    backend: "b",
                    source: boxed(),
                },
                SOFTWARE,
            ),
            (Error::NotHeld("x"), SOFTWARE),
        ] {
            assert_eq!(Failure::from(e).code, code);
        }
    }
}
