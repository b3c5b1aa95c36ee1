//! One module per backend, each behind its cargo feature.

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
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub mod url;
