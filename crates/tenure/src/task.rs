//! Store calls that finish even when their caller stops waiting, and
//! clean-up that runs in the background. Below every other layer: backends
//! and recipes alike use it.

use std::future::Future;

/// Runs a clean-up future if a tokio runtime is at hand; otherwise the store's
/// expiry does the clean-up.
pub(crate) fn spawn_detached(fut: impl Future<Output = ()> + Send + 'static) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(fut);
    }
}

/// Runs a store call to completion even if the caller stops waiting for it.
///
/// The call is polled right here, so the common path costs nothing extra. If
/// the caller drops this future before the call finished, the rest of the
/// call moves to a spawned task, and its output goes to `abandoned` (to undo
/// a join, say): a cancelled call leaves nothing behind.
pub(crate) async fn finish<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> T {
    finish_tracked(fut, |output, ()| abandoned(output), || ()).await
}

/// [`finish`], and if the call moves to a spawned task, `track` is called
/// at that moment (synchronously, as the caller drops it) and what it
/// returns is kept until the call has finished and gone to `abandoned`
/// (a count of calls still on their way, say). The common path, where the
/// caller waits, never calls `track`.
pub(crate) async fn finish_tracked<T: Send + 'static, G: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
    abandoned: impl FnOnce(T, G) + Send + 'static,
    track: impl FnOnce() -> G + Send + 'static,
) -> T {
    Finishing {
        fut: Some(Box::pin(fut)),
        abandoned: Some(Box::new(move || {
            let tracked = track();
            Box::new(move |output| abandoned(output, tracked))
        })),
    }
    .await
}

type BoxedCall<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// What a dropped call does: made when it is dropped, run with its output.
type Abandon<T> = Box<dyn FnOnce() -> Box<dyn FnOnce(T) + Send> + Send>;

/// See [`finish`].
struct Finishing<T: Send + 'static> {
    fut: Option<BoxedCall<T>>,
    abandoned: Option<Abandon<T>>,
}

impl<T: Send + 'static> Future for Finishing<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        let Some(fut) = self.fut.as_mut() else {
            // Polled after completion: never happens through `finish`.
            return std::task::Poll::Pending;
        };
        match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(output) => {
                self.fut = None;
                std::task::Poll::Ready(output)
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for Finishing<T> {
    fn drop(&mut self) {
        if let (Some(fut), Some(abandon)) = (self.fut.take(), self.abandoned.take()) {
            let abandoned = abandon();
            spawn_detached(async move {
                abandoned(fut.await);
            });
        }
    }
}

/// Runs `body` (a loop that stops when the future it was given as its own
/// shutdown resolves) until it returns, and makes its stop end in time:
/// once `shutdown` resolves, `body`'s own shutdown is signalled, and if
/// `body` has not returned `bound` later it is dropped (its store calls
/// with it) and `overrun()` is returned. A backstop for a store that does
/// not answer: a session dropped so stops renewing, and its lease lapses
/// on the store's side.
pub(crate) async fn stop_within<T, B, F>(
    body: impl FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> B,
    shutdown: F,
    bound: std::time::Duration,
    overrun: impl FnOnce() -> T,
) -> T
where
    B: Future<Output = T>,
    F: Future<Output = ()>,
{
    let (fire, fired) = tokio::sync::watch::channel(false);
    let own = Box::pin(async move {
        let mut fired = fired;
        let _ = fired.wait_for(|f| *f).await;
    });
    let body = body(own);
    tokio::pin!(body, shutdown);
    let mut deadline = None;
    loop {
        tokio::select! {
            done = &mut body => return done,
            () = &mut shutdown, if deadline.is_none() => {
                deadline = Some(tokio::time::Instant::now() + bound);
                fire.send_replace(true);
            }
            () = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => return overrun(),
        }
    }
}
