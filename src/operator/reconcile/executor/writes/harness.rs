//! The mocked API server and the logged store the write-sequence tests run
//! against: one TargetLease served, every write recorded as a line.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::operator::events::Recorder;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tower::Layer;

use crate::operator::crd::TargetLease;
use crate::operator::election::write_gate::WriteGateLayer;
use crate::operator::floor::FloorStore;
use crate::operator::leadership::Leadership;
use crate::operator::reconcile::pod_index::{PodCache, PodIndex};
use crate::operator::reconcile::pods::CachedPod;
use crate::operator::reconcile::{Context, Error, clock::ServerClock, keeper::Keeper, reconcile};
use crate::store::memory::MemoryStore;
use crate::store::{
    AcquireRequest, CommitRequest, Health, LeaseStore, Listed, ReadReply, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

const TL: &str = "/apis/targetlease.dev/v1alpha1/namespaces/ns/targetleases/tl";
const PODS: &str = "/api/v1/namespaces/ns/pods";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";
const FLOORS: &str = "/api/v1/namespaces/floors/configmaps";

/// The API server's side: the one TargetLease it serves, and every write
/// it was sent, as "METHOD path key-fields".
#[derive(Default)]
pub(super) struct Api {
    pub(super) object: Value,
    pub(super) writes: Vec<String>,
}

pub(super) type Shared = Arc<Mutex<Api>>;

async fn body_of(body: Body) -> Value {
    let mut body = body;
    let mut bytes = Vec::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx)).await
    {
        if let Ok(data) = frame.expect("a request body").into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

fn reply(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

fn conflict() -> Response<Body> {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "Conflict", "message": "the object has been modified", "code": 409});
    reply(StatusCode::CONFLICT, &status)
}

fn invalid() -> Response<Body> {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "Invalid", "message": "the test operation failed", "code": 422});
    reply(StatusCode::UNPROCESSABLE_ENTITY, &status)
}

fn not_found() -> Response<Body> {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "NotFound", "message": "not found", "code": 404});
    reply(StatusCode::NOT_FOUND, &status)
}

/// What a write changes, in a few words: the key fields of its body.
fn key_fields(path: &str, body: &Value) -> String {
    let s = |v: &Value| {
        v.as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v.to_string())
    };
    if path.ends_with("/status") {
        let st = &body["status"];
        let mut k = format!(
            "phase={} token={} pod={}",
            s(&st["phase"]),
            s(&st["fencingToken"]),
            s(&st["holderPod"])
        );
        if !st["releasingAcquisitionId"].is_null() {
            k.push_str(" releasing");
        }
        return k;
    }
    if path.starts_with(PODS) {
        let token = &body["metadata"]["annotations"]["tl.targetlease.dev/fencing-token"];
        return match token {
            Value::Null => "unmark".into(),
            t => format!("mark token={}", s(t)),
        };
    }
    if path.starts_with(TL) {
        let ops = body.as_array().cloned().unwrap_or_default();
        return ops
            .iter()
            .filter(|o| o["op"] != "test")
            .map(|o| format!("finalizer {}", s(&o["op"])))
            .collect();
    }
    if path.starts_with(EVENTS) {
        return format!("event {}", s(&body["reason"]));
    }
    if path.starts_with(FLOORS) {
        let data = body["data"].as_object().cloned().unwrap_or_default();
        let tokens: Vec<_> = data
            .values()
            .filter_map(|v| v.as_str()?.split('@').next().map(str::to_owned))
            .collect();
        return format!("floor token={}", tokens.join(","));
    }
    String::new()
}

/// A new version of the served object.
fn bump(o: &mut Value) {
    let rv: u64 = o["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    o["metadata"]["resourceVersion"] = (rv + 1).to_string().into();
}

async fn serve(
    api: Shared,
    req: Request<Body>,
) -> Result<Response<Body>, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let (method, path) = (parts.method.clone(), parts.uri.path().to_owned());
    let body = body_of(body).await;
    let mut api = api.lock().unwrap();
    if method != Method::GET {
        let k = key_fields(&path, &body);
        let short = path
            .replace(TL, "tl")
            .replace(PODS, "pods")
            .replace(EVENTS, "events")
            .replace(FLOORS, "floors");
        api.writes.push(format!("{method} {short} {k}"));
    }
    Ok(match (method, path.as_str()) {
        (Method::GET, TL) => reply(StatusCode::OK, &api.object),
        (Method::PATCH, TL) => {
            let patch: json_patch::Patch = serde_json::from_value(body).unwrap();
            // A failed `test` operation refuses the whole patch, as the API
            // server does (422), and changes nothing.
            let mut patched = api.object.clone();
            if json_patch::patch(&mut patched, &patch).is_err() {
                return Ok(invalid());
            }
            api.object = patched;
            bump(&mut api.object);
            reply(StatusCode::OK, &api.object)
        }
        (Method::PATCH, p) if p == format!("{TL}/status") => {
            // Conditional, as the API server makes it: the version planned from.
            let planned = &body["metadata"]["resourceVersion"];
            if planned.is_null() || *planned != api.object["metadata"]["resourceVersion"] {
                return Ok(conflict());
            }
            api.object["status"] = body["status"].clone();
            bump(&mut api.object);
            reply(StatusCode::OK, &api.object)
        }
        (Method::PATCH, p) if p.starts_with(PODS) => {
            let name = p.rsplit('/').next().unwrap();
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns"}});
            reply(StatusCode::OK, &pod)
        }
        (Method::POST, EVENTS) | (Method::POST, FLOORS) => reply(StatusCode::CREATED, &body),
        _ => not_found(),
    })
}

/// The reference store, its writes logged in the same sequence as the API's.
pub(super) struct Logged {
    inner: MemoryStore,
    api: Shared,
    /// Someone else edits the object while the next acquire is in flight.
    pub(super) edit_during_acquire: AtomicBool,
}

impl Logged {
    fn log(&self, what: &str) {
        self.api
            .lock()
            .unwrap()
            .writes
            .push(format!("STORE {what}"));
    }
}

#[async_trait::async_trait]
impl LeaseStore for Logged {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        self.log("acquire");
        if self.edit_during_acquire.swap(false, Ordering::SeqCst) {
            let object = &mut self.api.lock().unwrap().object;
            object["metadata"]["labels"] = json!({"edited": "meanwhile"});
            bump(object);
        }
        self.inner.acquire(req).await
    }
    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        self.log("renew");
        self.inner.renew(req).await
    }
    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        self.log("release");
        self.inner.release(req).await
    }
    async fn get(&self, target: &Target) -> Result<Reply, StoreError> {
        self.inner.get(target).await
    }
    async fn revoke(&self, req: &RevokeRequest) -> Result<Reply, StoreError> {
        self.log("revoke");
        self.inner.revoke(req).await
    }
    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        self.log("commit");
        self.inner.commit(req).await
    }
    async fn read(&self, target: &Target, key: &str) -> Result<ReadReply, StoreError> {
        self.inner.read(target, key).await
    }
    async fn list(&self, ns: Option<&str>, prefix: &str) -> Result<Vec<Listed>, StoreError> {
        self.inner.list(ns, prefix).await
    }
    async fn health(&self) -> Result<Health, StoreError> {
        self.inner.health().await
    }
}

fn pod(name: &str) -> CachedPod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "resourceVersion": "1", "labels": {"tl.targetlease.dev/candidate": "true"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap()
}

pub(super) struct Harness {
    pub(super) api: Shared,
    pub(super) ctx: Arc<Context>,
    pub(super) store: Arc<Logged>,
}

impl Harness {
    pub(super) fn new(gate: Leadership) -> Self {
        let object = json!({
            "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
            "metadata": {"name": "tl", "namespace": "ns", "uid": "uid-tl",
                "resourceVersion": "1", "generation": 1, "finalizers": null},
            "spec": {"target": "db", "holder": {"identity": "web-0", "podName": "web-0"},
                "leaseDuration": "30s"},
        });
        let api: Shared = Arc::new(Mutex::new(Api {
            object,
            writes: Vec::new(),
        }));
        let served = api.clone();
        let svc = tower::service_fn(move |req| serve(served.clone(), req));
        // The production stack's write gate, over the mocked API server.
        let client = kube::Client::new(WriteGateLayer::new(gate.clone()).layer(svc), "ns");
        let (pods, mut pod_writer) = reflector::store::<CachedPod>();
        let index = Arc::new(PodIndex::default());
        for name in ["web-0", "web-1"] {
            let event = watcher::Event::Apply(pod(name));
            pod_writer.apply_watcher_event(&event);
            index.apply(&event);
        }
        let (floor_cache, _) = reflector::store();
        let (leases, _): (Store<TargetLease>, _) = reflector::store();
        let store = Arc::new(Logged {
            inner: MemoryStore::default(),
            api: api.clone(),
            edit_during_acquire: AtomicBool::new(false),
        });
        let clock = Arc::new(ServerClock::new());
        let (wake, _) = futures::channel::mpsc::unbounded();
        let ctx = Arc::new(Context {
            client: client.clone(),
            store: store.clone(),
            leases,
            lease_index: Default::default(),
            pods: PodCache { store: pods, index },
            selectors: Default::default(),
            slots: crate::operator::reconcile::slots::FairSlots::new(1),
            floors: FloorStore::new(client.clone(), "floors", "floors", floor_cache),
            recorder: Recorder::new(client, "writes-test", None),
            lease_ids: crate::operator::lease_id::LeaseIdKey::random(),
            echoes: crate::operator::reconcile::echoes::Echoes::new(wake.clone()),
            wake,
            metrics: Default::default(),
            leadership: gate,
            ready: crate::operator::readiness::Ready::already(),
            carryover: Default::default(),
            published: Default::default(),
            clock: clock.clone(),
            keeper: Arc::new(Keeper::new(store.clone(), clock)),
            renewals: Default::default(),
        });
        Self { api, ctx, store }
    }

    /// Edits the served object as a user would (a new version).
    pub(super) fn edit(&self, f: impl FnOnce(&mut Value)) {
        let mut api = self.api.lock().unwrap();
        f(&mut api.object);
        bump(&mut api.object);
    }

    /// One reconcile of the served object; the writes it made.
    pub(super) async fn reconcile(&self) -> (Result<(), Error>, Vec<String>) {
        let object = self.api.lock().unwrap().object.clone();
        let tl: TargetLease = serde_json::from_value(object).unwrap();
        let result = reconcile(Arc::new(tl), self.ctx.clone()).await.map(|_| ());
        let writes = std::mem::take(&mut self.api.lock().unwrap().writes);
        (result, writes)
    }

    pub(super) async fn token_in_store(&self) -> Option<u64> {
        let reply = self.store.get(&Target::new("ns", "db")).await.unwrap();
        reply.lease.map(|l| l.fencing_token)
    }

    pub(super) fn status(&self, field: &str) -> Value {
        self.api.lock().unwrap().object["status"][field].clone()
    }
}
