//! `tenure fence NAME TOKEN`: admit a fencing token, or refuse a stale one.

use std::sync::Arc;

use clap::Args;
use tenure::{Error, Name, Store};

use super::{positive, register_failure};
use crate::exit::{self, Failure};

#[derive(Args, Debug)]
pub(crate) struct FenceArgs {
    /// The fence's name (usually the lock's).
    name: String,
    /// The fencing token, a positive integer (a grant's TENURE_FENCE).
    token: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Checks the name and the token before the store is opened.
pub(super) fn validate(args: &FenceArgs) -> Result<(), Failure> {
    Name::new(&args.name)?;
    positive("TOKEN", &args.token).map(|_| ())
}

pub(super) async fn run(store: Arc<dyn Store>, args: FenceArgs) -> Result<u8, Failure> {
    let token = positive("TOKEN", &args.token)?;
    let fence = tenure::Fence::new(&store, &args.name)?;
    let (admitted, highest) = match fence.admit(token).await {
        Ok(highest) => (true, highest),
        Err(Error::StaleToken { highest, .. }) => (false, highest),
        Err(e) => return Err(register_failure(e)),
    };
    if args.json {
        outln!(
            "{}",
            serde_json::json!({
                "fence": fence.name().as_str(),
                "token": token,
                "admitted": admitted,
                "highest": highest,
            })
        );
    } else {
        let word = if admitted { "admitted" } else { "stale" };
        outln!("{word} token={token} highest={highest}");
    }
    if admitted {
        Ok(0)
    } else {
        eprintln!(
            "tenure: fence {} refused token {token}: it has seen {highest}, so a later holder \
             has used it",
            fence.name()
        );
        Ok(exit::NOT_ACQUIRED)
    }
}
