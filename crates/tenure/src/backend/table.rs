//! The type of the table of stores (the rows are in `backend/mod.rs`, where
//! each store's module is declared with its row).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::backend::url::{StoreUrl, UrlRules};
use crate::error::Result;
use crate::store::{Capabilities, Store};

pub(crate) type Opening = Pin<Box<dyn Future<Output = Result<Arc<dyn Store>>> + Send>>;

/// One backend: how URLs name it and, when built in, how to open it.
#[derive(Clone, Copy)]
pub struct Backend {
    /// The backend's name, as [`Capabilities::backend`] gives it.
    pub name: &'static str,
    /// The URL schemes that pick it; the first is the usual one.
    pub schemes: &'static [&'static str],
    /// The cargo feature of the `tenure` crate that builds it in (empty for
    /// one that is always built in).
    pub feature: &'static str,
    /// An example URL.
    pub example: &'static str,
    pub(crate) built: Option<Built>,
}

/// What a built-in backend gives the registry.
#[derive(Clone, Copy)]
pub(crate) struct Built {
    pub(crate) capabilities: fn() -> Capabilities,
    pub(crate) url: &'static UrlRules,
    pub(crate) open: fn(StoreUrl) -> Opening,
    /// The version of what this build keeps in the store ("" for one that
    /// keeps nothing across processes).
    pub(crate) format: &'static str,
    /// The first exchange of its protocol, for a server store: what the
    /// registry sends when a URL fails to open, to tell a server of
    /// another kind apart.
    pub(crate) greeting: Option<&'static crate::backend::probe::Greeting>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .field("built_in", &self.built.is_some())
            .finish()
    }
}

/// The table: every store's module, declared behind its cargo feature, and
/// its row; and the modules the stores share, whose parts some stores leave
/// unused when their features are off (the full build, which CI lints, uses
/// them all, so those lints are allowed only when a store is off).
macro_rules! stores {
    (
        shared { $($shared:tt)* }
        always { $always:ident: $always_name:literal, [$($always_scheme:literal),+], $always_example:literal, $always_store:ident }
        $($module:ident: $name:literal, $feature:literal, [$($scheme:literal),+], $example:literal, $store:ident;)*
    ) => {
        stores!(@shared [$($feature),*] $($shared)* pub mod $always;);
        stores!(@stores [$($feature),*] $($module $feature;)*);

        /// Every store tenure knows, built in or not, in the order `tenure
        /// backends` shows them.
        pub(crate) static STORES: &[table::Backend] = &[
            table::Backend {
                name: $always_name,
                schemes: &[$($always_scheme),+],
                feature: "",
                example: $always_example,
                built: Some(table::Built {
                    capabilities: $always::capabilities,
                    url: &$always::URL,
                    open: |url| Box::pin(async move {
                        let store = $always::$always_store::open_url(url)?;
                        Ok(std::sync::Arc::new(store) as std::sync::Arc<dyn crate::store::Store>)
                    }),
                    format: "",
                    greeting: None,
                }),
            },
            $(table::Backend {
                name: $name,
                schemes: &[$($scheme),+],
                feature: $feature,
                example: $example,
                #[cfg(feature = $feature)]
                built: Some(table::Built {
                    capabilities: $module::capabilities,
                    url: &$module::URL,
                    open: |url| Box::pin(async move {
                        let store = $module::$store::open_url(url).await?;
                        Ok(std::sync::Arc::new(store) as std::sync::Arc<dyn crate::store::Store>)
                    }),
                    format: $module::FORMAT,
                    greeting: $module::GREETING,
                }),
                #[cfg(not(feature = $feature))]
                built: None,
            },)*
        ];
    };
    (@shared [$($all:literal),*]) => {};
    (@shared [$($all:literal),*] $(#[$attr:meta])* $vis:vis mod $module:ident; $($rest:tt)*) => {
        $(#[$attr])*
        #[cfg_attr(not(all($(feature = $all),*)), allow(dead_code, unused_imports))]
        $vis mod $module;
        stores!(@shared [$($all),*] $($rest)*);
    };
    (@stores [$($all:literal),*]) => {};
    (@stores [$($all:literal),*] $module:ident $feature:literal; $($rest:tt)*) => {
        #[cfg(feature = $feature)]
        #[cfg_attr(not(all($(feature = $all),*)), allow(dead_code, unused_imports))]
        pub mod $module;
        stores!(@stores [$($all),*] $($rest)*);
    };
}
