//! The conformance suite on `sqlite://`, the embedded default.

mod conformance;

use std::sync::OnceLock;

/// One database file for the whole test binary, as several programs share one.
fn url() -> String {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"));
    format!("sqlite://{}", dir.path().join("conformance.db").display())
}

conformance_tests!(conformance::Target::new(url()));
