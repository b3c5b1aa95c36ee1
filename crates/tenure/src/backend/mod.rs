//! One module per backend, each behind its cargo feature.

pub mod memory;
#[cfg(feature = "sqlite")]
pub mod sqlite;
