//! Requests to ZooKeeper, each bounded in time, and what their errors mean
//! to tenure.

use zookeeper_client as zk;

use super::{BACKEND, CALL_TIMEOUT};
use crate::error::{Error, Result};

pub(super) fn zk_err(e: zk::Error) -> Error {
    match e {
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::SessionMoved => lost(),
        zk::Error::AuthFailed | zk::Error::NoAuth => Error::Auth {
            backend: BACKEND,
            reason: e.to_string(),
        },
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::NoHosts
        | zk::Error::Throttled
        | zk::Error::Custom(_) => Error::unavailable(BACKEND, e.to_string()),
        other => Error::backend(BACKEND, other.to_string()),
    }
}

pub(super) fn lost() -> Error {
    Error::SessionLost(crate::error::LostReason::Expired)
}

pub(super) type ZkResult<T> = std::result::Result<T, zk::Error>;

/// Bounds a call; the outer error is the timeout, the inner ZooKeeper's.
pub(super) async fn call_raw<T>(
    fut: impl std::future::Future<Output = ZkResult<T>>,
) -> Result<ZkResult<T>> {
    tokio::time::timeout(CALL_TIMEOUT, fut)
        .await
        .map_err(|_| Error::unavailable(BACKEND, format!("no answer within {CALL_TIMEOUT:?}")))
}

pub(super) async fn call<T>(fut: impl std::future::Future<Output = ZkResult<T>>) -> Result<T> {
    call_raw(fut).await?.map_err(zk_err)
}

/// A multi's outcome: done, or the index and error of the operation that
/// failed (and then nothing changed).
pub(super) type Multi = std::result::Result<Vec<zk::MultiWriteResult>, (usize, zk::Error)>;

/// Commits a multi, bounded as [`call`] is.
pub(super) async fn commit(writer: &mut zk::MultiWriter<'_>) -> Result<Multi> {
    match tokio::time::timeout(CALL_TIMEOUT, writer.commit()).await {
        Err(_) => Err(Error::unavailable(
            BACKEND,
            format!("no answer within {CALL_TIMEOUT:?}"),
        )),
        Ok(Ok(results)) => Ok(Ok(results)),
        Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => Ok(Err((index, source))),
        Ok(Err(zk::MultiWriteError::RequestFailed { source })) => Err(zk_err(source)),
    }
}
