//! `tenure torture` and its hidden `torture-worker`: the harness and its
//! workers are the `torture` module; this maps their errors to exit codes.

use std::sync::Arc;

use tenure::Store;

use crate::exit::{self, Failure};
use crate::torture::{self, TortureArgs, WorkerArgs};

pub(super) async fn run(
    store: Arc<dyn Store>,
    url: &str,
    args: TortureArgs,
) -> Result<u8, Failure> {
    torture::run(store, url, args)
        .await
        .map_err(|m| Failure::new(exit::USAGE, m))
}

pub(super) async fn worker(store: Arc<dyn Store>, args: WorkerArgs) -> Result<u8, Failure> {
    torture::worker(store, args)
        .await
        .map_err(|m| Failure::new(exit::SOFTWARE, m))
}
