//! The part of etcd's v3 gRPC API that tenure speaks, written out by hand.
//!
//! Why not the `etcd-client` crate: its build script compiles etcd's `.proto`
//! files and so needs `protoc` on every machine that builds tenure. Here the
//! messages are `prost` structs with etcd's field numbers, only the fields
//! tenure reads or sends (protobuf skips the others when decoding), and the
//! calls go through `tonic`'s generic client. Keeping it current means
//! nothing: etcd keeps its v3 wire format stable, and a field tenure starts to
//! use is one more line here, with the number from etcd's `rpc.proto`
//! (`api/etcdserverpb/rpc.proto`, `api/mvccpb/kv.proto`).
//!
//! The surface mirrors the calls `super` makes: [`Client`] with `get`, `txn`,
//! `lease_*` and `watch`, and the [`Txn`]/[`TxnOp`]/[`Compare`] builders.
//!
//! One file per gRPC service, each with its calls and, in its `pb` module,
//! etcd's messages for them (package `etcdserverpb`, and `mvccpb`'s two):
//! `kv.rs` (range reads and transactions), `lease.rs`, `watch.rs` and
//! `auth.rs`; `client.rs` is the channel they share.

mod auth;
mod client;
mod kv;
mod lease;
mod watch;

use tonic::Status;

#[cfg(feature = "tls")]
pub(super) use tonic::transport::{Certificate, ClientTlsConfig as TlsOptions};

pub(super) use client::{Client, ConnectOptions};
pub(super) use kv::{
    prefix_end, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
pub(super) use lease::{LeaseKeepAliveStream, LeaseKeeper};
pub(super) use watch::{EventType, WatchOptions};

pub(super) use kv::pb::KeyValue;
pub(super) use watch::pb::Event;

/// A failed call: a gRPC status, or a stream that ended.
#[derive(Debug)]
pub(super) enum Error {
    Status(Status),
    Transport(String),
    Stream(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Status(s) => write!(f, "{}: {}", s.code(), s.message()),
            Error::Transport(e) | Error::Stream(e) => f.write_str(e),
        }
    }
}

impl From<Status> for Error {
    fn from(s: Status) -> Self {
        Error::Status(s)
    }
}

type CallResult<T> = std::result::Result<T, Error>;
