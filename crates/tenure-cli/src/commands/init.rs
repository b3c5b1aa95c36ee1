//! `tenure init`: declares a new store new, once, before its first use.

use std::sync::Arc;

use tenure::Store;

use crate::exit::Failure;
use crate::output::escape_line;

pub(super) async fn run(store: Arc<dyn Store>) -> Result<u8, Failure> {
    let changed = store.declare_new().await?;
    if changed.is_empty() {
        outln!(
            "nothing to do: {} keeps what it holds",
            store.capabilities().backend
        );
    }
    for change in &changed {
        outln!("{}", escape_line(change));
    }
    Ok(0)
}
