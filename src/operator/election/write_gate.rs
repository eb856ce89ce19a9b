//! The write gate in the Kubernetes client itself: a request that changes
//! something (any method but GET, HEAD and OPTIONS) is refused while the gate
//! is closed, checked as the request enters the client's stack.
//!
//! This is the one place the reconciler's Kubernetes writes are checked
//! (status, finalizer, pod marks, token floors, Events): its refusal reaches
//! the reconciler as `reconcile::Error::NotLeader`. The store calls that take
//! or give a lease pass the reconciler's own gate (`executor::gated`).
//! Reads (lists and watches included) always pass.
//! The election's own Lease writes use a client without this layer.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request};
use tower::{Layer, Service};

use crate::operator::leadership::Leadership;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Wraps a client stack so that writes need an open gate.
#[derive(Clone, Debug)]
pub struct WriteGateLayer {
    gate: Leadership,
}

impl WriteGateLayer {
    /// Gates writes on `gate`.
    pub fn new(gate: Leadership) -> Self {
        Self { gate }
    }
}

impl<S> Layer<S> for WriteGateLayer {
    type Service = WriteGate<S>;

    fn layer(&self, inner: S) -> WriteGate<S> {
        WriteGate {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service [`WriteGateLayer`] builds.
#[derive(Clone, Debug)]
pub struct WriteGate<S> {
    inner: S,
    gate: Leadership,
}

impl<S, B> Service<Request<B>> for WriteGate<S>
where
    S: Service<Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let reads = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
        if !reads && let Err(refused) = self.gate.check() {
            return Box::pin(std::future::ready(Err(refused.into())));
        }
        let sent = self.inner.call(req);
        Box::pin(async move { sent.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::time::{Duration, Instant};

    fn request(method: Method) -> Request<()> {
        Request::builder().method(method).body(()).unwrap()
    }

    #[tokio::test]
    async fn writes_pass_only_while_the_gate_is_open_and_reads_always() {
        let gate = Leadership::elected();
        let echo =
            tower::service_fn(
                |r: Request<()>| async move { Ok::<_, Infallible>(r.method().clone()) },
            );
        let mut svc = WriteGateLayer::new(gate.clone()).layer(echo);
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            let refused = svc.call(request(m)).await.unwrap_err();
            assert!(refused.to_string().contains("not the operator leader"));
        }
        assert_eq!(svc.call(request(Method::GET)).await.unwrap(), Method::GET);
        gate.lead_until(Instant::now() + Duration::from_secs(60));
        assert_eq!(
            svc.call(request(Method::PATCH)).await.unwrap(),
            Method::PATCH
        );
        gate.step_down();
        assert!(svc.call(request(Method::PATCH)).await.is_err());
    }
}
