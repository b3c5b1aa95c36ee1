//! The machine clocks tenure relies on.
//!
//! Leases are timed with clocks that no one can set: `CLOCK_MONOTONIC`
//! (tokio's `Instant`) for a session's local deadline, and `CLOCK_BOOTTIME`
//! for the embedded SQLite store, which all processes of a machine share and
//! which, unlike the monotonic clock, keeps counting while the machine is
//! suspended. Neither jumps when the wall clock is set.

use std::time::Duration;

#[cfg(any(target_os = "linux", target_os = "android"))]
fn read(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec that we own.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

/// Time since boot, counting suspend (`CLOCK_BOOTTIME`), as the machine
/// counts it: a process in a time namespace of its own (`unshare -T
/// --boottime N`) reads its namespace's offset back out, so every process
/// of the machine agrees on it. Elsewhere than Linux, the wall clock since
/// the Unix epoch.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn boot_time() -> Duration {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(d) = read(libc::CLOCK_BOOTTIME) {
        let machine = d.as_nanos() as i128 - boot_time_offset_nanos();
        return Duration::from_nanos(u64::try_from(machine.max(0)).unwrap_or(u64::MAX));
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// This process's time namespace's `CLOCK_BOOTTIME` offset in nanoseconds
/// (`/proc/self/timens_offsets`; 0 without time namespaces). It is fixed for
/// the life of a process, so it is read once.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
fn boot_time_offset_nanos() -> i128 {
    static OFFSET: std::sync::OnceLock<i128> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::fs::read_to_string("/proc/self/timens_offsets")
            .ok()
            .and_then(|text| parse_boottime_offset(&text))
            .unwrap_or(0)
    })
}

/// The boottime line of `timens_offsets`: `boottime <seconds> <nanoseconds>`.
fn parse_boottime_offset(text: &str) -> Option<i128> {
    text.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        if f.next()? != "boottime" {
            return None;
        }
        let secs: i128 = f.next()?.parse().ok()?;
        let nanos: i128 = f.next()?.parse().ok()?;
        Some(secs * 1_000_000_000 + nanos)
    })
}

/// Whether this process could learn its time namespace's offset: where
/// `/proc/self/timens_offsets` exists, it must parse, or the machine's
/// boot time cannot be told and the SQLite store refuses to open.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn boot_time_known() -> bool {
    match std::fs::read_to_string("/proc/self/timens_offsets") {
        Ok(text) => parse_boottime_offset(&text).is_some(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// How much longer the machine has been up than the monotonic clock shows:
/// the time it spent suspended. Zero where that cannot be told.
pub(crate) fn suspended() -> Duration {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let (Some(boot), Some(mono)) = (read(libc::CLOCK_BOOTTIME), read(libc::CLOCK_MONOTONIC)) {
        return boot.saturating_sub(mono);
    }
    Duration::ZERO
}

/// This boot's identity, so a store can drop sessions of an earlier boot.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_boottime_offset() {
        let text = "monotonic           0         0\nboottime      -40  500000000\n";
        assert_eq!(parse_boottime_offset(text), Some(-39_500_000_000));
        assert_eq!(parse_boottime_offset("monotonic 1 0\n"), None);
    }
}
