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

/// Time since boot, counting suspend (`CLOCK_BOOTTIME`). Elsewhere than Linux,
/// the wall clock since the Unix epoch.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn boot_time() -> Duration {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(d) = read(libc::CLOCK_BOOTTIME) {
        return d;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
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
