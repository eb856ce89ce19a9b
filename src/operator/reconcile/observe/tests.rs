//! Why nobody is elected is asked of the API server as one request for one
//! page of metadata, over a `kube::Client` whose service records what it is
//! sent and answers a page with more to follow.

use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::client::Body;
use serde_json::json;

use super::*;

/// Each request seen: its URI and its Accept header.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A client whose every request is recorded (URI and Accept header) and
/// answered with one page of two pods, a continue token and `remaining`.
fn recording(remaining: Option<i64>) -> (kube::Client, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let svc = tower::service_fn(move |req: Request<Body>| {
        let accept = req
            .headers()
            .get(http::header::ACCEPT)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        log.lock().unwrap().push((req.uri().to_string(), accept));
        let mut metadata = json!({ "continue": "page-2", "resourceVersion": "7" });
        if let Some(n) = remaining {
            metadata["remainingItemCount"] = n.into();
        }
        let page = json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": metadata,
            "items": [
                { "metadata": { "name": "web-0", "labels": { "app": "web" } } },
                { "metadata": { "name": "web-1" } },
            ],
        });
        let reply = Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&page).unwrap()))
            .unwrap();
        async move { Ok::<_, std::convert::Infallible>(reply) }
    });
    (kube::Client::new(svc, "ns"), seen)
}

#[tokio::test]
async fn why_nobody_asks_one_page_of_metadata_only() {
    let selector: kube::core::Selector =
        kube::core::Expression::Equal("app".into(), "web".into()).into();
    let (client, seen) = recording(Some(21));
    let page = first_page(&client, "ns", &selector, "l!=true".into())
        .await
        .expect("the page");
    assert_eq!(page.names, ["web-0", "web-1"]);
    assert_eq!(page.rest, pods::Rest::Counted(21));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one request, however many pages: {seen:?}");
    let (uri, accept) = &seen[0];
    assert!(
        accept.contains("as=PartialObjectMetadataList"),
        "metadata only: Accept {accept:?}"
    );
    assert!(
        uri.contains("limit=20") && uri.contains("labelSelector=app%3Dweb%2Cl%21%3Dtrue"),
        "filtered by the server, one page: {uri}"
    );

    // No count from the server (a label-selected list): more, uncounted.
    let (client, _) = recording(None);
    let page = first_page(&client, "ns", &selector, "l!=true".into())
        .await
        .expect("the page");
    assert_eq!(page.rest, pods::Rest::Uncounted);
}
