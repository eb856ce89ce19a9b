//! A deadline on every Kubernetes request the operator sends.
//!
//! kube-client waits as long as TCP does by default: a black-holed or hung
//! API server would hold a reconcile (one of `--concurrency` slots), a
//! finalizer, a floor raise or a stepping-down replica for good. Every
//! request here must be answered — headers and body — within the timeout;
//! otherwise it fails and the caller retries with its usual backoff. A watch
//! only needs its response to start within its own `timeoutSeconds` (plus a
//! margin; the API server may hold a watch back until its cache catches up):
//! its body is a stream the API server ends after that, and kube-runtime's
//! watcher takes a watch that stays silent longer for dead and makes a new one.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The API server did not answer in time.
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the Kubernetes API did not answer within {0:?}")]
pub struct ApiTimedOut(pub Duration);

/// Puts a deadline of `timeout` on every request (a watch: on its response's start).
#[derive(Clone, Copy, Debug)]
pub struct ApiTimeoutLayer {
    timeout: Duration,
}

impl ApiTimeoutLayer {
    /// Requests fail after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for ApiTimeoutLayer {
    type Service = ApiTimeout<S>;

    fn layer(&self, inner: S) -> ApiTimeout<S> {
        ApiTimeout {
            inner,
            timeout: self.timeout,
        }
    }
}

/// The service [`ApiTimeoutLayer`] builds.
#[derive(Clone, Debug)]
pub struct ApiTimeout<S> {
    inner: S,
    timeout: Duration,
}

/// What a watch may take beyond its `timeoutSeconds` to start answering.
const WATCH_START_MARGIN: Duration = Duration::from_secs(5);

/// The `timeoutSeconds` of a request, when it has one.
fn timeout_seconds<B>(req: &Request<B>) -> Option<Duration> {
    let query = req.uri().query()?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeoutSeconds="))
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
}

/// A watch request (`?watch=true`), whose body streams for as long as the watch lasts.
pub fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch"))
    })
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ApiTimeout<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Deadline<ResBody>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let watch = is_watch(&req);
        let timeout = match watch {
            true => {
                self.timeout.max(timeout_seconds(&req).unwrap_or_default()) + WATCH_START_MARGIN
            }
            false => self.timeout,
        };
        let deadline = Instant::now() + timeout;
        let sent = self.inner.call(req);
        Box::pin(async move {
            let response = tokio::time::timeout_at(deadline, sent)
                .await
                .map_err(|_| BoxError::from(ApiTimedOut(timeout)))?
                .map_err(Into::into)?;
            let until = (!watch).then_some(deadline);
            Ok(response.map(|body| Deadline::new(body, until, timeout)))
        })
    }
}

/// A response body that fails once its deadline passes (none for a watch).
pub struct Deadline<B> {
    inner: B,
    sleep: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
}

impl<B> Deadline<B> {
    fn new(inner: B, until: Option<Instant>, timeout: Duration) -> Self {
        Self {
            inner,
            sleep: until.map(|t| Box::pin(tokio::time::sleep_until(t))),
            timeout,
        }
    }
}

impl<B> Body for Deadline<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if let Some(sleep) = this.sleep.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Err(ApiTimedOut(this.timeout).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn request(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap()
    }

    #[test]
    fn a_watch_may_take_its_own_timeout_to_start() {
        let watch = request("/api/v1/pods?timeoutSeconds=60&watch=true");
        assert_eq!(timeout_seconds(&watch), Some(Duration::from_secs(60)));
        assert_eq!(timeout_seconds(&request("/api/v1/pods")), None);
    }

    #[test]
    fn watches_are_told_by_their_query() {
        assert!(is_watch(&request(
            "/api/v1/pods?watch=true&timeoutSeconds=60"
        )));
        assert!(is_watch(&request(
            "/api/v1/pods?allowWatchBookmarks=true&watch=1"
        )));
        assert!(!is_watch(&request(
            "/api/v1/pods?labelSelector=watch%3Dtrue"
        )));
        assert!(!is_watch(&request("/api/v1/namespaces/a/configmaps/b")));
    }

    /// A server that never answers: the request fails at its deadline.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_request_fails_at_its_deadline() {
        let hang = tower::service_fn(|_r: Request<()>| async {
            std::future::pending::<Result<Response<String>, Infallible>>().await
        });
        let mut svc = ApiTimeoutLayer::new(Duration::from_secs(3)).layer(hang);
        let started = Instant::now();
        let err = match svc.call(request("/api/v1/pods")).await {
            Err(e) => e,
            Ok(_) => panic!("a request nobody answers cannot succeed"),
        };
        assert!(err.is::<ApiTimedOut>(), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    /// Headers in time but a body that stalls: the body fails at the same
    /// deadline; a watch's body is left to the watcher.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_unless_it_is_a_watch() {
        let stalled = tower::service_fn(|_r: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Stalled))
        });
        let mut svc = ApiTimeoutLayer::new(Duration::from_secs(3)).layer(stalled);
        let mut body = svc.call(request("/api/v1/pods")).await.unwrap().into_body();
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        assert!(matches!(frame, Some(Err(e)) if e.is::<ApiTimedOut>()));

        let mut watch = svc
            .call(request("/api/v1/pods?watch=true"))
            .await
            .unwrap()
            .into_body();
        let polled = tokio::time::timeout(
            Duration::from_secs(600),
            std::future::poll_fn(|cx| Pin::new(&mut watch).poll_frame(cx)),
        )
        .await;
        assert!(polled.is_err(), "a watch body may stay silent");
    }

    struct Stalled;

    impl Body for Stalled {
        type Data = &'static [u8];
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            Poll::Pending
        }
    }
}
