//! A server wall clock a test can step (libfaketime).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::missing;

/// A server's wall clock that a test can step, forward or back: the server
/// runs under libfaketime (Debian's `libfaketime`), which reads the offset
/// from a file at every clock call (`FAKETIME_NO_CACHE`). Only the wall
/// clock moves (`FAKETIME_DONT_FAKE_MONOTONIC`), as in an NTP step or an
/// operator's `date -s`. (`redis-server` crashes under libfaketime, and Go's
/// etcd ignores it.)
pub struct SteppableClock {
    file: PathBuf,
    library: PathBuf,
    offset_s: std::sync::atomic::AtomicI64,
}

impl SteppableClock {
    /// A clock file in `dir` at offset 0, or `None` (after [`missing`])
    /// without libfaketime.
    pub(crate) fn new(dir: &Path) -> Option<SteppableClock> {
        let library = std::fs::read_dir("/usr/lib")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("faketime/libfaketime.so.1"))
            .find(|p| p.exists());
        let Some(library) = library else {
            missing("libfaketime", "libfaketime");
            return None;
        };
        let clock = SteppableClock {
            file: dir.join("faketime"),
            library,
            offset_s: std::sync::atomic::AtomicI64::new(0),
        };
        clock.write(0);
        Some(clock)
    }

    fn write(&self, offset_s: i64) {
        // Written aside and renamed, so the server never reads half a line.
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset_s:+}\n")).expect("write the clock file");
        std::fs::rename(&tmp, &self.file).expect("move the clock file");
    }

    pub(crate) fn apply(&self, cmd: &mut Command) {
        cmd.env("LD_PRELOAD", &self.library)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }

    /// The file libfaketime reads the offset from (a line such as `+30`),
    /// for a test that steps the clock from another process.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Steps the server's wall clock by `seconds` (negative: back).
    pub fn step(&self, seconds: i64) {
        let now = self
            .offset_s
            .fetch_add(seconds, std::sync::atomic::Ordering::SeqCst)
            + seconds;
        self.write(now);
    }

    /// How far the server's wall clock is from this machine's, in seconds.
    pub fn offset(&self) -> i64 {
        self.offset_s.load(std::sync::atomic::Ordering::SeqCst)
    }
}
