//! Waiting for a grant: a waiter's look at its own row (and, next in line,
//! at the granted rows ahead), settling what an expiry granted, and the
//! wait itself.

use std::time::Duration;

use rusqlite::{params, OptionalExtension};

use super::calls::{db_err, kind_at};
use super::layout::NOW;
use super::sessions::end_sessions;
use super::{SqliteStore, POLL_MAX, POLL_MIN};
use crate::backend::poll;
use crate::error::{Error, Result};
use crate::queue;
use crate::store::{Name, SessionKey};

/// What a waiter learns from one look at its row.
enum Look {
    Granted,
    Waiting {
        until: Option<Duration>,
        next: bool,
    },
    /// Granted by an expiry nobody has settled yet, or behind an expired
    /// entry (this session's, to end) that a walk from the head would not reach.
    NeedsSettle {
        dead_ahead: Option<String>,
    },
}

impl SqliteStore {
    /// One look at the session's entry `seq` of `name`: its own row, the
    /// row just ahead, and only for the next in line the granted rows ahead.
    async fn look(&self, key: &SessionKey, name: &Name, seq: u64) -> Result<Look> {
        let key = key.clone();
        let name = name.clone();
        self.run(move |conn| {
            let seq = i64::try_from(seq).map_err(|_| Error::NotHeld("no such entry"))?;
            let own: Option<(Option<i64>, bool)> = conn
                .prepare_cached(&format!(
                    "SELECT e.granted_ms, s.expires_ms > {NOW}
                     FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                     WHERE e.name = ?1 AND e.seq = ?2 AND e.session = ?3"
                ))
                .and_then(|mut s| {
                    s.query_row(params![name.as_str(), seq, key.secret()], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                })
                .map_err(db_err)?;
            match own {
                None => {
                    let alive: bool = conn
                        .query_row(
                            &format!("SELECT EXISTS(SELECT 1 FROM tenure_sessions WHERE id = ?1 AND expires_ms > {NOW})"),
                            [key.secret()],
                            |r| r.get(0),
                        )
                        .map_err(db_err)?;
                    return if alive {
                        Err(Error::NotHeld("this session has no such entry"))
                    } else {
                        Err(Error::SessionLost(crate::error::LostReason::Expired))
                    };
                }
                Some((_, false)) => {
                    return Err(Error::SessionLost(crate::error::LostReason::Expired))
                }
                Some((Some(_), true)) => return Ok(Look::Granted),
                Some((None, true)) => {}
            }
            let ahead: Option<(Option<i64>, bool, i64, String)> = conn
                .prepare_cached(&format!(
                    "SELECT e.granted_ms, s.expires_ms > {NOW}, s.expires_ms - {NOW}, e.session
                     FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                     WHERE e.name = ?1 AND e.seq < ?2 ORDER BY e.seq DESC LIMIT 1"
                ))
                .and_then(|mut s| {
                    s.query_row(params![name.as_str(), seq], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })
                    .optional()
                })
                .map_err(db_err)?;
            let (ahead_granted, ahead_live, ahead_left) = match ahead {
                // Nothing ahead: the rules grant it.
                None => return Ok(Look::NeedsSettle { dead_ahead: None }),
                Some((_, false, _, session)) => {
                    return Ok(Look::NeedsSettle {
                        dead_ahead: Some(session),
                    })
                }
                Some((granted, live, left, _)) => (granted, live, left),
            };
            let ms = |left: i64| Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)));
            if ahead_live && ahead_granted.is_none() {
                return Ok(Look::Waiting {
                    until: ms(ahead_left),
                    next: false,
                });
            }
            // Next in line: every entry ahead is granted. Would the rules
            // grant this one too (a reader behind readers, a permit that
            // fits), or has a holder expired?
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT e.seq, e.kind, e.count, e.lim, s.expires_ms - {NOW}
                     FROM tenure_entries e JOIN tenure_sessions s ON s.id = e.session
                     WHERE e.name = ?1 AND e.seq <= ?2 ORDER BY e.seq"
                ))
                .map_err(db_err)?;
            let mut rows = stmt.query(params![name.as_str(), seq]).map_err(db_err)?;
            let mut rule = queue::GrantWalk::new();
            let mut first_expiry: Option<i64> = None;
            while let Some(r) = rows.next().map_err(db_err)? {
                let row_seq: i64 = r.get(0).map_err(db_err)?;
                let kind = kind_at(r, 1)?;
                let left: i64 = r.get(4).map_err(db_err)?;
                let admitted = rule.admit(kind);
                if row_seq == seq {
                    if admitted {
                        return Ok(Look::NeedsSettle { dead_ahead: None });
                    }
                } else if left <= 0 {
                    // A holder expired: settling passes its grant on.
                    return Ok(Look::NeedsSettle { dead_ahead: None });
                } else {
                    first_expiry = Some(first_expiry.map_or(left, |m| m.min(left)));
                }
            }
            Ok(Look::Waiting {
                until: first_expiry.and_then(ms),
                next: true,
            })
        })
        .await
    }

    /// Waits until the session's entry `seq` of `name` is granted.
    pub(super) async fn wait_granted(
        &self,
        session: &SessionKey,
        name: &Name,
        seq: u64,
    ) -> Result<()> {
        let (listening, _) = self
            .inner
            .listeners
            .listen(poll::grant_key(name.as_str(), seq));
        // Grants made in this process wake their waiters directly; for those
        // made elsewhere only the first waiter of the name here polls.
        let listening = listening.in_line(poll::grant_prefix(name.as_str()));
        let pushed = || async { false };
        // The machine's boot clock judges expiry here: nothing to watch.
        poll::until_granted(
            &listening,
            POLL_MIN,
            POLL_MAX,
            pushed,
            |_| async {
                loop {
                    match self.look(session, name, seq).await? {
                        Look::Granted => return Ok(poll::Look::Granted),
                        Look::Waiting { until, next } => {
                            return Ok(poll::Look::Wait {
                                until,
                                next,
                                watch: None,
                            })
                        }
                        // Granted by an expiry nobody has settled yet, or behind
                        // an expired waiter: settle, look again.
                        Look::NeedsSettle { dead_ahead } => {
                            let name = name.clone();
                            self.write(move |tx| {
                                if let Some(session) = &dead_ahead {
                                    end_sessions(tx, std::slice::from_ref(session))?;
                                }
                                Ok(((), vec![name.clone()]))
                            })
                            .await?;
                        }
                    }
                }
            },
            None::<poll::NoStandIn>,
        )
        .await
    }
}
