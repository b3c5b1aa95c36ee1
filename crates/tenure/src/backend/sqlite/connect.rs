//! Opening the file: the URL's options, the connection's settings (busy
//! timeout, statement cache and counter, the store's clock), WAL mode and
//! the pragmas, and what is wrong with a file that cannot be opened.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, OpenFlags};

use super::calls::{db_err, is_busy};
use super::checkpoint::Checkpointer;
use super::layout::{create_tables, SCHEMA_VERSION};
use super::{capabilities, Inner, SqliteStore, BACKEND, BUSY_TIMEOUT, URL};
use crate::backend::poll::Listeners;
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

static STATEMENTS: AtomicU64 = AtomicU64::new(0);

// Counted from SQLite's profile hook, which gets each statement's own text
// when it ends: the trace hook would expand every bound parameter into a
// new string on every statement, only to be thrown away.
fn count_statement(_sql: &str, _took: Duration) {
    STATEMENTS.fetch_add(1, Ordering::Relaxed);
}

impl SqliteStore {
    /// Opens a store from a `sqlite://` URL (as [`crate::open`] does), typed.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_url(StoreUrl::parse(url, &URL)?).await
    }

    pub(crate) async fn open_url(url: StoreUrl) -> Result<Self> {
        let (path, synchronous) = parse_url(&url)?;
        let masked = url.masked().to_string();
        tokio::task::spawn_blocking(move || Self::open_path(&path, synchronous, &masked))
            .await
            .map_err(|e| Error::backend(BACKEND, e))?
    }

    fn open_path(path: &Path, synchronous: &str, url: &str) -> Result<Self> {
        if !crate::clock::boot_time_known() {
            return Err(Error::Unsupported {
                backend: BACKEND,
                what: "a process whose time namespace's offsets cannot be read \
                       (/proc/self/timens_offsets): its boot time could not be compared",
            });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let open_error = |e: rusqlite::Error| file_error(path, e);
        let mut conn = Connection::open_with_flags(path, flags).map_err(open_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(db_err)?;
        conn.set_prepared_statement_cache_capacity(64);
        conn.profile(Some(count_statement));
        conn.create_scalar_function("tenure_now_ms", 0, FunctionFlags::SQLITE_UTF8, |_| {
            Ok(i64::try_from(crate::clock::boot_time().as_millis()).unwrap_or(i64::MAX))
        })
        .map_err(open_error)?;
        // Several processes may set up a new file at once; switching to WAL can
        // report "locked" without waiting on the busy timeout, so retry.
        let started = std::time::Instant::now();
        loop {
            match setup(&mut conn, synchronous) {
                Ok(Ok(())) => break,
                Ok(Err(found)) => {
                    return Err(Error::SchemaMismatch {
                        backend: BACKEND,
                        url: url.to_string(),
                        found,
                        expected: format!("version {SCHEMA_VERSION}"),
                    })
                }
                Err(e) if is_busy(&e) && started.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) if is_busy(&e) => return Err(Error::unavailable(BACKEND, e)),
                Err(e) => return Err(open_error(e)),
            }
        }
        let round_trips = Arc::new(AtomicU64::new(0));
        let checkpointer = Checkpointer::start(path, round_trips.clone());
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                checkpointer,
                path: path.to_path_buf(),
                caps: capabilities(),
                listeners: Listeners::default(),
                round_trips,
            }),
        })
    }

    /// How many SQL statements every SQLite store of this process has run
    /// (BEGIN and COMMIT included): for counting statements per operation.
    pub fn statements_executed() -> u64 {
        STATEMENTS.load(Ordering::Relaxed)
    }
}

pub(super) fn parse_url(url: &StoreUrl) -> Result<(PathBuf, &'static str)> {
    let path = url.path();
    if path.is_empty() {
        return Err(
            url.invalid("no file path; use sqlite:///absolute/path.db or sqlite://relative.db")
        );
    }
    if path.contains('\0') {
        return Err(url.invalid("the path contains NUL"));
    }
    let synchronous = match url.option("synchronous").map(str::to_ascii_lowercase) {
        None => "NORMAL",
        Some(v) => match v.as_str() {
            "normal" => "NORMAL",
            "full" => "FULL",
            "extra" => "EXTRA",
            _ => {
                return Err(url.invalid(format!(
                    "synchronous must be normal, full or extra, not {v:?}"
                )))
            }
        },
    };
    Ok((PathBuf::from(path), synchronous))
}

/// What is wrong with the file, in words: not a database, read-only, or
/// not to be opened where it is. Each is bad input (the path or its
/// permissions), not a fault of the store.
fn file_error(path: &Path, e: rusqlite::Error) -> Error {
    let code = e.sqlite_error_code();
    let shown = path.display();
    let reason = match code {
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
            format!(
                "{shown} is not an SQLite database (or is damaged), so it is not a tenure store"
            )
        }
        Some(rusqlite::ErrorCode::ReadOnly) => format!(
            "{shown} is read-only for this user: tenure writes to it, and beside it (its WAL files)"
        ),
        _ if path.is_file() && !accessible(path, libc::R_OK) => {
            format!("{shown} cannot be read by this user")
        }
        _ if path.is_file() && !accessible(path, libc::W_OK) => format!(
            "{shown} is read-only for this user: tenure writes to it, and beside it (its WAL files)"
        ),
        _ => format!(
            "cannot open {shown} for reading and writing ({e}): does its directory exist, and may \
             this user write there?"
        ),
    };
    Error::InvalidArgument {
        what: "SQLite store file",
        reason,
    }
}

/// Whether this process may access `path` in `mode` (`access(2)`: the real
/// user, a read-only mount included).
fn accessible(path: &Path, mode: libc::c_int) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path that lives through the call.
    unsafe { libc::access(c_path.as_ptr(), mode) == 0 }
}

/// WAL mode, pragmas and tables; `Ok(Err(reason))` for a file this build
/// cannot use.
fn setup(
    conn: &mut Connection,
    synchronous: &str,
) -> rusqlite::Result<std::result::Result<(), String>> {
    // journal_mode answers with a row, so it is queried, not executed; WAL
    // stays set in the file, so later opens only read it.
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(%mode, "SQLite did not switch to WAL; locking still works, slower");
        }
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous={synchronous}; PRAGMA foreign_keys=ON;"
    ))?;
    create_tables(conn)
}
