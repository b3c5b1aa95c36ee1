//! Which member owns which shard: a pure function of the member list.
//!
//! Every member computes the same map from the same list, so no member has
//! to write it down. The function is part of what a store holds across
//! builds (the members' entries say which function they use: `m1`), and is
//! never changed in place: a different function would be `m2`.
//!
//! **Balanced.** Each member's share (its *quota*) is its weight's share of
//! the shards, rounded down, and the shards left over go one each to the
//! members whose shares were rounded down the most. With equal weights every
//! member owns ⌊N/M⌋ or ⌈N/M⌉.
//!
//! **Sticky.** Every (shard, member) pair has a score, a hash of the two
//! (rendezvous hashing). Pairs are taken from the highest score down; a pair
//! is kept when its shard has no owner yet and its member is below its quota
//! (consistent hashing with bounded loads). A member that joins takes the
//! shards it scores highest on; a member that leaves frees its own, and the
//! others take them by score. Most shards keep their owner; the unit tests
//! measure how many move.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One member as the function sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seat {
    /// A stable hash of the member's identity ([`seat_id`]).
    pub(crate) id: u64,
    /// Its weight; zero owns nothing.
    pub(crate) weight: u32,
}

/// The identity hash of the member entry `seq` of the session `tag`.
pub(crate) fn seat_id(tag: &str, seq: u64) -> u64 {
    // FNV-1a: written out, since the value must be the same in every build
    // and std's hashers promise no such thing.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tag.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h ^ mix(seq))
}

/// splitmix64's finalizer: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn score(seat: &Seat, shard: u32) -> u64 {
    mix(seat.id ^ mix(u64::from(shard) ^ 0x5348_4152_4453_0001))
}

/// How many shards each seat owns (same order as `seats`).
pub(crate) fn quotas(shards: u32, seats: &[Seat]) -> Vec<u32> {
    let total: u64 = seats.iter().map(|s| u64::from(s.weight)).sum();
    if total == 0 {
        return vec![0; seats.len()];
    }
    let n = u64::from(shards);
    let mut quota: Vec<u32> = seats
        .iter()
        .map(|s| u32::try_from(n * u64::from(s.weight) / total).unwrap_or(shards))
        .collect();
    let given: u64 = quota.iter().map(|&q| u64::from(q)).sum();
    let left = usize::try_from(n - given.min(n)).unwrap_or(0);
    // The leftover go to the largest remainders, ties by identity.
    let mut order: Vec<usize> = (0..seats.len()).filter(|&i| seats[i].weight > 0).collect();
    order.sort_by_key(|&i| {
        let remainder = n * u64::from(seats[i].weight) % total;
        (Reverse(remainder), seats[i].id)
    });
    for &i in order.iter().take(left) {
        quota[i] += 1;
    }
    quota
}

/// The owner of each shard, as an index into `seats`: `None` only when no
/// seat has a weight.
pub(crate) fn assign(shards: u32, seats: &[Seat]) -> Vec<Option<usize>> {
    let mut room = quotas(shards, seats);
    let mut owner = vec![None; shards as usize];
    if room.iter().all(|&r| r == 0) {
        return owner;
    }
    // The best seat with room for a shard, by (score, then index).
    let best = |shard: u32, room: &[u32]| {
        seats
            .iter()
            .enumerate()
            .filter(|(i, _)| room[*i] > 0)
            .map(|(i, seat)| (score(seat, shard), Reverse(i)))
            .max()
    };
    // Each unowned shard's best pair when it was last looked at; a pair
    // whose seat has filled up since is looked at again. The heap's top is
    // then always the best pair still possible, so this is the greedy pass
    // over all pairs by score without listing them all.
    let mut heap: BinaryHeap<(u64, Reverse<usize>, Reverse<u32>)> = (0..shards)
        .filter_map(|shard| best(shard, &room).map(|(s, i)| (s, i, Reverse(shard))))
        .collect();
    while let Some((_, Reverse(seat), Reverse(shard))) = heap.pop() {
        if room[seat] > 0 {
            room[seat] -= 1;
            owner[shard as usize] = Some(seat);
        } else if let Some((s, i)) = best(shard, &room) {
            heap.push((s, i, Reverse(shard)));
        }
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seats(ids: impl IntoIterator<Item = u64>) -> Vec<Seat> {
        ids.into_iter()
            .map(|i| Seat {
                id: seat_id("member", i),
                weight: 1,
            })
            .collect()
    }

    /// How many shards have another owner (by seat id) in `b` than in `a`.
    fn moved(a: &[Seat], before: &[Option<usize>], b: &[Seat], after: &[Option<usize>]) -> usize {
        before
            .iter()
            .zip(after)
            .filter(|(x, y)| x.map(|i| a[i].id) != y.map(|i| b[i].id))
            .count()
    }

    #[test]
    fn balanced_with_equal_weights() {
        for (n, m) in [(16u32, 3u64), (64, 10), (1024, 50), (7, 9), (1, 2)] {
            let s = seats(0..m);
            let map = assign(n, &s);
            assert!(map.iter().all(Option::is_some));
            let mut count = vec![0u32; m as usize];
            for o in map.iter().flatten() {
                count[*o] += 1;
            }
            let (lo, hi) = (n / m as u32, n.div_ceil(m as u32));
            assert!(
                count.iter().all(|&c| c == lo || c == hi),
                "{n}/{m}: {count:?}"
            );
        }
    }

    #[test]
    fn weights_are_honoured_and_zero_owns_nothing() {
        let mut s = seats(0..3);
        s[0].weight = 2;
        s[2].weight = 0;
        let map = assign(30, &s);
        let count = |i| map.iter().filter(|o| **o == Some(i)).count();
        assert_eq!((count(0), count(1), count(2)), (20, 10, 0));
        s[0].weight = 0;
        s[1].weight = 0;
        assert!(assign(30, &s).iter().all(Option::is_none));
    }

    #[test]
    fn deterministic_whatever_the_order_computed_in() {
        let s = seats(0..10);
        assert_eq!(assign(1024, &s), assign(1024, &s));
        // Fixed values: a change to the function shows here (it must not
        // change in place; see the module's doc).
        assert_eq!(seat_id("a1b2c3", 7), seat_id("a1b2c3", 7));
        let map = assign(8, &seats(0..3));
        let owners: Vec<usize> = map.iter().map(|o| o.unwrap()).collect();
        assert_eq!(owners, FIXED_8_OVER_3);
    }

    const FIXED_8_OVER_3: [usize; 8] = [2, 1, 0, 2, 0, 2, 1, 1];

    /// A join or a leave moves about N/M shards (the moves a balanced map
    /// cannot avoid) plus the cascades of the bounded loads: measured here
    /// (from 1.0 times N/M with 3 members to about 2.5 with 50), and held
    /// under three times N/M.
    #[test]
    fn sticky_on_join_and_leave() {
        for (n, m) in [(64u32, 3u64), (64, 10), (1024, 3), (1024, 10), (1024, 50)] {
            let s = seats(0..m);
            let before = assign(n, &s);
            let joined = seats(0..=m);
            let after = assign(n, &joined);
            let on_join = moved(&s, &before, &joined, &after);
            let left: Vec<Seat> = s[1..].to_vec();
            let after = assign(n, &left);
            let on_leave = moved(&s, &before, &left, &after);
            let ideal_join = n as f64 / (m + 1) as f64;
            let ideal_leave = n as f64 / m as f64;
            eprintln!("{n} shards, {m} members: join moves {on_join} (ideal {ideal_join:.1}), leave moves {on_leave} (ideal {ideal_leave:.1})");
            assert!(
                (on_join as f64) <= 3.0 * ideal_join.ceil(),
                "join moved {on_join}"
            );
            assert!(
                (on_leave as f64) <= 3.0 * ideal_leave.ceil(),
                "leave moved {on_leave}"
            );
        }
    }
}
