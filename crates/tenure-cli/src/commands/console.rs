//! `tenure console`: a live web page of the store, with an HTTP API (the
//! server itself is the `console` module).

use std::sync::Arc;

use tenure::Store;

use crate::console::{self, ConsoleArgs};
use crate::exit::Failure;

pub(super) async fn run(
    store: Arc<dyn Store>,
    url: &str,
    args: ConsoleArgs,
) -> Result<u8, Failure> {
    let cx = console::Context {
        store,
        store_url: tenure::mask_password(url),
    };
    console::run(cx, args)
        .await
        .map_err(|(code, message)| Failure::new(code, message))
}
