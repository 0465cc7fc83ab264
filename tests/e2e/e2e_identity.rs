//! Who may use a lane, on a real API server: `lanekeeper gateway
//! --configmap` with a ServiceAccount that holds exactly the chart's
//! gateway rules (its ConfigMap; Secrets list/watch in the lanes'
//! namespace; TokenReview create, copied from the rendered chart), a
//! lanes.json whose P1 lists a ServiceAccount and an API-key Secret.
//!
//! - ServiceAccount tokens through TokenReview: one with the gateway's
//!   audience is admitted; one with another audience, or the API server's
//!   default one, is a 401; once the ServiceAccount is deleted its token
//!   stops working (within the review cache's 10 s).
//! - API-key Secrets created, rotated and deleted while traffic flows: a
//!   key works once its Secret exists, the old key stops and the new one
//!   works after a rotation, and nothing works once the Secret is gone; no
//!   request of the steady stream gets anything but 200 or 401.
//! - JWTs of an issuer whose JWKS is in a ConfigMap (an air-gapped
//!   cluster): a valid one is admitted, an expired one is a 401.
//! - The rules are needed: a second gateway whose ServiceAccount lacks the
//!   identity rules answers a ServiceAccount token or a JWT with 503 (the
//!   review or the ConfigMap is forbidden, never taken as a pass) and
//!   admits no API key.

use crate::e2e_controller::{GatewayProc, gateway, lanes_configmap, rolebinding};
use crate::support;
use crate::world::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::{Cluster, connect, eventually};

const AUDIENCE: &str = "lanekeeper-e2e";
const P1: &str = "p1-agent-assist";
const KEY_A: &str = "sk-e2e-team-a-0123456789abcdef";
const KEY_B: &str = "sk-e2e-team-b-0123456789abcdef";
const ISSUER: &str = "https://idp.e2e.example";

/// An Ed25519 signing key made for the test: (PKCS#8, public JWKS).
fn signing_key() -> (Vec<u8>, Value) {
    use base64::Engine;
    use ring::signature::{Ed25519KeyPair, KeyPair};
    let doc = Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).unwrap();
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
    let jwks =
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "e2e", "alg": "EdDSA"}]});
    (doc.as_ref().to_vec(), jwks)
}

fn jwt(pkcs8: &[u8], exp_in: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    h.kid = Some("e2e".into());
    let claims = json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "svc", "team": "search", "exp": now + exp_in});
    jsonwebtoken::encode(&h, &claims, &jsonwebtoken::EncodingKey::from_ed_der(pkcs8)).unwrap()
}

/// The INC-47 config with P1 open to the ServiceAccount `caller` and the
/// keys of the Secret `agent-keys`, both of `ns`.
fn identity_config(ns: &str) -> String {
    let path = support::cluster::repo().join("examples/inc-47/lanes-420.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let p1 = v["lanes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"] == P1)
        .unwrap();
    p1["clients"] = json!([
        {"serviceAccount": {"namespace": ns, "name": "caller"}, "tenant": "callers"},
        {"apiKeys": {"namespace": ns, "secret": "agent-keys"}},
        {"jwt": {"issuer": ISSUER, "audience": AUDIENCE,
                 "jwks": {"configMap": {"namespace": ns, "name": "idp-jwks", "key": "jwks.json"}}},
         "tenantClaim": "team"}
    ]);
    let mut cfg: lanes::GatewayConfig = serde_json::from_value(v).unwrap();
    cfg.content_hash = lanes::hash(&cfg);
    lanes::to_json(&cfg)
}

/// The rules of the chart's gateway identity Role and TokenReview
/// ClusterRole, from the rendered example (manifests/examples/gateway.yaml).
fn chart_identity_rules() -> (Value, Value) {
    let text =
        std::fs::read_to_string(support::cluster::repo().join("manifests/examples/gateway.yaml"))
            .unwrap();
    let docs: Vec<Value> = text
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str::<Value>(d).ok())
        .filter(|d| d.is_object())
        .collect();
    let rules = |kind: &str, suffix: &str| {
        docs.iter()
            .find(|d| {
                d["kind"] == kind && d["metadata"]["name"].as_str().unwrap().ends_with(suffix)
            })
            .unwrap_or_else(|| panic!("the chart renders a {kind} *{suffix}"))["rules"]
            .clone()
    };
    (
        rules("Role", "-gateway-identity"),
        rules("ClusterRole", "-gateway-tokenreview"),
    )
}

/// The gateway's objects: two ServiceAccounts (one with the chart's
/// identity rules, one without), the ConfigMap Role, and the config.
async fn setup(c: &Cluster, ns: &str, cluster_role: &str, jwks: &Value) {
    let (role_rules, review_rules) = chart_identity_rules();
    let sa = |name: &str| json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}});
    let objects = [
        sa("gateway"),
        sa("gateway-blind"),
        sa("caller"),
        sa("stranger"),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "gateway-config", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CONFIG], "verbs": ["get", "list", "watch"]}]
        }),
        rolebinding(ns, "gateway-config", &["gateway", "gateway-blind"]),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "gateway-identity", "namespace": ns},
            "rules": role_rules
        }),
        rolebinding(ns, "gateway-identity", &["gateway"]),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": cluster_role},
            "rules": review_rules
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": cluster_role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": "gateway", "namespace": ns}]
        }),
        lanes_configmap(ns, &identity_config(ns)),
        // The JWKS of an issuer the cluster cannot reach, and the rule the
        // chart renders for `gateway.auth.jwksConfigMaps: [idp-jwks]`.
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "idp-jwks", "namespace": ns},
            "data": {"jwks.json": jwks.to_string()}
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "gateway-jwks", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["idp-jwks"], "verbs": ["get"]}]
        }),
        rolebinding(ns, "gateway-jwks", &["gateway"]),
    ];
    for o in &objects {
        c.apply(o)
            .await
            .unwrap_or_else(|e| panic!("apply {}: {e}", o["metadata"]["name"]));
    }
}

/// Deletes the cluster-scoped objects also when the test fails.
struct DeleteClusterRole<'a>(&'a Cluster, String);

impl Drop for DeleteClusterRole<'_> {
    fn drop(&mut self) {
        for kind in ["clusterrolebinding", "clusterrole"] {
            let _ = self
                .0
                .kubectl(&["delete", kind, &self.1, "--ignore-not-found"]);
        }
    }
}

async fn status(http: &reqwest::Client, g: &GatewayProc, bearer: Option<&str>) -> u16 {
    let mut r = http
        .post(format!("http://{}/v1/chat/completions", g.addr))
        .header("x-lanekeeper-lane", P1)
        .body(r#"{"model":"m","messages":[]}"#);
    if let Some(b) = bearer {
        r = r.bearer_auth(b);
    }
    match r.send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

fn token(c: &Cluster, ns: &str, sa: &str, audience: Option<&str>) -> String {
    let mut args = vec!["-n", ns, "create", "token", sa, "--duration=10m"];
    let aud = audience.map(|a| format!("--audience={a}"));
    if let Some(a) = &aud {
        args.push(a);
    }
    c.kubectl_ok(&args).trim().to_owned()
}

fn secret(ns: &str, key: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "agent-keys", "namespace": ns},
        "stringData": {"team-a": key}
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn service_account_tokens_jwts_and_api_key_secrets_decide_who_may_use_a_lane() {
    let Some(c) =
        connect("service_account_tokens_jwts_and_api_key_secrets_decide_who_may_use_a_lane").await
    else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let guard = c.namespace("gwid").await;
    let ns = guard.name.as_str();
    let cluster_role = format!("{ns}-gateway-tokenreview");
    let _cleanup = DeleteClusterRole(&c, cluster_role.clone());
    let (pkcs8, jwks) = signing_key();
    setup(&c, ns, &cluster_role, &jwks).await;
    let configmap = format!("{ns}/{CONFIG}");
    let aud = format!("--token-audience={AUDIENCE}");
    let kc = c.service_account_kubeconfig(ns, "gateway").await;
    let g = gateway(&kc, &configmap, &[&aud], "gwid");
    let blind_kc = c.service_account_kubeconfig(ns, "gateway-blind").await;
    let blind = gateway(&blind_kc, &configmap, &[&aud], "gwid-blind");
    let http = reqwest::Client::new();

    // ServiceAccount tokens.
    let good = token(&c, ns, "caller", Some(AUDIENCE));
    eventually("the caller's token admitted", T, || async {
        (status(&http, &g, Some(&good)).await == 200).then_some(())
    })
    .await;
    assert_eq!(status(&http, &g, None).await, 401, "no credential");
    let other_aud = token(&c, ns, "caller", Some("someone-else"));
    assert_eq!(
        status(&http, &g, Some(&other_aud)).await,
        401,
        "another audience"
    );
    let default_aud = token(&c, ns, "caller", None);
    assert_eq!(
        status(&http, &g, Some(&default_aud)).await,
        401,
        "the API server's audience"
    );
    let stranger = token(&c, ns, "stranger", Some(AUDIENCE));
    assert_eq!(
        status(&http, &g, Some(&stranger)).await,
        401,
        "a ServiceAccount no lane lists"
    );
    assert_eq!(
        status(&http, &blind, Some(&good)).await,
        503,
        "without TokenReview create the token cannot be checked: never a pass"
    );

    // JWTs checked against the JWKS in a ConfigMap.
    assert_eq!(
        status(&http, &g, Some(&jwt(&pkcs8, 300))).await,
        200,
        "a JWT of the issuer"
    );
    assert_eq!(
        status(&http, &g, Some(&jwt(&pkcs8, -300))).await,
        401,
        "an expired JWT"
    );
    assert_eq!(
        status(&http, &blind, Some(&jwt(&pkcs8, 300))).await,
        503,
        "a gateway that may not read the JWKS ConfigMap admits no JWT"
    );

    // API-key Secrets while traffic flows.
    let stop = Arc::new(AtomicBool::new(false));
    let stream = {
        let (http, addr, stop) = (http.clone(), g.addr.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen = std::collections::BTreeMap::<u16, u32>::new();
            while !stop.load(Ordering::Relaxed) {
                let s = http
                    .post(format!("http://{addr}/v1/chat/completions"))
                    .header("x-lanekeeper-lane", P1)
                    .bearer_auth(KEY_B)
                    .body("{}")
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16());
                *seen.entry(s).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen
        })
    };
    assert_eq!(status(&http, &g, Some(KEY_A)).await, 401, "no Secret yet");
    c.apply(&secret(ns, KEY_A)).await.unwrap();
    eventually("key A admitted once its Secret exists", T, || async {
        (status(&http, &g, Some(KEY_A)).await == 200).then_some(())
    })
    .await;
    c.apply(&secret(ns, KEY_B)).await.unwrap();
    let rotated = std::time::Instant::now();
    eventually("key B admitted after the rotation", T, || async {
        (status(&http, &g, Some(KEY_B)).await == 200).then_some(())
    })
    .await;
    assert_eq!(
        status(&http, &g, Some(KEY_A)).await,
        401,
        "the old key stopped"
    );
    eprintln!(
        "the rotated key worked {:?} after the write",
        rotated.elapsed()
    );
    c.kubectl_ok(&["-n", ns, "delete", "secret", "agent-keys"]);
    eventually("no key once the Secret is deleted", T, || async {
        (status(&http, &g, Some(KEY_B)).await == 401).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let seen = stream.await.unwrap();
    assert!(
        seen.keys().all(|s| *s == 200 || *s == 401) && seen.contains_key(&200),
        "the stream during the rotation: {seen:?}"
    );
    c.apply(&secret(ns, KEY_A)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        status(&http, &blind, Some(KEY_A)).await,
        401,
        "a gateway that may not read Secrets admits no key"
    );

    // A deleted ServiceAccount's token stops working (the review cache
    // holds an answer for 10 s).
    c.kubectl_ok(&["-n", ns, "delete", "serviceaccount", "caller"]);
    eventually("the deleted ServiceAccount's token refused", T, || async {
        (status(&http, &g, Some(&good)).await == 401).then_some(())
    })
    .await;
    let log = g.log_text();
    assert!(
        !log.contains("Forbidden"),
        "the gateway was refused something: {log}"
    );
    assert!(
        blind.log_text().contains("Forbidden") || blind.log_text().contains("forbidden"),
        "the blind gateway was refused: {}",
        blind.log_text()
    );
}
