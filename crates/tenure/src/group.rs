//! Group membership: who is in a named group, for as long as their sessions
//! live.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::acquire::{Hold, Order, Wait};
use crate::error::{Error, LostReason, Result};
use crate::session::Session;
use crate::store::{Entry, EntryKind, Name, Store};

/// Where a group's members are kept: one shared entry per member on this
/// name (`tenure.group:NAME`).
pub const GROUP_PREFIX: &str = "tenure.group:";

/// A named group of members. A member joins through its session, with a
/// value (an address, say), and stays a member while the session lives: a
/// process that dies leaves the group when the store ends its session,
/// within the TTL.
///
/// Built on the store contract: each member is a shared entry on
/// `tenure.group:NAME` with the member's value, so a group works on every
/// store with shared entries ([`Capabilities::shared`](crate::Capabilities::shared));
/// any other refuses with [`Error::Unsupported`]. [`Shards`](crate::Shards)
/// builds shard ownership on it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> tenure::Result<()> {
/// let store = tenure::open("memory://").await?;
/// let session = tenure::Session::new(&store).await?;
/// let group = tenure::Group::new(&store, "workers")?;
/// let me = group.join(&session, "10.0.0.7:8080").await?;
/// let members = group.members().await?;
/// assert_eq!(members.len(), 1);
/// assert_eq!(members[0].value, b"10.0.0.7:8080");
/// assert_eq!(members[0].id, me.id());
/// me.leave().await?;
/// assert!(group.members().await?.is_empty());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Group {
    store: Arc<dyn Store>,
    group: String,
    name: Name,
}

/// One member of a group, as anyone may read it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Member {
    /// The member's id: unique in the group for the life of the store, and
    /// in the order members joined.
    pub id: u64,
    /// The public tag of the member's session.
    pub session_tag: String,
    /// The label of the member's session (`host:pid` by default).
    pub label: String,
    /// The value it joined with.
    pub value: Vec<u8>,
    /// Its weight in a [`Shards`](crate::Shards) group (1 for a plain member).
    pub weight: u32,
    /// The shard count of its [`Shards`](crate::Shards) group; 0 for a plain
    /// member.
    pub shards: u32,
    /// When it joined, by the store's clock, where the store says
    /// ([`Capabilities::grant_times`](crate::Capabilities::grant_times)).
    pub since: Option<SystemTime>,
    /// Whether its lease has lapsed by the store's clock and a watcher has
    /// yet to confirm it ([`Capabilities::watched_expiry`](crate::Capabilities::watched_expiry)):
    /// a member on its way out, unless it renews. Only on those stores
    /// (Redis, Redlock, PostgreSQL, MySQL); elsewhere a member whose lease
    /// ends is gone from the list. A [`MembersWatch`] yields the list when
    /// a member lapses, as for any other change; [`Shards`](crate::Shards)
    /// give a lapsed member no shard.
    ///
    /// Nothing confirms a plain member's lapse on those stores (a shard's
    /// waiting owner does, for a [`Shards`](crate::Shards) member): it stays
    /// listed, lapsed, until the group's name changes again. Count only
    /// the members that have not lapsed as live.
    pub lapsed: bool,
}

/// The tag that starts a member's value in the store: the version of the
/// shard map's function ([`crate::Shards`]) and of this encoding.
const MEMBER_TAG: &str = "m1";

/// A member's value as the store keeps it: `m1 WEIGHT SHARDS\n` then the
/// user's value.
pub(crate) fn encode_member(weight: u32, shards: u32, value: &[u8]) -> Vec<u8> {
    let mut out = format!("{MEMBER_TAG} {weight} {shards}\n").into_bytes();
    out.extend_from_slice(value);
    out
}

/// Back from [`encode_member`]: `(weight, shards, value)`; `None` for an
/// entry that is not a member's (something else joined the group's name).
pub(crate) fn decode_member(raw: &[u8]) -> Option<(u32, u32, Vec<u8>)> {
    let end = raw.iter().position(|&b| b == b'\n')?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut parts = head.split(' ');
    if parts.next()? != MEMBER_TAG {
        return None;
    }
    let weight = parts.next()?.parse().ok()?;
    let shards = parts.next()?.parse().ok()?;
    Some((weight, shards, raw[end + 1..].to_vec()))
}

impl Member {
    /// The member an entry of a group's queue stands for, if it is one
    /// (`None` for an entry that something else put on the group's name).
    /// `watched_expiry` is the store's [`Capabilities::watched_expiry`]: it
    /// decides whether a zero time left means [`Member::lapsed`].
    ///
    /// For tools that list a store's entries (`tenure status` does):
    /// [`Group::members`] is the way to list a group.
    ///
    /// [`Capabilities::watched_expiry`]: crate::Capabilities::watched_expiry
    pub fn from_entry(entry: &Entry, watched_expiry: bool) -> Option<Member> {
        if entry.kind != EntryKind::Shared {
            return None;
        }
        let (weight, shards, value) = decode_member(&entry.value)?;
        Some(Member {
            id: entry.seq,
            session_tag: entry.session_tag.clone(),
            label: entry.label.clone(),
            value,
            weight,
            shards,
            since: entry.granted_at,
            lapsed: watched_expiry && entry.expires_in.is_zero(),
        })
    }
}

impl Group {
    /// The group `name` on `store`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that is empty, has control
    /// characters, or is too long once prefixed (the longest group name is
    /// 228 bytes, so that a shard's name fits too).
    pub fn new(store: &Arc<dyn Store>, name: impl AsRef<str>) -> Result<Group> {
        let group = name.as_ref();
        Name::new(group)?;
        // A shard's name is the longest the group makes.
        Name::new(crate::shards::shard_name_text(group, u32::from(u16::MAX)))?;
        Ok(Group {
            store: store.clone(),
            group: group.to_string(),
            name: Name::new(format!("{GROUP_PREFIX}{group}"))?,
        })
    }

    /// The group's name, as given.
    pub fn name(&self) -> &str {
        &self.group
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The name in the store that holds the members.
    pub fn members_name(&self) -> &Name {
        &self.name
    }

    /// Joins the group through `session` with `value`.
    ///
    /// A session is one member: joining again through the same session
    /// counts one more hold of the same membership (its value unchanged).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] on a store without shared entries;
    /// [`Error::SessionLost`]; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it completes, the member leaves again
    /// (in the background).
    pub async fn join(&self, session: &Session, value: impl Into<Vec<u8>>) -> Result<Membership> {
        self.join_as(session, 1, 0, &value.into()).await
    }

    pub(crate) async fn join_as(
        &self,
        session: &Session,
        weight: u32,
        shards: u32,
        value: &[u8],
    ) -> Result<Membership> {
        if !self.store.capabilities().shared {
            return Err(Error::Unsupported {
                backend: self.store.capabilities().backend,
                what: "groups (they need shared entries)",
            });
        }
        crate::store::check_value(value).or_else(|e| match value.is_empty() {
            true => Ok(()),
            false => Err(e),
        })?;
        let (hold, joined) = session
            .acquire(
                &self.name,
                EntryKind::Shared,
                encode_member(weight, shards, value),
                Wait::Forever,
                Order::Fifo,
                None,
            )
            .await?
            .ok_or_else(crate::acquire::no_grant)?;
        Ok(Membership {
            id: joined.seq,
            hold,
        })
    }

    /// The live members, in the order they joined.
    ///
    /// # Errors
    ///
    /// Store errors.
    pub async fn members(&self) -> Result<Vec<Member>> {
        let queue = self.store.queue(&self.name).await?;
        Ok(members_of(&self.store, &queue.entries))
    }

    /// A watch of the group's members: first the members now, then the
    /// list after each change.
    pub fn watch(&self) -> MembersWatch {
        MembersWatch {
            store: self.store.clone(),
            name: self.name.clone(),
            version: None,
            last: None,
            next_lapse: None,
        }
    }
}

/// The members among a group queue's entries.
pub(crate) fn members_of(store: &Arc<dyn Store>, entries: &[Entry]) -> Vec<Member> {
    let watched = store.capabilities().watched_expiry;
    entries
        .iter()
        .filter_map(|e| Member::from_entry(e, watched))
        .collect()
}

/// One member's place in a group, held through its session. Dropped, it
/// leaves the group in the background.
#[must_use = "the member leaves the group when this is dropped"]
#[derive(Debug)]
pub struct Membership {
    id: u64,
    hold: Hold,
}

impl Membership {
    /// The member's id ([`Member::id`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The session this member lives through.
    pub fn session(&self) -> &Session {
        &self.hold.session
    }

    /// Resolves when the membership may be over (its session is lost).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.hold.session.lost()
    }

    /// Leaves the group.
    ///
    /// # Cancel safety
    ///
    /// Runs to completion even if this future is dropped.
    pub async fn leave(self) -> Result<()> {
        self.hold.release().await.map(drop)
    }
}

/// The members of a group after each change ([`Group::watch`]).
#[derive(Debug)]
pub struct MembersWatch {
    store: Arc<dyn Store>,
    name: Name,
    version: Option<u64>,
    last: Option<Vec<Member>>,
    /// When the next member's lease lapses, where that changes no version
    /// ([`until_next_lapse`]).
    next_lapse: Option<tokio::time::Instant>,
}

/// How long until just after the first live member's lease lapses by the
/// store's clock, on a store where a lapse changes no version (a watcher
/// confirms expiry: [`Capabilities::watched_expiry`](crate::Capabilities::watched_expiry));
/// `None` on other stores, whose own expiry changes the version, or when
/// no member has time left. Whoever follows a group looks again then.
pub(crate) fn until_next_lapse(store: &Arc<dyn Store>, entries: &[Entry]) -> Option<Duration> {
    if !store.capabilities().watched_expiry {
        return None;
    }
    entries
        .iter()
        .map(|e| e.expires_in)
        .filter(|d| !d.is_zero())
        .min()
        .map(|d| d + Duration::from_millis(20))
}

impl MembersWatch {
    /// The members: first those now, then the list after each change of
    /// membership (a join, a leave, a value, a lease that lapsed: see
    /// [`Member::lapsed`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: no change is skipped by dropping the future, though
    /// changes between calls may be merged into the latest list.
    pub async fn next(&mut self) -> Result<Vec<Member>> {
        loop {
            if let Some(version) = self.version {
                // Where a lapse changes no version, look again at the next
                // member's lapse too.
                let at = self.next_lapse;
                let lapse = async move {
                    match at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    changed = self.store.wait_changed(&self.name, version) => {
                        self.version = Some(changed?);
                    }
                    () = lapse => {}
                }
            }
            let queue = self.store.queue(&self.name).await?;
            self.version = Some(queue.version);
            self.next_lapse = until_next_lapse(&self.store, &queue.entries)
                .map(|d| tokio::time::Instant::now() + d);
            let members = members_of(&self.store, &queue.entries);
            let same = |a: &[Member], b: &[Member]| {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(x, y)| x.id == y.id && x.value == y.value && x.lapsed == y.lapsed)
            };
            if self
                .last
                .as_deref()
                .is_some_and(|last| same(last, &members))
            {
                continue;
            }
            self.last = Some(members.clone());
            return Ok(members);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_values_round_trip() {
        let raw = encode_member(3, 64, b"host:1\nmore");
        assert_eq!(decode_member(&raw), Some((3, 64, b"host:1\nmore".to_vec())));
        assert_eq!(decode_member(b""), None);
        assert_eq!(decode_member(b"m2 1 1\nx"), None);
        assert_eq!(decode_member(b"m1 x 1\nx"), None);
    }
}
