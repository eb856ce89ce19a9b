//! The lease-id key kept in a Kubernetes Secret that the operator creates
//! itself, once, on first start (`--lease-id-key-secret`).
//!
//! Rendering the key in the Helm chart cannot work with GitOps tools: they
//! render with `helm template`, where `lookup` sees no cluster, so every sync
//! would produce a new key and no lease acquired under the old one could be
//! renewed. Generated in the cluster instead, the key exists exactly once:
//! every replica reads the Secret, and when it does not exist yet, tries to
//! create it with a fresh random key. Create is atomic in the API server, so
//! when replicas race exactly one create succeeds and every other replica
//! reads what the winner wrote (409 → read again). An existing Secret is
//! never modified (it is created `immutable`); one without the expected data
//! key is refused rather than repaired.
//!
//! Whoever could create Secrets in the release namespace before the operator
//! first started could have planted a key they know, and with it derive every
//! lease id the operator hands out. Given its own ServiceAccount (which the
//! chart creates at install), the operator refuses a key Secret created
//! before that ServiceAccount: it predates the installation, so this operator
//! did not make it. Creation times are set by the API server and cannot be
//! chosen by whoever creates an object.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ObjectMeta, PostParams};

use super::LeaseIdKey;

/// The data key that holds the secret bytes.
pub const DATA_KEY: &str = "key";

/// How the key was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Read from a Secret that already existed.
    Existing,
    /// This call created the Secret.
    Created,
}

/// Why the key could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The API server answered in a way retrying will not change (forbidden,
    /// a Secret without the key, a key too short).
    #[error("{0}")]
    Permanent(String),
    /// The API server could not be reached, or answered with a transient error.
    #[error("{0}")]
    Transient(String),
}

fn classify(what: &str, e: kube::Error) -> KeyError {
    match &e {
        kube::Error::Api(s) if s.code == 403 || s.code == 401 || s.code == 422 => {
            KeyError::Permanent(format!("{what}: {}", s.message))
        }
        kube::Error::Api(s) if s.code < 500 && s.code != 429 && s.code != 409 => {
            KeyError::Permanent(format!("{what}: {}", s.message))
        }
        _ => KeyError::Transient(format!("{what}: {e}")),
    }
}

fn key_of(secret: &Secret, ns: &str, name: &str) -> Result<LeaseIdKey, KeyError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .map(|b| b.0.clone())
        .unwrap_or_default();
    if bytes.is_empty() {
        return Err(KeyError::Permanent(format!(
            "Secret {ns}/{name} exists but has no data key `{DATA_KEY}`: it was not created by \
             targetlease. Delete it (the operator then creates it), or add the key"
        )));
    }
    LeaseIdKey::new(&bytes).map_err(|e| KeyError::Permanent(format!("Secret {ns}/{name}: {e}")))
}

fn fresh_secret(name: &str) -> Secret {
    // 48 random bytes, base64 encoded: 64 printable characters, like the key
    // the chart used to generate (so both kinds of Secret look alike).
    let bytes: [u8; 48] = rand::random();
    let text = base64_encode(&bytes);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    "targetlease".to_owned(),
                ),
                ("targetlease.dev/lease-id-key".to_owned(), "true".to_owned()),
            ])),
            annotations: Some(BTreeMap::from([(
                "targetlease.dev/note".to_owned(),
                "Created once by the targetlease operator; lease ids are derived from it. \
                 Deleting or changing it makes the published leases unrenewable."
                    .to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        immutable: Some(true),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            DATA_KEY.to_owned(),
            ByteString(text.into_bytes()),
        )])),
        ..Secret::default()
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// When ServiceAccount `ns/name` was created: the installation's start.
pub async fn installed_at(client: &kube::Client, ns: &str, name: &str) -> Result<Time, KeyError> {
    let what = format!("read ServiceAccount {ns}/{name}");
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| classify(&what, e))?;
    sa.metadata
        .creation_timestamp
        .ok_or_else(|| KeyError::Transient(format!("{what}: no creation time yet")))
}

/// Refuses an existing key Secret created before the installation.
fn not_planted(
    existing: &Secret,
    ns: &str,
    name: &str,
    since: Option<&Time>,
) -> Result<(), KeyError> {
    let (Some(since), Some(created)) = (since, existing.metadata.creation_timestamp.as_ref())
    else {
        return Ok(());
    };
    if created.0 < since.0 {
        return Err(KeyError::Permanent(format!(
            "Secret {ns}/{name} was created at {}, before this installation's ServiceAccount \
             ({}): this operator did not make it, and whoever did knows the key lease ids are \
             derived from. Delete it if you know where it came from (the operator then creates \
             a new key), or name a Secret of your own with leaseIdKey.existingSecret",
            created.0, since.0
        )));
    }
    Ok(())
}

/// Reads the key from Secret `ns/name`, creating the Secret with a random key
/// if it does not exist. Safe to call from any number of replicas at once:
/// all of them end up with the same key.
pub async fn load_or_create(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<(LeaseIdKey, Origin), KeyError> {
    load_or_create_since(client, ns, name, None).await
}

/// [`load_or_create`], refusing an existing Secret created before `since`
/// (the installation's start, [`installed_at`]).
pub async fn load_or_create_since(
    client: &kube::Client,
    ns: &str,
    name: &str,
    since: Option<&Time>,
) -> Result<(LeaseIdKey, Origin), KeyError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    // Two rounds cover the race: absent → create loses (409) → read the winner's.
    for _ in 0..2 {
        let what = format!("read Secret {ns}/{name}");
        if let Some(existing) = api.get_opt(name).await.map_err(|e| classify(&what, e))? {
            not_planted(&existing, ns, name, since)?;
            return Ok((key_of(&existing, ns, name)?, Origin::Existing));
        }
        match api
            .create(&PostParams::default(), &fresh_secret(name))
            .await
        {
            Ok(created) => return Ok((key_of(&created, ns, name)?, Origin::Created)),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(classify(&format!("create Secret {ns}/{name}"), e)),
        }
    }
    Err(KeyError::Transient(format!(
        "Secret {ns}/{name} was created and deleted again while the operator started"
    )))
}

/// [`load_or_create`], retrying transient failures with capped backoff until
/// `stop` says so (the API server may start after the operator). With
/// `service_account` (the operator's own, in `ns`), a Secret older than it is
/// refused.
pub async fn load_or_create_retrying(
    client: &kube::Client,
    ns: &str,
    name: &str,
    service_account: Option<&str>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<Option<(LeaseIdKey, Origin)>, String> {
    let mut delay = Duration::from_millis(200);
    loop {
        let attempt = async {
            let since = match service_account {
                Some(sa) => Some(installed_at(client, ns, sa).await?),
                None => None,
            };
            load_or_create_since(client, ns, name, since.as_ref()).await
        };
        match attempt.await {
            Ok(found) => return Ok(Some(found)),
            Err(KeyError::Permanent(e)) => return Err(e),
            Err(KeyError::Transient(e)) => {
                tracing::warn!(error = %e, retry_in = ?delay, "cannot read the lease-id key yet")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {},
            _ = stop.wait_for(|s| *s) => return Ok(None),
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(&[0xff; 48]).len(), 64);
    }

    #[test]
    fn a_fresh_secret_is_immutable_and_holds_a_usable_key() {
        let s = fresh_secret("k");
        assert_eq!(s.immutable, Some(true));
        let key = key_of(&s, "ns", "k").unwrap();
        assert_eq!(key.derive("a").len(), 64);
        assert_ne!(fresh_secret("k").data, s.data, "random each time");
        let empty = Secret::default();
        let err = key_of(&empty, "ns", "k").unwrap_err().to_string();
        assert!(err.contains("no data key `key`"), "{err}");
    }

    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use kube::client::Body;

    /// A fake API server: answers each request with the next canned reply
    /// (status, JSON body) and records `METHOD path` of every request.
    fn fake_api(replies: Vec<(u16, serde_json::Value)>) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(replies.into_iter()));
        let log = seen.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            log.lock()
                .unwrap()
                .push(format!("{} {}", req.method(), req.uri().path()));
            let (code, body) = replies
                .lock()
                .unwrap()
                .next()
                .unwrap_or_else(|| panic!("unexpected request {} {}", req.method(), req.uri()));
            async move {
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap(),
                )
            }
        });
        (kube::Client::new(svc, "ns"), seen)
    }

    fn status(code: u16, reason: &str) -> serde_json::Value {
        serde_json::json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": reason, "reason": reason, "code": code })
    }

    const PATH: &str = "/api/v1/namespaces/ns/secrets";

    /// The race, step by step: this replica sees no Secret, another replica
    /// creates it first (409), and this one reads back what the winner wrote,
    /// never the key it generated itself.
    #[tokio::test]
    async fn a_replica_that_loses_the_create_uses_the_winners_key() {
        let winner = fresh_secret("k");
        let winner_key = key_of(&winner, "ns", "k").unwrap().derive("probe");
        let (client, seen) = fake_api(vec![
            (404, status(404, "NotFound")),
            (409, status(409, "AlreadyExists")),
            (200, serde_json::to_value(&winner).unwrap()),
        ]);
        let (key, origin) = load_or_create(&client, "ns", "k").await.unwrap();
        assert_eq!(origin, Origin::Existing);
        assert_eq!(key.derive("probe"), winner_key);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                format!("GET {PATH}/k"),
                format!("POST {PATH}"),
                format!("GET {PATH}/k")
            ],
            "read, create, read back: nothing is ever replaced or patched"
        );
    }

    #[tokio::test]
    async fn an_existing_key_is_only_read() {
        let existing = fresh_secret("k");
        let (client, seen) = fake_api(vec![(200, serde_json::to_value(&existing).unwrap())]);
        let (key, origin) = load_or_create(&client, "ns", "k").await.unwrap();
        assert_eq!(origin, Origin::Existing);
        assert_eq!(
            key.derive("probe"),
            key_of(&existing, "ns", "k").unwrap().derive("probe")
        );
        assert_eq!(*seen.lock().unwrap(), [format!("GET {PATH}/k")]);
    }

    #[tokio::test]
    async fn the_created_key_is_the_one_the_api_server_stored() {
        // The create's reply is what the API server stored: the replica
        // uses that, not a copy of what it sent.
        let stored = fresh_secret("k");
        let stored_key = key_of(&stored, "ns", "k").unwrap().derive("probe");
        let (client, seen) = fake_api(vec![
            (404, status(404, "NotFound")),
            (201, serde_json::to_value(&stored).unwrap()),
        ]);
        let (key, origin) = load_or_create(&client, "ns", "k").await.unwrap();
        assert_eq!(origin, Origin::Created);
        assert_eq!(key.derive("probe"), stored_key);
        assert_eq!(
            *seen.lock().unwrap(),
            [format!("GET {PATH}/k"), format!("POST {PATH}")]
        );
    }

    fn created_at(mut secret: Secret, second: i64) -> Secret {
        secret.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
        ));
        secret
    }

    /// A key Secret created before the installation's ServiceAccount was
    /// planted by someone else: refused, never used. One created at or after
    /// it is the operator's own.
    #[tokio::test]
    async fn a_secret_older_than_the_installation_is_refused() {
        let since = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
        let planted = created_at(fresh_secret("k"), 999);
        let (client, seen) = fake_api(vec![(200, serde_json::to_value(&planted).unwrap())]);
        let r = load_or_create_since(&client, "ns", "k", Some(&since)).await;
        assert!(
            matches!(&r, Err(KeyError::Permanent(m)) if m.contains("before this installation's ServiceAccount")),
            "{:?}",
            r.map(|(_, o)| o)
        );
        assert_eq!(
            *seen.lock().unwrap(),
            [format!("GET {PATH}/k")],
            "nothing written"
        );
        for second in [1_000, 1_001] {
            let own = created_at(fresh_secret("k"), second);
            let (client, _) = fake_api(vec![(200, serde_json::to_value(&own).unwrap())]);
            let (_, origin) = load_or_create_since(&client, "ns", "k", Some(&since))
                .await
                .unwrap();
            assert_eq!(origin, Origin::Existing);
        }
    }

    #[tokio::test]
    async fn forbidden_is_permanent_and_unavailable_is_transient() {
        let (client, _) = fake_api(vec![(403, status(403, "Forbidden"))]);
        let r = load_or_create(&client, "ns", "k").await;
        assert!(matches!(r, Err(KeyError::Permanent(_))), "{:?}", r.err());
        let (client, _) = fake_api(vec![(503, status(503, "ServiceUnavailable"))]);
        let r = load_or_create(&client, "ns", "k").await;
        assert!(matches!(r, Err(KeyError::Transient(_))), "{:?}", r.err());
    }
}
