//! Connecting: the URL (our `schema` option, libpq's TLS options, the rest
//! as libpq reads them), TLS, the server's errors as tenure's, and the
//! live connection with its statements, reconnected when lost.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;
#[cfg(not(feature = "tls"))]
use tokio_postgres::NoTls;

use super::schema::{PgSchema, SCHEMA_VERSION, UPGRADES_FROM};
use super::statements::Statements;
use super::{Postgres, BACKEND, CONNECT_TIMEOUT};
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

/// A live connection with its prepared statements.
#[derive(Clone)]
pub(super) struct Connected {
    pub(super) client: Arc<Client>,
    pub(super) stmts: Arc<Statements>,
    /// Set when a statement on it went unanswered: the next call opens
    /// another connection.
    pub(super) given_up: Arc<std::sync::atomic::AtomicBool>,
}

/// What the server said: its message, the SQLSTATE, and its detail and
/// hint when it gave them (the client's own `Display` is only "db error").
/// Without a server's answer, the client's words and their cause.
fn server_words(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return match std::error::Error::source(e) {
            Some(cause) if !e.to_string().contains(&cause.to_string()) => format!("{e}: {cause}"),
            _ => e.to_string(),
        };
    };
    let mut words = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        words.push_str(&format!("; detail: {detail}"));
    }
    if let Some(hint) = db.hint() {
        words.push_str(&format!("; hint: {hint}"));
    }
    words
}

pub(super) fn pg_err(e: tokio_postgres::Error) -> Error {
    use tokio_postgres::error::SqlState;
    if let Some(code) = e.code() {
        if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            return Error::Auth {
                backend: BACKEND,
                reason: e
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_default(),
            };
        }
        if *code == SqlState::INVALID_CATALOG_NAME {
            // The URL names a database the server does not have.
            return Error::InvalidArgument {
                what: "database in the store URL",
                reason: e
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_else(|| "it does not exist".into()),
            };
        }
        if *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS
        {
            // Rolled back or refused: the call took no effect.
            return Error::refused(BACKEND, server_words(&e));
        }
        return Error::backend(BACKEND, server_words(&e));
    }
    // A failed TLS handshake (a certificate not trusted, say) will not heal
    // by retrying: say so, with the reason.
    if e.to_string().contains("TLS") {
        let reason = std::error::Error::source(&e)
            .map(|s| format!("{e}: {s}"))
            .unwrap_or_else(|| e.to_string());
        return Error::backend(BACKEND, reason);
    }
    // No SQLSTATE: the connection itself failed.
    Error::unavailable(BACKEND, e)
}

pub(super) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

/// libpq's `sslmode`, which tokio-postgres knows only in part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// TLS as the URL asks for it: libpq's meaning of `sslmode` and
/// `sslrootcert` (prefer and require encrypt without checking the
/// certificate, unless a root certificate is given; verify-ca checks the
/// chain; verify-full also the host name).
#[derive(Debug, Clone)]
pub(super) struct TlsChoice {
    mode: SslMode,
    /// Read only with the `tls` feature (without it, TLS is refused).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    root_cert: Option<String>,
}

#[cfg(feature = "tls")]
pub(super) type Tls = postgres_native_tls::MakeTlsConnector;
#[cfg(not(feature = "tls"))]
pub(super) type Tls = NoTls;
type PgConnection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <Tls as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

#[cfg(feature = "tls")]
pub(super) fn make_tls(url: &StoreUrl, choice: &TlsChoice) -> Result<Tls> {
    let mut builder = native_tls::TlsConnector::builder();
    let check_chain = matches!(choice.mode, SslMode::VerifyCa | SslMode::VerifyFull)
        || choice.root_cert.is_some();
    if !check_chain {
        builder.danger_accept_invalid_certs(true);
    }
    if choice.mode != SslMode::VerifyFull {
        builder.danger_accept_invalid_hostnames(true);
    }
    if let Some(path) = &choice.root_cert {
        let bad = |reason: String| url.invalid(format!("sslrootcert={path}: {reason}"));
        let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let cert = native_tls::Certificate::from_pem(&pem).map_err(|e| bad(e.to_string()))?;
        builder.add_root_certificate(cert);
    }
    let connector = builder
        .build()
        .map_err(|e| Error::backend(BACKEND, format!("TLS set-up: {e}")))?;
    Ok(postgres_native_tls::MakeTlsConnector::new(connector))
}

#[cfg(not(feature = "tls"))]
pub(super) fn make_tls(_url: &StoreUrl, choice: &TlsChoice) -> Result<Tls> {
    match choice.mode {
        SslMode::Disable | SslMode::Prefer => Ok(NoTls),
        _ => Err(Error::Unsupported {
            backend: BACKEND,
            what: "TLS (sslmode=require and stricter) without the cargo feature `tls`",
        }),
    }
}

/// Takes our `schema` option and libpq's TLS options, and parses the rest
/// as libpq does.
pub(super) fn parse_url(url: &StoreUrl) -> Result<(tokio_postgres::Config, String, TlsChoice)> {
    let schema = match url.option("schema") {
        None => "tenure",
        Some(v) => {
            let ok = !v.is_empty()
                && v.len() <= 40
                && v.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !v.starts_with(|c: char| c.is_ascii_digit());
            if !ok {
                return Err(url.invalid(format!(
                    "schema must be 1-40 of a-z, 0-9 and _ (not starting with a digit), not {v:?}"
                )));
            }
            v
        }
    };
    let mode = match url.option("sslmode") {
        None | Some("allow") | Some("prefer") => SslMode::Prefer,
        Some("disable") => SslMode::Disable,
        Some("require") => SslMode::Require,
        Some("verify-ca") => SslMode::VerifyCa,
        Some("verify-full") => SslMode::VerifyFull,
        Some(other) => {
            return Err(url.invalid(format!(
                "sslmode={other:?}; known: disable, prefer, require, verify-ca, verify-full"
            )))
        }
    };
    let tls = TlsChoice {
        mode,
        root_cert: url
            .option("sslrootcert")
            .filter(|v| !v.is_empty())
            .map(str::to_string),
    };
    let cleaned = format!(
        "{}://{}{}{}{}",
        url.scheme(),
        url.userinfo_encoded(),
        url.authority(),
        url.path(),
        url.driver_query(&["schema", "sslmode", "sslrootcert"])
    );
    let mut config =
        tokio_postgres::Config::from_str(&cleaned).map_err(|e| url.invalid(e.to_string()))?;
    config.connect_timeout(CONNECT_TIMEOUT);
    if config.get_application_name().is_none() {
        config.application_name("tenure");
    }
    config.ssl_mode(match tls.mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    Ok((config, schema.to_string(), tls))
}

impl Postgres {
    pub(super) async fn connect_raw(&self) -> Result<(Client, PgConnection)> {
        tokio::time::timeout(
            CONNECT_TIMEOUT + Duration::from_secs(1),
            // A clone of a connector; NoTls (without the `tls` feature) is Copy.
            #[allow(clippy::clone_on_copy)]
            self.inner.config.connect(self.inner.tls.clone()),
        )
        .await
        .map_err(|_| Error::unavailable(BACKEND, "connect timed out"))?
        .map_err(pg_err)
    }

    /// The live connection, reconnecting (and preparing) if it was lost.
    pub(super) async fn connected(&self) -> Result<Connected> {
        let mut slot = self.inner.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            let given_up = c.given_up.load(std::sync::atomic::Ordering::Acquire);
            if !c.client.is_closed() && !given_up {
                return Ok(c.clone());
            }
        }
        let (client, connection) = self.connect_raw().await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection ended");
            }
        });
        let s = &self.inner.schema;
        let mismatch = |v: &str| Error::SchemaMismatch {
            backend: BACKEND,
            url: self.inner.url.clone(),
            found: format!("schema {s} has tenure schema version {v}"),
            expected: format!("version {SCHEMA_VERSION}"),
        };
        // Bounded, as every later statement is (a server that stops right
        // after the handshake), but longer: the schema may wait for
        // another process that installs it.
        let setup = crate::backend::sql::CALL_TIMEOUT * 6;
        let stmts = crate::backend::sql::answered_within(setup, BACKEND, async {
            let mut schema = PgSchema {
                client: &client,
                schema: s,
            };
            crate::backend::sql::ensure_schema(
                &mut schema,
                SCHEMA_VERSION,
                super::FORMAT,
                UPGRADES_FROM,
                mismatch,
            )
            .await?;
            crate::backend::sql::ensure_additions(&mut schema).await?;
            Statements::prepare(&client, s).await
        })
        .await??;
        let connected = Connected {
            client: Arc::new(client),
            stmts: Arc::new(stmts),
            given_up: Default::default(),
        };
        *slot = Some(connected.clone());
        Ok(connected)
    }
}
