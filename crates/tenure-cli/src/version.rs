//! What `tenure --version` says: the release, the commit it was built from,
//! and the format of each store this build speaks (the version of what it
//! keeps there), so that during a rolling upgrade each host can say which
//! build it runs.

use std::sync::OnceLock;

/// The commit the binary was built from (see `build.rs`).
pub(crate) const COMMIT: &str = env!("TENURE_COMMIT");

/// `0.1.0 (commit 0123456789ab)`: what `-V` prints after the name.
pub(crate) fn short() -> &'static str {
    static SHORT: OnceLock<String> = OnceLock::new();
    SHORT.get_or_init(|| format!("{} (commit {COMMIT})", env!("CARGO_PKG_VERSION")))
}

/// [`short`], then the format of each store built in: what `--version`
/// prints after the name.
pub(crate) fn long() -> &'static str {
    static LONG: OnceLock<String> = OnceLock::new();
    LONG.get_or_init(|| {
        let formats: Vec<String> = tenure::backends()
            .iter()
            .filter_map(|b| b.format().map(|f| format!("{} {f}", b.name)))
            .collect();
        format!("{}\nstore formats: {}", short(), formats.join(", "))
    })
}
