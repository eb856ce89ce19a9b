//! `targetlease_api_writes_total{kind}`: every write the operator's
//! Kubernetes client sends, counted in the client itself, so no write site
//! can be missed (the reconciler, the orphaned-mark sweep, the token floor,
//! the Event recorder).
//!
//! The kind comes from the request alone (method, path, content type):
//!
//! | kind | request |
//! | --- | --- |
//! | `status` | anything on `targetleases/<name>/status` |
//! | `finalizer` | a patch of a TargetLease itself (the operator writes only its finalizer there) |
//! | `pod_mark` | a server-side apply of a pod (the leader label and token annotations) |
//! | `pod_unmark` | any other pod patch (a merge patch that removes them) |
//! | `floor` | a ConfigMap write (a namespace's token floors) |
//! | `event` | an Event |
//! | `other` | anything else |
//!
//! `targetlease_api_write_conflicts_total{kind}` counts the writes of each
//! kind the API server refused with a conflict (409): a write conditional on
//! a version someone else changed first (two deletions raising floors in one
//! namespace, a status planned from a version the watch had not shown yet). The
//! operator reads again and retries; a steady rate is worth a look.
//!
//! With the defaults a held lease costs about one `status` write per minute
//! (docs/operator.md, "Status write budget"): compare
//! `rate(targetlease_api_writes_total[10m])` with `targetlease_leases{phase="Held"}`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request, Response, StatusCode, header};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tower::{Layer, Service};

/// What a write was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// TargetLease status.
    Status,
    /// The TargetLease finalizer.
    Finalizer,
    /// A pod's leader label and token annotations set.
    PodMark,
    /// A pod's marks removed.
    PodUnmark,
    /// A token-floor ConfigMap.
    Floor,
    /// An Event.
    Event,
    /// Anything else.
    Other,
}

impl WriteKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::Status => "status",
            WriteKind::Finalizer => "finalizer",
            WriteKind::PodMark => "pod_mark",
            WriteKind::PodUnmark => "pod_unmark",
            WriteKind::Floor => "floor",
            WriteKind::Event => "event",
            WriteKind::Other => "other",
        }
    }

    /// The kind of a request; `None` for reads (GET, HEAD, OPTIONS).
    pub fn of<B>(req: &Request<B>) -> Option<WriteKind> {
        if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
            return None;
        }
        let (resource, subresource) = resource_of(req.uri().path());
        let apply = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/apply-patch"));
        Some(match (resource, subresource) {
            ("targetleases", Some("status")) => WriteKind::Status,
            ("targetleases", None) if *req.method() == Method::PATCH => WriteKind::Finalizer,
            ("pods", None) if *req.method() == Method::PATCH && apply => WriteKind::PodMark,
            ("pods", None) if *req.method() == Method::PATCH => WriteKind::PodUnmark,
            ("configmaps", None) => WriteKind::Floor,
            ("events", None) => WriteKind::Event,
            _ => WriteKind::Other,
        })
    }
}

/// `(resource, subresource)` of an API path: `/api/v1/namespaces/ns/pods/p`
/// is `("pods", None)`, `/apis/g/v/namespaces/ns/r/n/status` is `("r", Some("status"))`.
fn resource_of(path: &str) -> (&str, Option<&str>) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.first() {
        Some(&"api") => parts.get(2..),
        Some(&"apis") => parts.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    let rest = match rest {
        ["namespaces", _, r @ ..] if !r.is_empty() => r,
        r => r,
    };
    (
        rest.first().copied().unwrap_or_default(),
        rest.get(2).copied(),
    )
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// The counter families; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ApiWrites(Family<KindLabels, Counter>, Family<KindLabels, Counter>);

impl ApiWrites {
    /// Registers `api_writes` and `api_write_conflicts`
    /// (`targetlease_api_writes_total`, `targetlease_api_write_conflicts_total`
    /// under the prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "api_writes",
            "Kubernetes API writes sent by the operator, by kind: status, finalizer, pod_mark, pod_unmark, floor, event, other",
            self.0.clone(),
        );
        registry.register(
            "api_write_conflicts",
            "Kubernetes API writes the API server refused with a conflict (409), by kind",
            self.1.clone(),
        );
    }

    /// Counts one write refused with a conflict.
    pub fn conflict(&self, kind: WriteKind) {
        self.1
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Writes of `kind` refused with a conflict so far.
    pub fn conflicts(&self, kind: WriteKind) -> u64 {
        self.1
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .get()
    }

    /// Counts one write.
    pub fn count(&self, kind: WriteKind) {
        self.0
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Writes of `kind` so far.
    pub fn get(&self, kind: WriteKind) -> u64 {
        self.0
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .get()
    }

    /// The client layer that counts into this family.
    pub fn layer(&self) -> ApiWritesLayer {
        ApiWritesLayer(self.clone())
    }
}

/// Counts each write request that reaches it (put it inside the write gate,
/// so refused writes are not counted), and each answered with a conflict.
#[derive(Clone, Debug)]
pub struct ApiWritesLayer(ApiWrites);

impl<S> Layer<S> for ApiWritesLayer {
    type Service = CountWrites<S>;

    fn layer(&self, inner: S) -> CountWrites<S> {
        CountWrites {
            inner,
            writes: self.0.clone(),
        }
    }
}

/// The service [`ApiWritesLayer`] builds.
#[derive(Clone, Debug)]
pub struct CountWrites<S> {
    inner: S,
    writes: ApiWrites,
}

impl<S, B, R> Service<Request<B>> for CountWrites<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let kind = WriteKind::of(&req);
        if let Some(kind) = kind {
            self.writes.count(kind);
        }
        let (writes, sent) = (self.writes.clone(), self.inner.call(req));
        Box::pin(async move {
            let response = sent.await?;
            if let Some(kind) = kind
                && response.status() == StatusCode::CONFLICT
            {
                writes.conflict(kind);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, path: &str, content_type: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, content_type)
            .body(())
            .unwrap()
    }

    /// Every write is counted once, and once more as a conflict when the
    /// API server answers 409; reads are not counted.
    #[tokio::test]
    async fn writes_and_their_conflicts_are_counted_in_the_client() {
        use tower::ServiceExt;
        let writes = ApiWrites::default();
        let server = tower::service_fn(|req: Request<()>| async move {
            let status = if req.uri().path().ends_with("floors-0a") {
                StatusCode::CONFLICT
            } else {
                StatusCode::OK
            };
            Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap())
        });
        let client = writes.layer().layer(server);
        let configmaps = "/api/v1/namespaces/tl-system/configmaps";
        for (method, path) in [
            (Method::PUT, format!("{configmaps}/floors-0a")),
            (Method::PUT, format!("{configmaps}/floors-0b")),
            (Method::GET, format!("{configmaps}/floors-0a")),
        ] {
            let reply = client
                .clone()
                .oneshot(req(method, &path, "application/json"))
                .await
                .unwrap();
            assert!(reply.status().is_success() || reply.status() == StatusCode::CONFLICT);
        }
        assert_eq!(writes.get(WriteKind::Floor), 2);
        assert_eq!(writes.conflicts(WriteKind::Floor), 1);
        assert_eq!(writes.conflicts(WriteKind::Status), 0);
    }

    #[test]
    fn requests_are_classified_by_path_method_and_patch_type() {
        let tl = "/apis/targetlease.dev/v1alpha1/namespaces/apps/targetleases/web";
        let pod = "/api/v1/namespaces/apps/pods/web-0";
        let cases = [
            (
                Method::PATCH,
                format!("{tl}/status?fieldManager=x&force=true"),
                "application/apply-patch+yaml",
                Some(WriteKind::Status),
            ),
            (
                Method::PATCH,
                tl.to_string(),
                "application/json-patch+json",
                Some(WriteKind::Finalizer),
            ),
            (
                Method::PATCH,
                pod.to_string(),
                "application/apply-patch+yaml",
                Some(WriteKind::PodMark),
            ),
            (
                Method::PATCH,
                pod.to_string(),
                "application/merge-patch+json",
                Some(WriteKind::PodUnmark),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/tl-system/configmaps".into(),
                "application/json",
                Some(WriteKind::Floor),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/tl-system/configmaps/floors-0a".into(),
                "application/json",
                Some(WriteKind::Floor),
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/apps/events".into(),
                "application/json",
                Some(WriteKind::Event),
            ),
            (
                Method::PATCH,
                "/apis/events.k8s.io/v1/namespaces/apps/events/e1".into(),
                "application/merge-patch+json",
                Some(WriteKind::Event),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/x/leases/l".into(),
                "application/json",
                Some(WriteKind::Other),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/x".into(),
                "application/json",
                Some(WriteKind::Other),
            ),
            (Method::GET, format!("{tl}/status"), "", None),
            (Method::GET, "/api/v1/pods?watch=true".into(), "", None),
        ];
        for (method, path, ct, want) in cases {
            assert_eq!(
                WriteKind::of(&req(method.clone(), &path, ct)),
                want,
                "{method} {path}"
            );
        }
    }

    #[tokio::test]
    async fn the_layer_counts_writes_and_passes_every_request_on() {
        let writes = ApiWrites::default();
        let echo = tower::service_fn(|r: Request<()>| async move {
            Ok::<_, std::convert::Infallible>(Response::new(r.method().clone()))
        });
        let mut svc = writes.layer().layer(echo);
        let pod = "/api/v1/namespaces/a/pods/p";
        for _ in 0..3 {
            let m = svc
                .call(req(Method::PATCH, pod, "application/apply-patch+yaml"))
                .await
                .unwrap();
            assert_eq!(m.into_body(), Method::PATCH);
        }
        svc.call(req(Method::GET, pod, "")).await.unwrap();
        assert_eq!(writes.get(WriteKind::PodMark), 3);
        assert_eq!(writes.get(WriteKind::PodUnmark), 0);
    }
}
