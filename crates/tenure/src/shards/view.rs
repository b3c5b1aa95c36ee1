//! A shard group as anyone may read it: members, the map, and who holds
//! each shard now (`tenure shards status`, the console).

use std::time::SystemTime;

use super::{assign, seat_id, shard_name_text, Seat};
use crate::error::Result;
use crate::group::{Group, Member};
use crate::store::Name;

/// A shard group's members and shards, read from the store
/// ([`Group::shard_view`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardView {
    /// The group's shard count, as its members give it (0 when it has no
    /// member).
    pub shards: u32,
    /// The members, in the order they joined.
    pub members: Vec<Member>,
    /// Every shard, in order.
    pub shard_map: Vec<ShardState>,
}

/// One shard of a [`ShardView`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardState {
    /// Its index.
    pub index: u32,
    /// The member that holds it ([`Member::id`]), if one does; a holder
    /// that has already left the group (it drains) shows only in
    /// `holder_label`.
    pub owner: Option<u64>,
    /// The label of the session that holds it.
    pub holder_label: Option<String>,
    /// The fencing token of the grant held.
    pub token: Option<u64>,
    /// When it was granted, by the store's clock, where the store says.
    pub since: Option<SystemTime>,
    /// The member the map gives it to.
    pub assigned: Option<u64>,
    /// How many members wait for it.
    pub waiting: usize,
    /// Whether it is changing hands: held by another than the map's
    /// member, not held, or waited for.
    pub moving: bool,
}

/// The owner of each shard (a member id) by the map, for `members`: what
/// every member of the group computes.
pub fn shard_map(members: &[Member], shards: u32) -> Vec<Option<u64>> {
    let live: Vec<&Member> = members
        .iter()
        .filter(|m| !m.lapsed && m.shards == shards)
        .collect();
    let seats: Vec<Seat> = live
        .iter()
        .map(|m| Seat {
            id: seat_id(&m.session_tag, m.id),
            weight: m.weight,
        })
        .collect();
    assign(shards, &seats)
        .into_iter()
        .map(|o| o.map(|i| live[i].id))
        .collect()
}

impl Group {
    /// Reads the group as a shard group: its members, the map, and who
    /// holds each shard. One read per shard held or waited for.
    ///
    /// # Errors
    ///
    /// Store errors.
    pub async fn shard_view(&self) -> Result<ShardView> {
        let members = self.members().await?;
        let shards = members
            .iter()
            .map(|m| m.shards)
            .find(|&n| n > 0)
            .unwrap_or(0);
        let map = shard_map(&members, shards);
        let store = self.store();
        let prefix = shard_name_text(self.name(), 0);
        let prefix = &prefix[..prefix.len() - 1];
        let live = store.names(prefix).await?;
        let mut shard_map: Vec<ShardState> = (0..shards)
            .map(|index| ShardState {
                index,
                owner: None,
                holder_label: None,
                token: None,
                since: None,
                assigned: map.get(index as usize).copied().flatten(),
                waiting: 0,
                moving: true,
            })
            .collect();
        for name in live {
            let Some(index) = name
                .as_str()
                .strip_prefix(prefix)
                .and_then(|i| i.parse::<u32>().ok())
            else {
                continue;
            };
            let Some(state) = shard_map.get_mut(index as usize) else {
                continue;
            };
            let queue = store.queue(&Name::new(name.as_str())?).await?;
            if let Some(held) = queue.entries.iter().find(|e| e.granted) {
                state.owner = members
                    .iter()
                    .find(|m| m.session_tag == held.session_tag)
                    .map(|m| m.id);
                state.holder_label = Some(held.label.clone());
                state.token = Some(held.seq);
                state.since = held.granted_at;
            }
            state.waiting = queue.entries.iter().filter(|e| !e.granted).count();
        }
        for state in &mut shard_map {
            state.moving =
                state.token.is_none() || state.owner != state.assigned || state.waiting > 0;
        }
        Ok(ShardView {
            shards,
            members,
            shard_map,
        })
    }
}
