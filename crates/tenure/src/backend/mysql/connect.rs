//! Connecting: the URL (our `prefix` option, the MySQL client's TLS
//! options, the rest as mysql_async reads them), the pool's connections,
//! and the server's errors as tenure's.

use std::time::Duration;

use super::{Mysql, BACKEND};
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// What the server said: its message, its error number and the SQLSTATE
/// (the client's own words put them the other way round, quoted, after
/// "Server error").
fn server_words(s: &mysql_async::ServerError) -> String {
    format!("{} (error {}, SQLSTATE {})", s.message, s.code, s.state)
}

pub(super) fn my_err(e: mysql_async::Error) -> Error {
    match &e {
        mysql_async::Error::Server(s) if s.code == 1045 || s.code == 1044 => Error::Auth {
            backend: BACKEND,
            reason: server_words(s),
        },
        // Rolled back or refused: the call took no effect.
        mysql_async::Error::Server(s) if matches!(s.code, 1205 | 1213 | 1040 | 1053) => {
            Error::refused(BACKEND, server_words(s))
        }
        mysql_async::Error::Server(s) => Error::backend(BACKEND, server_words(s)),
        // A certificate that is not trusted, or names another host: trying
        // again does not help.
        #[cfg(feature = "tls")]
        mysql_async::Error::Io(mysql_async::IoError::Tls(t)) => {
            Error::backend(BACKEND, format!("TLS: {t}"))
        }
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => Error::unavailable(BACKEND, e),
        _ => Error::backend(BACKEND, e),
    }
}

pub(super) fn is_retryable(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if s.code == 1213 || s.code == 1205)
}

pub(super) fn parse_url(url: &StoreUrl) -> Result<(mysql_async::Opts, String)> {
    let prefix = match url.option("prefix") {
        None => "tenure_",
        Some(v) => {
            let ok = !v.is_empty()
                && v.len() <= 32
                && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(url.invalid(format!(
                    "prefix must be 1-32 of A-Z, a-z, 0-9 and _, not {v:?}"
                )));
            }
            v
        }
    };
    // mysql_async knows only mysql://, also for MariaDB.
    let cleaned = format!(
        "mysql://{}{}{}{}",
        url.userinfo_encoded(),
        url.authority(),
        url.path(),
        url.driver_query(&["prefix", "ssl-mode", "ssl-ca"])
    );
    let opts = mysql_async::Opts::from_url(&cleaned).map_err(|e| url.invalid(e.to_string()))?;
    // No reset when a connection goes back to the pool: a reset is one more
    // round trip and drops the connection's prepared statements, so every
    // CALL was prepared again; with it a lock + release cost MariaDB 2.4
    // times the CPU (1.77 against 0.71 ms, one bench run). What a
    // connection keeps between calls is harmless: every path of every
    // procedure ends the transaction it starts with COMMIT or ROLLBACK
    // (which the one-statement take and release rely on to commit)
    // (the driver cannot see one opened inside a procedure, so that rule
    // is what keeps a pooled connection clean; a call cut off midway
    // drops its connection), and `group_concat_max_len`, raised by the
    // procedures that list a queue, stays raised. The schema's connection,
    // which takes a named lock, is reset on its own.
    let pool = opts.pool_opts().clone().with_reset_connection(false);
    let opts: mysql_async::Opts = mysql_async::OptsBuilder::from_opts(opts)
        .ssl_opts(ssl_opts(url)?)
        .pool_opts(pool)
        .into();
    if opts.db_name().is_none() {
        return Err(url.invalid("no database: use mysql://user:password@host:port/DATABASE"));
    }
    Ok((opts, prefix.to_string()))
}

/// TLS as the MySQL client's own options say (`ssl-mode`, `ssl-ca`):
/// DISABLED (the default), REQUIRED (encrypted, the certificate not
/// checked), VERIFY_CA (signed by `ssl-ca` or a system root), or
/// VERIFY_IDENTITY (that, and for this host). PREFERRED, which falls back to
/// plain text without a word, is refused.
fn ssl_opts(url: &StoreUrl) -> Result<Option<mysql_async::SslOpts>> {
    let mode = url
        .option("ssl-mode")
        .map(str::to_ascii_uppercase)
        .unwrap_or_else(|| "DISABLED".into());
    let ca = url.option("ssl-ca");
    if let Some(ca) = ca {
        if std::fs::metadata(ca).is_err() {
            return Err(url.invalid(format!("ssl-ca={ca:?} is not a readable file")));
        }
    }
    let checked = |verify_host: bool| -> Result<Option<mysql_async::SslOpts>> {
        if !cfg!(feature = "tls") {
            return Err(Error::BackendDisabled {
                backend: "mysql over TLS",
                feature: "tls",
            });
        }
        let mut ssl = mysql_async::SslOpts::default();
        if let Some(ca) = ca {
            ssl = ssl.with_root_certs(vec![std::path::PathBuf::from(ca).into()]);
        }
        Ok(Some(ssl.with_danger_skip_domain_validation(!verify_host)))
    };
    match mode.as_str() {
        "DISABLED" => Ok(None),
        "REQUIRED" => checked(false).map(|ssl| {
            ssl.map(|s| s.with_danger_accept_invalid_certs(true))
        }),
        "VERIFY_CA" => checked(false),
        "VERIFY_IDENTITY" => checked(true),
        "PREFERRED" => Err(url.invalid(
            "ssl-mode=PREFERRED falls back to plain text silently: choose REQUIRED, VERIFY_CA, VERIFY_IDENTITY or DISABLED",
        )),
        other => Err(url.invalid(format!(
            "ssl-mode={other:?}: one of DISABLED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY"
        ))),
    }
}

impl Mysql {
    pub(super) async fn conn(&self) -> Result<mysql_async::Conn> {
        tokio::time::timeout(CONNECT_TIMEOUT, self.inner.pool.get_conn())
            .await
            .map_err(|_| Error::unavailable(BACKEND, "connect timed out"))?
            .map_err(my_err)
    }
}
