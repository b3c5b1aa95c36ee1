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
                    "exact_first": c.exact_first,
                    "fences": c.fences,
                    "fence_values": c.fence_values,
                    "cells": c.cells,
                    "wake": format!("{:?}", c.wake),
                    "clock": c.clock,
                    "min_ttl_ms": c.min_ttl.as_millis(),
                    "max_ttl_ms": c.max_ttl.as_millis(),
                    "round_trips": c.round_trips,
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(rows));
    } else {
        for c in &all {
            outln!("{}", c.backend);
            outln!(
                "  fencing={} durable={} multi_process={} fifo={} shared={} permits={} grant_times={} exact_first={}",
                c.fencing, c.durable, c.multi_process, c.fifo, c.shared, c.permits, c.grant_times, c.exact_first
            );
            outln!(
                "  fences={} fence_values={} cells={}",
                c.fences,
                c.fence_values,
                c.cells
            );
            outln!("  wake: {:?}", c.wake);
            outln!("  clock: {}", c.clock);
            outln!("  ttl: {:?}..={:?}", c.min_ttl, c.max_ttl);
            outln!("  cost: {}", c.round_trips);
        }
    }
    Ok(0)
}
