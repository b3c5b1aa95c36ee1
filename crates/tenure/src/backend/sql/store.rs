//! The [`Store`] contract over a [`SqlDriver`]: one routine's call (or one
//! statement) per operation, the answers decoded, waiters woken.

use async_trait::async_trait;

use super::{int_arg, seq_arg, storable_tag, to_u64, Arg, SqlDriver, SqlStore};
use crate::backend::codec;
use crate::backend::poll::{self, Look};
use crate::error::{Error, LostReason, Result};
use crate::store::{
    Capabilities, CellWrite, Expect, FenceOp, FenceState, JoinMode, JoinRequest, Joined, Name,
    OpenedSession, Queue, SessionKey, SessionSpec, Store, Versioned,
};

#[async_trait]
impl<D: SqlDriver> Store for SqlStore<D> {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn open_session(&self, spec: &SessionSpec) -> Result<OpenedSession> {
        let opened = OpenedSession::random()?;
        let label: String = spec.label.chars().take(255).collect();
        let build = crate::store::Build::this(self.driver.format()).encode();
        self.driver
            .open(opened.key.secret(), &opened.tag, &label, spec.ttl_ms(), &build)
            .await?;
        Ok(opened)
    }

    async fn retire_older_formats(&self) -> Result<Vec<String>> {
        self.driver.retire_older_formats().await
    }

    async fn session_builds(&self) -> Result<Vec<crate::store::SessionBuild>> {
        Ok(crate::store::SessionBuild::listed(
            self.driver.session_builds().await?,
        ))
    }

    async fn keep_alive(&self, session: &SessionKey) -> Result<()> {
        match self.counted().keep_alive(session.secret()).await? {
            true => Ok(()),
            false => Err(Error::SessionLost(LostReason::Expired)),
        }
    }

    async fn close_session(&self, session: &SessionKey) -> Result<()> {
        let names = if self.driver.wakes_by_hand() {
            self.counted().names_of(session.secret()).await?
        } else {
            Vec::new()
        };
        self.driver
            .call("close", &[Arg::Text(session.secret())])
            .await?;
        for name in names {
            self.wake_next(&name);
        }
        Ok(())
    }

    async fn join(&self, session: &SessionKey, request: JoinRequest<'_>) -> Result<Option<Joined>> {
        let name = request.name;
        let (k, count, limit) = codec::kind_code(request.kind);
        let args = [
            Arg::Text(session.secret()),
            Arg::Text(name.as_str()),
            Arg::Int(k.into()),
            Arg::Int(count),
            Arg::Int(limit),
            Arg::Bytes(request.value),
            Arg::Flag(request.mode == JoinMode::IfGranted),
        ];
        let mut confirmed = false;
        // A semaphore request larger than its limit is the routine's to
        // judge; a name someone here waits for is not free.
        let tried = self.driver.has_fast_paths()
            && count <= limit
            && !self.waited_for(name)
            && self.fast_hints.take_worth_trying(name);
        let fast = if tried {
            self.counted().fast("join", &args).await?
        } else {
            None
        };
        let by_statement = fast.is_some();
        if tried && !by_statement {
            self.fast_hints.missed(name);
        }
        let row = match fast {
            Some(row) => row,
            None => loop {
                let row = self.counted().call("join", &args).await?;
                if self.status(&row, name)? != "none" {
                    break row;
                }
                // A try-lock on a queue where nobody is alive by the server's
                // clock (holders and waiters): that clock alone is not trusted,
                // so watch them all for their TTL, end those none renewed, and
                // try once more.
                match self.watch_at(&row, 5)? {
                    Some(watch) if row.truthy(7) && !confirmed => {
                        confirmed = true;
                        let ended = poll::confirm_lapsed(&watch, || async {
                            let args = [Arg::Text(name.as_str()), Arg::Text(&watch.blockers)];
                            Ok(self.counted().call("expire", &args).await?.int(1)? > 0)
                        })
                        .await?;
                        if !ended {
                            return Ok(None);
                        }
                        self.wake_next(name.as_str());
                    }
                    _ => return Ok(None),
                }
            },
        };
        self.changed(name.as_str());
        let joined = Joined {
            seq: row.count(1)?,
            granted: row.flag(2)?,
            holds: row.count(3)?,
            first: row.flag(4)?,
        };
        if self.driver.has_fast_paths() {
            self.fast_hints.joined(name, k, &joined, by_statement);
        }
        // A queued entry's join may also say what a first look would
        // (PostgreSQL's and MySQL's, from schema 10: columns 8 and 9).
        if !joined.granted && row.cells.len() > 9 {
            if let Some(until) = row.opt_int(8)? {
                let wait = Look::Wait {
                    until: poll::next_expiry(Some(until)),
                    next: row.flag(9)?,
                    watch: self.watch_at(&row, 5)?,
                };
                self.joined.keep(name, joined.seq, wait);
            }
        }
        Ok(Some(joined))
    }

    async fn leave(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<u32> {
        self.joined.take(name, seq);
        let args = [
            Arg::Text(session.secret()),
            Arg::Text(name.as_str()),
            Arg::Int(seq_arg(seq)?),
        ];
        // With a waiter here, the holder was moved into the queue; a hold
        // this store does not know to be in the row goes to the routine.
        let in_row = self.fast_hints.release_worth_trying(name, seq);
        let fast = if in_row && self.driver.has_fast_paths() && !self.waited_for(name) {
            self.counted().fast("leave", &args).await?
        } else {
            None
        };
        let row = match fast {
            Some(row) => row,
            None => self.counted().call("leave", &args).await?,
        };
        self.status(&row, name)?;
        let holds = row.count(1)?;
        if holds == 0 {
            // What the release granted, where the routine says (MySQL's):
            // committed, and nothing after the release's settling ends it,
            // so a waiter of this process takes it without a look.
            if let Some(granted) = row.opt_text(2)? {
                for seq in granted.split(',').filter(|s| !s.is_empty()) {
                    let seq = seq.parse::<u64>().map_err(|e| {
                        Error::backend(self.driver.backend(), format!("granted entry {seq:?}: {e}"))
                    })?;
                    self.listeners.granted(&poll::grant_key(name.as_str(), seq));
                }
            }
            // Whoever is next may be waiting in this process.
            self.wake_next(name.as_str());
        }
        Ok(holds)
    }

    async fn await_grant(&self, session: &SessionKey, name: &Name, seq: u64) -> Result<()> {
        let (listening, _) = self.listeners.listen(poll::grant_key(name.as_str(), seq));
        let listening = listening.in_line(poll::grant_prefix(name.as_str()));
        if let Some(proof) = self.driver.grant_proof(session.secret(), seq) {
            listening.expect_proof(proof);
        }
        let args = [
            Arg::Text(session.secret()),
            Arg::Text(name.as_str()),
            Arg::Int(seq_arg(seq)?),
        ];
        let (min, max) = self.driver.poll_bounds();
        let pushed = || self.driver.listen();
        let args = &args;
        // The join said what a first look would: once this waiter listens
        // (notifications arrive), only check that its entry was not granted
        // before, with a plain read.
        // Where nothing is pushed (MySQL), a release of this process
        // announces its grants, and the announcement is kept for a waiter
        // that listens late; anything else is found by polling, as after a
        // look: the answer stands in without a check.
        let first = self.joined.take(name, seq).map(|joined| {
            let heard_here = self.driver.wakes_by_hand();
            let still_queued = move || async move {
                let row = self.counted().fast("still_queued", &args[..3]).await?;
                Ok(row.is_some())
            };
            let joined = if heard_here {
                joined.without_push()
            } else {
                joined
            };
            (joined, still_queued)
        });
        poll::until_granted(
            &listening,
            min,
            max,
            pushed,
            |confirm| async move {
                let mut args = args.to_vec();
                args.push(confirm.as_deref().map_or(Arg::Null, Arg::Text));
                let row = self.counted().call("look", &args).await?;
                if confirm.is_some() {
                    // Confirmed blockers were ended: others may be next.
                    self.wake_next(name.as_str());
                }
                Ok(match self.status(&row, name)?.as_str() {
                    "granted" => Look::Granted,
                    _ => Look::Wait {
                        until: poll::next_expiry(row.opt_int(1)?),
                        next: row.flag(2)?,
                        watch: self.watch_at(&row, 3)?,
                    },
                })
            },
            first,
        )
        .await
    }

    async fn set_value(&self, key: &SessionKey, name: &Name, seq: u64, value: &[u8]) -> Result<()> {
        let args = [
            Arg::Text(key.secret()),
            Arg::Text(name.as_str()),
            Arg::Int(seq_arg(seq)?),
            Arg::Bytes(value),
        ];
        let row = self.counted().call("set_value", &args).await?;
        self.status(&row, name)?;
        self.changed(name.as_str());
        Ok(())
    }

    async fn queue(&self, name: &Name) -> Result<Queue> {
        loop {
            let (rows, version) = self.counted().rows(name.as_str()).await?;
            let mut entries = Vec::with_capacity(rows.len());
            let mut stale = false;
            for row in &rows {
                match self.entry(row)? {
                    Some(entry) => entries.push(entry),
                    None => stale = true,
                }
            }
            // An expired entry, or one the rules grant that the store has
            // not stamped: settle the name (ending expired sessions for
            // good) before anyone reads a grant from it.
            if stale || poll::has_unstamped_grant(&entries) {
                self.driver
                    .call("refresh", &[Arg::Text(name.as_str())])
                    .await?;
                self.wake_next(name.as_str());
                continue;
            }
            return Ok(Queue {
                version: u64::try_from(version)
                    .map_err(|e| Error::backend(self.driver.backend(), e))?,
                entries,
            });
        }
    }

    async fn wait_changed(&self, name: &Name, version: u64) -> Result<u64> {
        let (listening, _) = self.listeners.listen(poll::change_key(name.as_str()));
        let (min, max) = self.driver.poll_bounds();
        let pushed = || self.driver.listen();
        poll::until_changed(self, name, version, listening.notify(), min, max, pushed).await
    }

    async fn names(&self, prefix: &str) -> Result<Vec<Name>> {
        self.driver
            .names(prefix)
            .await?
            .into_iter()
            .map(|n| Name::stored(&n))
            .collect()
    }

    async fn evict(&self, name: &Name) -> Result<usize> {
        let row = self
            .driver
            .call("evict", &[Arg::Text(name.as_str())])
            .await?;
        self.wake_next(name.as_str());
        // Like every routine: a status, then the answer (sessions ended).
        let n = row.int(1)?;
        usize::try_from(n).map_err(|e| Error::backend(self.driver.backend(), e))
    }

    async fn evict_session(&self, tag: &str) -> Result<bool> {
        if !storable_tag(tag) {
            return Ok(false);
        }
        // As on close: the names to wake here are read first, since the
        // routine takes the session's entries away.
        let names = if self.driver.wakes_by_hand() {
            self.counted().names_of_tag(tag).await?
        } else {
            Vec::new()
        };
        let row = self.driver.call("evict_session", &[Arg::Text(tag)]).await?;
        // A status, then whether a live session had that tag.
        let ended = row.flag(1)?;
        if ended {
            for name in names {
                self.wake_next(&name);
            }
        }
        Ok(ended)
    }

    async fn fence(&self, name: &Name, op: FenceOp<'_>) -> Result<FenceState> {
        let (token, value) = match op {
            FenceOp::Read => (Arg::Null, Arg::Null),
            FenceOp::Admit { token, value } => (
                Arg::Int(int_arg("fencing token", token)?),
                value.map_or(Arg::Null, Arg::Bytes),
            ),
        };
        let row = self
            .counted()
            .call("fence", &[Arg::Text(name.as_str()), token, value])
            .await?;
        let status = self.register_status(&row, name)?;
        Ok(FenceState {
            admitted: status == "ok",
            highest: to_u64(row.int(1)?)?,
            value: row.opt_bytes(2)?,
        })
    }

    async fn cell_get(&self, name: &Name) -> Result<Option<Versioned>> {
        let row = self
            .counted()
            .call("cell_get", &[Arg::Text(name.as_str())])
            .await?;
        self.register_status(&row, name)?;
        match (row.opt_int(1)?, row.opt_bytes(2)?) {
            (Some(version), Some(value)) => Ok(Some(Versioned {
                value,
                version: to_u64(version)?,
            })),
            _ => Ok(None),
        }
    }

    async fn cell_put(
        &self,
        name: &Name,
        value: &[u8],
        expect: Expect,
        owner: Option<&SessionKey>,
    ) -> Result<CellWrite> {
        let expect = match expect {
            Expect::Absent => 0,
            Expect::Version(v) => int_arg("version", v)?,
        };
        let args = [
            Arg::Text(name.as_str()),
            Arg::Bytes(value),
            Arg::Int(expect),
            owner.map_or(Arg::Null, |k| Arg::Text(k.secret())),
        ];
        let row = self.counted().call("cell_put", &args).await?;
        self.cell_write(&row, name)
    }

    async fn cell_delete(&self, name: &Name, version: u64) -> Result<CellWrite> {
        let args = [
            Arg::Text(name.as_str()),
            Arg::Int(int_arg("version", version)?),
        ];
        let row = self.counted().call("cell_delete", &args).await?;
        self.cell_write(&row, name)
    }
}
