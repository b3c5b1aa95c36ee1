//! `tenure backends`: what each built-in backend can do.

use crate::exit::Failure;

pub(super) fn run(json: bool) -> Result<u8, Failure> {
    let all = tenure::builtin_backends();
    if json {
        let rows: Vec<_> = all
            .iter()
            .map(|c| {
                serde_json::json!({
                    "backend": c.backend,
                    "fencing": c.fencing,
                    "durable": c.durable,
                    "multi_process": c.multi_process,
                    "fifo": c.fifo,
                    "shared": c.shared,
                    "permits": c.permits,
                    "grant_times": c.grant_times,
                    "expiry_times": c.expiry_times,
                    "exact_first": c.exact_first,
                    "fences": c.fences,
                    "fence_values": c.fence_values,
                    "cells": c.cells,
                    "wake": format!("{:?}", c.wake),
                    "clock": c.clock,
                    "min_ttl_ms": c.min_ttl.as_millis(),
                    "max_ttl_ms": c.max_ttl.as_millis(),
                    "round_trips": c.round_trips,
                    "barging_bound_ms": c.barging_bound.as_millis(),
                    "call_deadline_ms": c.call_deadline.as_millis(),
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(rows));
    } else {
        for c in &all {
            outln!("{}", describe(c));
        }
    }
    Ok(0)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// One backend in words (the JSON keeps the field names).
fn describe(c: &tenure::Capabilities) -> String {
    let wake = match c.wake {
        tenure::store::Wake::NextOnly => "the next in line only, directly".to_string(),
        tenure::store::Wake::LocalOrPoll { min, max } => format!(
            "the next in line directly in this process; across processes by polling, every {} to {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ),
        tenure::store::Wake::PubSub { fallback_poll } => format!(
            "the next in line only, by a notification from the store (polling at most every {} while notifications are down)",
            humantime::format_duration(fallback_poll)
        ),
        _ => format!("{:?}", c.wake),
    };
    let fences = match (c.fences, c.fence_values) {
        (true, true) => "yes, with a value kept beside each token",
        (true, false) => "yes",
        _ => "no",
    };
    [
        c.backend.to_string(),
        format!(
            "  survives a restart: {} · shared by several processes: {} · fencing tokens: {}",
            yes(c.durable),
            yes(c.multi_process),
            yes(c.fencing)
        ),
        format!(
            "  waiters granted in arrival order: {} · read/write locks: {} · semaphores: {}",
            yes(c.fifo),
            yes(c.shared),
            yes(c.permits)
        ),
        format!(
            "  fences checked by the store: {fences} · cells (and so pauses): {}",
            yes(c.cells)
        ),
        format!(
            "  when a grant began: {} · how long a session has left: {}",
            if c.grant_times { "known" } else { "not known" },
            if c.expiry_times { "known" } else { "not known" },
        ),
        format!(
            "  every tick a per-tick schedule claims in time runs: {}",
            if c.exact_first {
                "yes"
            } else {
                "no, one may be skipped (never run twice)"
            }
        ),
        format!("  waiters are woken: {wake}"),
        format!(
            "  a non-fair waiter is passed over for at most: {}, then served before later tries",
            humantime::format_duration(c.barging_bound)
        ),
        format!("  a lease's expiry is judged by: {}", c.clock),
        format!(
            "  TTL: from {} to {}",
            humantime::format_duration(c.min_ttl),
            humantime::format_duration(c.max_ttl)
        ),
        format!(
            "  cost of an uncontended lock and release: {}",
            c.round_trips
        ),
        format!(
            "  a call to a server that stops answering fails within: {}, retries included",
            humantime::format_duration(c.call_deadline)
        ),
    ]
    .join("\n")
}
