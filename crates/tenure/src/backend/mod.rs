//! One module per backend, each behind its cargo feature.

// The shared helpers serve several backends each; with some features off,
// parts of them go unused (the full build, which CI lints, uses them all).

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

#[macro_use]
mod table;

pub use table::Backend;

stores! {
    shared {
        mod codec;
        mod poll;
        pub(crate) mod probe;
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        pub mod sql;
        pub mod url;
    }
    always { memory: "memory", ["memory", "mem"], "memory://", MemoryStore }
    sqlite: "sqlite", "sqlite", ["sqlite"], "sqlite:///var/lib/app/locks.db", SqliteStore;
    redis: "redis", "redis", ["redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"], "redis://:password@host:6379/0", RedisStore;
    redlock: "redlock", "redlock", ["redlock", "redlocks"], "redlock://h1:6379,h2:6379,h3:6379", RedlockStore;
    etcd: "etcd", "etcd", ["etcd", "etcds"], "etcd://host:2379,host:2379", EtcdStore;
    zookeeper: "zookeeper", "zookeeper", ["zk", "zookeeper", "zks"], "zk://host:2181,host:2181/app", ZkStore;
    postgres: "postgres", "postgres", ["postgres", "postgresql"], "postgres://user:password@host:5432/db", PostgresStore;
    mysql: "mysql", "mysql", ["mysql", "mariadb"], "mysql://user:password@host:3306/db", MysqlStore;
}
