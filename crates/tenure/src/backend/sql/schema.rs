//! Creating the schema once, or upgrading it, under a lock, through a
//! database's [`SqlSchema`].

use async_trait::async_trait;

use crate::error::{Error, Result};

/// How a database keeps its schema, for `ensure_schema`.
#[async_trait]
pub trait SqlSchema: Send + Sync {
    /// The schema version recorded, or `None` before the first user.
    async fn stored_version(&mut self) -> Result<Option<String>>;
    /// Takes the lock that serializes schema work among first users.
    async fn lock(&mut self) -> Result<()>;
    /// Creates the tables and routines (an upgrade rewrites them) and
    /// records `version`, under the lock.
    async fn apply(&mut self, version: &str) -> Result<()>;
    /// Gives the lock back (committing what `apply` did).
    async fn unlock(&mut self) -> Result<()>;
    /// Whether what this build's format adds beside the recorded version
    /// (tables older builds neither read nor write) is there (by default
    /// there is nothing to add).
    async fn additions_present(&mut self) -> Result<bool> {
        Ok(true)
    }
    /// Creates those additions (idempotently), under the lock.
    async fn add_additions(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Creates what this build's format adds beside the recorded version, once,
/// under the schema's lock. The recorded version stays what older builds
/// require, so they keep working beside this one.
pub(crate) async fn ensure_additions(schema: &mut dyn SqlSchema) -> Result<()> {
    if schema.additions_present().await? {
        return Ok(());
    }
    schema.lock().await?;
    let result = async {
        if !schema.additions_present().await? {
            schema.add_additions().await?;
        }
        Ok(())
    }
    .await;
    let unlocked = schema.unlock().await;
    result.and(unlocked)
}

/// Creates the schema once, or upgrades one of a version in `upgrades_from`,
/// under a lock so that concurrent first users do not race. A newer schema
/// is never rewritten: it is an [`Error::SchemaMismatch`], as is any other.
pub(crate) async fn ensure_schema(
    schema: &mut dyn SqlSchema,
    version: &str,
    finished: &str,
    upgrades_from: &[&str],
    mismatch: impl Fn(&str) -> Error,
) -> Result<()> {
    // `finished`: the marker once an upgrade to this build's format is
    // finished (older builds refuse it); as current as `version`.
    let current = |v: &Option<String>| match v {
        Some(v) if v == version || v == finished => Ok(true),
        Some(v) if upgrades_from.contains(&v.as_str()) => Ok(false),
        Some(v) => Err(mismatch(v)),
        None => Ok(false),
    };
    if current(&schema.stored_version().await?)? {
        return Ok(());
    }
    schema.lock().await?;
    let result = async {
        // Read again under the lock: another user may have just done it.
        if !current(&schema.stored_version().await?)? {
            schema.apply(version).await?;
        }
        Ok(())
    }
    .await;
    let unlocked = schema.unlock().await;
    result.and(unlocked)?;
    match schema.stored_version().await? {
        Some(v) if v == version || v == finished => Ok(()),
        other => Err(mismatch(other.as_deref().unwrap_or("none"))),
    }
}
