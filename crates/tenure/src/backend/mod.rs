//! One module per backend, each behind its cargo feature.

// The shared helpers serve several backends each; with some features off,
// parts of them go unused (the full build, which CI lints, uses them all).
#![cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "redis",
        feature = "redlock",
        feature = "postgres",
        feature = "mysql",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]

/// `Debug` for a store: its type and the named fields of its `inner` (the
/// URL is kept with its password masked).
#[allow(unused_macros)] // only the server backends use it
macro_rules! store_debug {
    ($store:ident: $($field:ident),+) => {
        impl std::fmt::Debug for $store {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($store))
                    $(.field(stringify!($field), &self.inner.$field))+
                    .finish()
            }
        }
    };
}

mod codec;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
mod poll;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub mod url;
