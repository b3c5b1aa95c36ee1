#![doc = include_str!("docs.md")]
//!
//! # How this backend is built
//!
//! `etcd://[user:password@]host:port[,host:port…][?prefix=NAME]`: etcd v3,
//! the recipe of etcd's `concurrency` package over the tenure contract.
//!
//! - A session is a lease (TTL in whole seconds, rounded up) kept alive by
//!   [`Store::keep_alive`] over one keep-alive stream per lease. Its secret
//!   lives in a key of the lease, and every write compares it in the same
//!   transaction, so only the session's owner can act for it. Its public
//!   tag is in `PREFIX/si/<lease>`, so ending one session by its tag is
//!   revoking the lease of the info key that has it.
//! - A name's queue is the keys `PREFIX/n/NAME\0q<lease>` (one per session,
//!   attached to its lease), ordered by create revision; the create revision
//!   is the fencing token (etcd's revision never goes back, across restarts
//!   and leader changes). Grants follow [`crate::queue::grants`]. A reentrant
//!   hold count above one lives in `PREFIX/n/NAME\0h<lease>`.
//! - Joining is one transaction: compare the secret and that the session has
//!   no entry, put the entry, and read the queue back (a try-lock of an
//!   exclusive entry also compares that the queue is empty). Releasing is one
//!   transaction that compares the entry's create revision, so a release can
//!   never delete a newer acquisition (etcd #22082).
//! - A waiter watches only the entry whose deletion can grant it (the one
//!   just ahead for a mutex, the last writer ahead for a reader; a semaphore
//!   waiter watches its queue) and its own entry; after each wake-up it reads
//!   the queue again, linearizably, and finds its own entry there or reports
//!   the loss: a grant is never reported for an entry whose lease is gone.
//! - Fences and cells share `PREFIX/r/NAME`, which says what the name is
//!   (`c` for a cell; `f` and the highest token admitted, as 20 zero-padded
//!   digits so that etcd's byte-wise value compares order tokens as
//!   numbers) and is never deleted, so a name stays a fence or a cell. The
//!   value is `PREFIX/v/NAME` (a bound cell's on its owner's lease); a
//!   cell's version is that key's mod revision, which etcd never reuses, not
//!   even after a delete or an expiry. Every operation is one transaction,
//!   so one round trip: a read gets both keys; an admit compares the token
//!   with the mark (`f` < mark < the token's own mark followed by one byte)
//!   and a cell write compares the kind, the value key's create or mod
//!   revision and, when bound, the owner's secret. A name never used is
//!   taken in the same transaction: its compares fail on a missing key, so
//!   they sit in a nested transaction (etcd ≥ 3.3) under an outer compare
//!   that the kind key does not exist.

mod connect;
mod join;
mod layout;
mod leave;
mod queue;
mod registers;
mod rpc;
mod session;
mod store;
#[cfg(test)]
mod tests;
mod watch;

use std::time::Duration;

use super::url::UrlRules;
use crate::store::Capabilities;
#[cfg(doc)]
use crate::store::Store;
// What the files below share: how a call is bounded and its failures
// read, and the parts of a session key.
use connect::{bad, call, etcd_err, lease_not_found, lost};
use layout::{split_key, Layout};

pub use connect::EtcdStore;

const BACKEND: &str = "etcd";
/// Bound on every unary call (watches are not bounded).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts of a compare-and-swap that lost a race with another writer.
const CAS_ATTEMPTS: usize = 16;

/// The version of this build's key layout (its *format*): 2, format 1
/// (which builds of 0.1.0 read and write; etcd keeps no marker of it) and
/// beside it `PREFIX/sb/<lease>`, the build that opened each session.
pub(crate) const FORMAT: &str = "2";

/// etcd speaks gRPC over HTTP/2: the client's preface and an empty SETTINGS
/// frame are answered with the server's SETTINGS frame (type 4).
pub(crate) const GREETING: Option<&crate::backend::probe::Greeting> =
    Some(&crate::backend::probe::Greeting {
        protocol: "etcd's gRPC",
        hello: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        answers: |b| b.get(3) == Some(&4),
        tls_schemes: &["etcds"],
    });

/// How this backend reads its URL (the one parser: [`super::url`]).
pub(crate) const URL: UrlRules = UrlRules::servers(&["prefix", "tls_ca", "layout"]);

/// The etcd backend's capabilities.
pub fn capabilities() -> Capabilities {
    Capabilities {
        // About one and a half times the longest wait (p99) of 16 fair
        // contenders on this store in the cycle bench: a waiter is passed
        // over for about as long as a fair lock would keep it waiting.
        barging_bound: Duration::from_millis(150),
        min_ttl: Duration::from_secs(2),
        grant_times: false,
        ..Capabilities::durable_store(
            BACKEND,
            "etcd's lease clock (the raft leader's), TTL in whole seconds",
            "acquire: 1 (txn; a try-lock 2: a read, then the txn if the queue looked empty), release: 1 (txn), renew: 1 (lease keep-alive), fence/cell: 1 (txn)",
        )
    }
}

/// The capabilities of a store with `layout`.
fn capabilities_of(layout: Layout) -> Capabilities {
    match layout {
        Layout::Tenure => capabilities(),
        Layout::Etcd => Capabilities {
            shared: false,
            permits: false,
            ..capabilities()
        },
    }
}
