//! The checker's rules, each on a small history.
use super::*;

fn r(at_us: u64, worker: u32, op: Op) -> Record {
    Record {
        at_us,
        worker: Some(worker),
        shard: None,
        op,
    }
}

/// Worker `w` takes the lock with `token`, increments both registers
/// from `v`, and releases, starting at `at`.
fn cycle(at: u64, w: u32, token: u64, v: u64) -> Vec<Record> {
    vec![
        r(at, w, Op::Request),
        r(at + 1, w, Op::Grant { token }),
        r(
            at + 2,
            w,
            Op::Read {
                token,
                fenced: Some(v),
                twin: v,
            },
        ),
        r(
            at + 3,
            w,
            Op::Write {
                token,
                value: v + 1,
                accepted: true,
                fenced_before: v,
                twin_before: v,
            },
        ),
        r(at + 4, w, Op::Release),
    ]
}

#[test]
fn a_clean_history_passes() {
    let mut h = cycle(0, 1, 10, 0);
    h.extend(cycle(10, 2, 11, 1));
    h.extend(cycle(20, 1, 12, 2));
    let f = check(&h, 1_000);
    assert!(!f.unsafe_run(), "{f:?}");
    assert_eq!((f.grants, f.twin_lost_writes, f.fenced_refusals), (3, 0, 0));
}

#[test]
fn catches_a_token_granted_twice() {
    let mut h = cycle(0, 1, 10, 0);
    h.extend(cycle(10, 2, 10, 1));
    assert_eq!(check(&h, 1_000).duplicate_tokens, 1);
}

#[test]
fn catches_tokens_going_backwards() {
    let mut h = cycle(0, 1, 10, 0);
    h.extend(cycle(10, 2, 9, 1));
    let f = check(&h, 1_000);
    assert_eq!(f.tokens_backwards, 1);
    assert!(f.unsafe_run());
    // Requests in flight together may be granted in either order.
    let h = vec![
        r(0, 1, Op::Request),
        r(1, 2, Op::Request),
        r(2, 2, Op::Grant { token: 11 }),
        r(3, 2, Op::Release),
        r(4, 1, Op::Grant { token: 10 }),
        r(5, 1, Op::Release),
    ];
    assert_eq!(check(&h, 1_000).tokens_backwards, 0);
}

#[test]
fn catches_a_lower_token_accepted_by_the_fence() {
    let mut h = cycle(0, 1, 10, 0);
    h.push(r(
        20,
        2,
        Op::Read {
            token: 9,
            fenced: Some(1),
            twin: 1,
        },
    ));
    assert_eq!(check(&h, 1_000).fenced_lower_token_accepted, 1);
}

#[test]
fn catches_a_lost_fenced_write() {
    let mut h = cycle(0, 1, 10, 0);
    // A write accepted that overwrote the 1 with a 1 again.
    h.push(r(
        20,
        1,
        Op::Write {
            token: 10,
            value: 1,
            accepted: true,
            fenced_before: 1,
            twin_before: 1,
        },
    ));
    let f = check(&h, 1_000);
    assert_eq!((f.fenced_lost_writes, f.twin_lost_writes), (1, 1));
}

#[test]
fn tells_paused_overlaps_from_unpaused_ones() {
    // 1 holds and is paused; 2 is granted meanwhile; 1's late write is
    // refused by the fence and lands on the twin.
    let h = vec![
        r(0, 1, Op::Request),
        r(1, 1, Op::Grant { token: 10 }),
        r(
            2,
            1,
            Op::Read {
                token: 10,
                fenced: Some(0),
                twin: 0,
            },
        ),
        r(
            3,
            1,
            Op::FaultStart {
                fault: "pause".into(),
            },
        ),
        r(4, 2, Op::Request),
        r(50, 2, Op::Grant { token: 11 }),
        r(
            51,
            2,
            Op::Read {
                token: 11,
                fenced: Some(0),
                twin: 0,
            },
        ),
        r(
            52,
            2,
            Op::Write {
                token: 11,
                value: 1,
                accepted: true,
                fenced_before: 0,
                twin_before: 0,
            },
        ),
        r(
            60,
            1,
            Op::FaultEnd {
                fault: "pause".into(),
            },
        ),
        r(
            61,
            1,
            Op::Write {
                token: 10,
                value: 1,
                accepted: false,
                fenced_before: 1,
                twin_before: 1,
            },
        ),
        r(62, 1, Op::Lost),
        r(70, 2, Op::Release),
    ];
    let f = check(&h, 100);
    assert!(!f.unsafe_run(), "{f:?}");
    assert_eq!((f.overlaps_paused, f.overlaps_unpaused), (1, 0));
    assert_eq!((f.fenced_refusals, f.twin_lost_writes), (1, 1));
    assert!((f.worst_recovery_ms - 0.047).abs() < 1e-9, "{f:?}");
    // The same overlap without a pause is a violation, explained.
    let unpaused: Vec<Record> = h
        .into_iter()
        .filter(|r| !matches!(r.op, Op::FaultStart { .. } | Op::FaultEnd { .. }))
        .collect();
    let f = check(&unpaused, 100);
    assert_eq!(f.overlaps_unpaused, 1);
    assert!(f.unsafe_run());
    assert_eq!(f.explained.len(), 1, "{f:?}");
    let told = &f.explained[0];
    assert!(
        told.starts_with("worker 1 held 0.001..0.062 ms, worker 2 held 0.050..0.070 ms:")
            && told.contains(" 0.050 w2 grant 11;")
            && told.contains("w1 lost;"),
        "{told}"
    );
}

#[test]
fn a_write_applied_after_the_loss_it_is_dated_before_still_counts() {
    // 1 dates its loss from its deadline (5), but a write of its token
    // was applied at 10, after 2 was granted at 8: an overlap.
    let h = vec![
        r(0, 1, Op::Grant { token: 10 }),
        r(
            1,
            1,
            Op::Read {
                token: 10,
                fenced: Some(0),
                twin: 0,
            },
        ),
        r(5, 1, Op::Lost),
        r(8, 2, Op::Grant { token: 11 }),
        r(
            10,
            1,
            Op::Write {
                token: 10,
                value: 1,
                accepted: true,
                fenced_before: 0,
                twin_before: 0,
            },
        ),
        r(12, 2, Op::Release),
    ];
    let f = check(&h, 100);
    assert_eq!(f.overlaps_unpaused, 1, "{f:?}");
    // Without that write, the loss at 5 ends the section: none.
    let without: Vec<Record> = h
        .into_iter()
        .filter(|r| !matches!(r.op, Op::Write { .. }))
        .collect();
    let f = check(&without, 100);
    assert_eq!(f.overlaps_unpaused + f.overlaps_paused, 0, "{f:?}");
}

#[test]
fn an_overlap_after_the_pause_ended_is_the_pause_s() {
    // 1 is paused in its section and goes on after it wakes; 2 is
    // granted only after the pause ended, while 1 has not noticed.
    let h = vec![
        r(0, 1, Op::Grant { token: 10 }),
        r(
            1,
            1,
            Op::FaultStart {
                fault: "pause".into(),
            },
        ),
        r(
            10,
            1,
            Op::FaultEnd {
                fault: "pause".into(),
            },
        ),
        r(11, 2, Op::Grant { token: 11 }),
        r(12, 1, Op::Lost),
        r(13, 2, Op::Release),
    ];
    let f = check(&h, 100);
    assert_eq!((f.overlaps_paused, f.overlaps_unpaused), (1, 0), "{f:?}");
}

#[test]
fn counts_slow_recoveries() {
    let h = vec![
        r(0, 1, Op::Request),
        r(1, 1, Op::Grant { token: 10 }),
        r(
            2,
            1,
            Op::FaultStart {
                fault: "kill".into(),
            },
        ),
        r(3, 1, Op::Exit),
        r(4, 2, Op::Request),
        r(5_000, 2, Op::Grant { token: 11 }),
    ];
    assert_eq!(check(&h, 1_000).slow_recoveries, 1);
    assert_eq!(check(&h, 10_000).slow_recoveries, 0);
    // A second fault before the next grant: not held to one fault's bound.
    let mut two = h.clone();
    two.insert(
        4,
        r(
            4,
            3,
            Op::FaultStart {
                fault: "pause".into(),
            },
        ),
    );
    let f = check(&two, 1_000);
    assert_eq!((f.slow_recoveries, f.compound_faults), (0, 1), "{f:?}");
}

#[test]
fn a_hold_adds_its_length_to_the_bound() {
    let with = |fault: &str| {
        vec![
            r(0, 1, Op::Request),
            r(1, 1, Op::Grant { token: 10 }),
            r(
                2,
                1,
                Op::FaultStart {
                    fault: fault.into(),
                },
            ),
            r(
                3_002,
                1,
                Op::FaultEnd {
                    fault: fault.into(),
                },
            ),
            r(3_100, 1, Op::Lost),
            r(3_200, 2, Op::Request),
            r(4_000, 2, Op::Grant { token: 11 }),
        ]
    };
    // 4 ms after a hold of 3 ms: within 1 ms after it.
    assert_eq!(check(&with("hold"), 1_000).slow_recoveries, 0);
    assert_eq!(check(&with("delay"), 1_000).slow_recoveries, 0);
    assert_eq!(check(&with("hold"), 900).slow_recoveries, 1);
    // A partition drops what it holds: no more time.
    assert_eq!(check(&with("partition"), 1_000).slow_recoveries, 1);
}

#[test]
fn a_recovery_past_the_stated_bound_is_counted_and_within_the_allowance_passes() {
    // Killed at 2, the next grant at 4 000: 3 998 after the fault.
    let h = vec![
        r(0, 1, Op::Request),
        r(1, 1, Op::Grant { token: 10 }),
        r(
            2,
            1,
            Op::FaultStart {
                fault: "kill".into(),
            },
        ),
        r(3_200, 2, Op::Request),
        r(4_000, 2, Op::Grant { token: 11 }),
    ];
    let within = check_with_allowance(&h, 3_000, 1_000);
    assert_eq!(
        (within.recoveries_over_stated, within.slow_recoveries),
        (1, 0)
    );
    let strict = check_with_allowance(&h, 3_000, 0);
    assert_eq!(
        (strict.recoveries_over_stated, strict.slow_recoveries),
        (1, 1)
    );
    let quiet = check_with_allowance(&h, 4_000, 0);
    assert_eq!(
        (quiet.recoveries_over_stated, quiet.slow_recoveries),
        (0, 0)
    );
}

#[test]
fn a_fault_in_force_when_another_begins_delays_its_clock() {
    // A server fault (no worker) from 1 to 3 000 µs; worker 1, holding,
    // is killed at 2; worker 2 is granted at 3 900: 3 898 after the kill,
    // 900 after the server came back.
    let h = vec![
        r(0, 1, Op::Request),
        r(1, 1, Op::Grant { token: 10 }),
        Record {
            at_us: 1,
            worker: None,
            shard: None,
            op: Op::FaultStart {
                fault: "nemesis".into(),
            },
        },
        r(
            2,
            1,
            Op::FaultStart {
                fault: "kill".into(),
            },
        ),
        r(3, 1, Op::Exit),
        Record {
            at_us: 3_000,
            worker: None,
            shard: None,
            op: Op::FaultEnd {
                fault: "nemesis".into(),
            },
        },
        r(3_100, 2, Op::Request),
        r(3_900, 2, Op::Grant { token: 11 }),
    ];
    let f = check(&h, 1_000);
    assert_eq!((f.slow_recoveries, f.compound_faults), (0, 0), "{f:?}");
    assert!((f.worst_recovery_ms - 0.9).abs() < 1e-9, "{f:?}");
    // Without the server's fault, the same grant is late.
    let alone: Vec<Record> = h.iter().filter(|r| r.worker.is_some()).cloned().collect();
    assert_eq!(check(&alone, 1_000).slow_recoveries, 1);
}

#[test]
fn histories_round_trip_as_json_lines() {
    let h = cycle(0, 1, 10, 0);
    for rec in &h {
        let line = serde_json::to_string(rec).unwrap();
        let back: Record = serde_json::from_str(&line).unwrap();
        assert_eq!(&back, rec);
    }
}

fn on(shard: u32, rec: Record) -> Record {
    Record {
        shard: Some(shard),
        ..rec
    }
}

/// Shards: each shard is checked as a lock (an overlap of two owners
/// of one shard is a violation, two owners of two shards are not), and
/// a shard lost with its owner is measured to its next grant, to
/// anyone, while a handover (a release) is not a recovery.
#[test]
fn shards_are_checked_one_by_one() {
    let kill = |at, w| {
        r(
            at,
            w,
            Op::FaultStart {
                fault: "kill".into(),
            },
        )
    };
    let killed = |at, w| {
        r(
            at,
            w,
            Op::FaultEnd {
                fault: "kill".into(),
            },
        )
    };
    let mut h = vec![
        on(0, r(0, 1, Op::Grant { token: 1 })),
        on(1, r(1, 2, Op::Grant { token: 1 })),
        // Worker 1 killed: shard 0 is owned again 2 000 µs later by
        // worker 1's next life.
        kill(100, 1),
        r(101, 1, Op::Exit),
        killed(101, 1),
        on(0, r(2_100, 1, Op::Grant { token: 2 })),
        // Shard 1 handed over: not a recovery, however late.
        kill(3_000, 2),
        on(1, r(3_001, 2, Op::Release)),
        r(3_002, 2, Op::Exit),
        killed(3_002, 2),
        on(1, r(9_000, 1, Op::Grant { token: 2 })),
    ];
    let f = check_shards(&h, 2_500, 0);
    assert_eq!(f.grants, 4);
    assert_eq!(f.faults, 2);
    assert_eq!(f.overlaps_unpaused, 0);
    assert_eq!(f.slow_recoveries, 0, "{f:?}");
    assert_eq!(f.worst_recovery_ms, 2.0);
    // Lost instead of released: now a recovery of 6 ms, over the bound.
    h[7] = on(1, r(3_001, 2, Op::Lost));
    let f = check_shards(&h, 2_500, 0);
    assert_eq!(f.slow_recoveries, 1, "{f:?}");
    // Two owners of shard 0 at once: a violation; of two shards: not.
    let h = vec![
        on(0, r(0, 1, Op::Grant { token: 1 })),
        on(1, r(1, 2, Op::Grant { token: 1 })),
        on(0, r(2, 2, Op::Grant { token: 2 })),
        on(0, r(10, 1, Op::Release)),
        on(0, r(11, 2, Op::Release)),
        on(1, r(12, 2, Op::Release)),
    ];
    let f = check_shards(&h, 2_500, 0);
    assert_eq!(f.overlaps_unpaused, 1, "{f:?}");
    assert!(f.explained[0].starts_with("shard 0:"), "{:?}", f.explained);
}
