//! Who may use a lane, in-process: the real router and state driven with
//! tower's `oneshot`, each identity kind and each refusal, and a property:
//! no request without an allowed identity reaches the upstream or takes a
//! token. The routes lead to a loopback port where nothing listens, so an
//! admitted request ends as a 502 `upstream_error` (it was sent); the JWKS
//! and the upstream that records what it gets are servers the tests start
//! on loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use clap::Parser;
use lanes::{
    ApiKeySecret, ClientIdentity, ClientRule, GatewayConfig, JwksSource, JwtIssuer,
    ServiceAccountName,
};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::super::args::GatewayArgs;
use super::super::peer::PeerCertificate;
use super::super::run::proxy_router;
use super::super::state::Gateway;
use super::api_key::sha256;
use super::credentials::Credentials;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: GatewayArgs,
}

const P0: &str = "p0-disruption-assist";
const P1: &str = "p1-agent-assist";
const P3: &str = "p3-shift-batch";
const KEY_A: &str = "sk-team-a-0123456789abcdef";
const KEY_B: &str = "sk-team-b-0123456789abcdef";

fn example() -> GatewayConfig {
    let text = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/inc-47/lanes-420.json"
    ))
    .expect("the example config");
    GatewayConfig::from_json(&text).expect("valid")
}

fn secret() -> ApiKeySecret {
    ApiKeySecret {
        namespace: "ai-platform".into(),
        secret: "agent-keys".into(),
    }
}

/// The example with `rules` added to lanes by name.
fn with_clients(rules: &[(&str, ClientRule)]) -> GatewayConfig {
    let mut cfg = example();
    for (lane, rule) in rules {
        let l = cfg.lanes.iter_mut().find(|l| l.name == *lane).unwrap();
        l.clients.push(rule.clone());
    }
    cfg.with_hash()
}

fn rule(identity: ClientIdentity, tenant: Option<&str>) -> ClientRule {
    ClientRule {
        identity,
        tenant: tenant.map(str::to_owned),
        tenant_claim: None,
    }
}

/// A gateway whose routes lead nowhere (nothing listens on port 1 of
/// loopback: a pass is a 502), `agent-large` (P0's and P1's route) to
/// `agent_large` when given.
fn gateway_to(cfg: GatewayConfig, extra: &[&str], agent_large: Option<&str>) -> Arc<Gateway> {
    let routes: Vec<String> = ["agent-large", "extract-small", "batch-medium", "eval-large"]
        .iter()
        .map(|r| match (*r, agent_large) {
            ("agent-large", Some(url)) => format!("{r}={url}"),
            _ => format!("{r}=http://127.0.0.1:1"),
        })
        .collect();
    let mut argv = vec!["gw", "--config", "unused.json"];
    for r in &routes {
        argv.extend(["--route", r.as_str()]);
    }
    argv.extend_from_slice(extra);
    let gw = Arc::new(Gateway::new(Cli::parse_from(argv).args, true));
    gw.install(cfg, "test");
    gw
}

fn gateway(cfg: GatewayConfig, extra: &[&str]) -> Arc<Gateway> {
    gateway_to(cfg, extra, None)
}

/// A request to the router: headers, and a client certificate when given.
async fn send(
    gw: &Arc<Gateway>,
    headers: &[(&str, &str)],
    cert: Option<&[&str]>,
) -> (StatusCode, Value, header::HeaderMap) {
    let mut req = Request::post("/v1/chat/completions");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Body::from("{}")).unwrap();
    if let Some(names) = cert {
        req.extensions_mut().insert(PeerCertificate {
            names: names.iter().map(|n| n.to_string()).collect(),
        });
    }
    let resp = proxy_router(gw.clone()).oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    (
        parts.status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        parts.headers,
    )
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

fn page(gw: &Gateway) -> String {
    String::from_utf8(gw.metrics.encode().unwrap().1).unwrap()
}

fn refusals(gw: &Gateway, reason: &str) -> f64 {
    let needle = format!("lanekeeper_gateway_auth_refusals_total{{reason=\"{reason}\"}} ");
    page(gw)
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {needle}"))
}

/// Whether the core saw any request at all (every admit is counted).
fn core_saw_requests(gw: &Gateway) -> bool {
    page(gw)
        .lines()
        .any(|l| l.starts_with("lanekeeper_gateway_requests_total{"))
}

/// Admitted, and sent to a route where nothing listens.
fn admitted(status: StatusCode, body: &Value) -> bool {
    status == StatusCode::BAD_GATEWAY && body["error"]["code"] == "upstream_error"
}

fn keys_gateway() -> Arc<Gateway> {
    let cfg = with_clients(&[
        (P1, rule(ClientIdentity::ApiKeys(secret()), None)),
        (P3, rule(ClientIdentity::ApiKeys(secret()), Some("shift"))),
    ]);
    let gw = gateway(cfg, &[]);
    gw.identity
        .secret_keys(secret(), vec![("team-a".into(), sha256(KEY_A.as_bytes()))]);
    gw
}

#[tokio::test]
async fn no_credential_is_a_401_that_costs_no_token() {
    let gw = keys_gateway();
    let (status, body, headers) = send(&gw, &[("x-lanekeeper-lane", P1)], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "missing_credential");
    assert!(
        headers[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    assert_eq!(refusals(&gw, "no_credential"), 1.0);
    // Another scheme is no credential either.
    let (status, _, _) = send(&gw, &[("authorization", "Basic dTpw")], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!core_saw_requests(&gw), "the core was never asked");
}

#[tokio::test]
async fn a_key_of_the_secret_admits_into_its_lanes_and_a_wrong_key_is_a_401() {
    let gw = keys_gateway();
    let a = bearer(KEY_A);
    let (status, body, _) = send(
        &gw,
        &[("authorization", &a), ("x-lanekeeper-lane", P1)],
        None,
    )
    .await;
    assert!(admitted(status, &body), "{status} {body}");
    let (status, body, _) = send(
        &gw,
        &[("authorization", &bearer(KEY_B)), ("x-lanekeeper-lane", P1)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "invalid_credential");
    assert_eq!(refusals(&gw, "unknown_api_key"), 1.0);
    // Two lanes: the header must choose.
    let (status, body, _) = send(&gw, &[("authorization", &a)], None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "lane_required");
}

#[tokio::test]
async fn a_lane_the_identity_may_not_use_is_a_403_that_lists_no_lanes() {
    let gw = keys_gateway();
    let a = bearer(KEY_A);
    for asked in [P0, "p9-does-not-exist"] {
        let (status, body, _) = send(
            &gw,
            &[("authorization", &a), ("x-lanekeeper-lane", asked)],
            None,
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{asked}");
        assert_eq!(body["error"]["code"], "lane_not_allowed");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(asked), "{msg}");
        for other in [P0, P1, P3, "p2-email-extract", "p4-eval-backfill"] {
            assert!(
                other == asked || !msg.contains(other),
                "{msg} lists {other}"
            );
        }
    }
    assert_eq!(refusals(&gw, "lane_not_allowed"), 2.0);
    assert!(!core_saw_requests(&gw));
}

#[tokio::test]
async fn a_revoked_or_rotated_key_stops_working_at_once() {
    let gw = keys_gateway();
    let lane = ("x-lanekeeper-lane", P1);
    let (a, b) = (bearer(KEY_A), bearer(KEY_B));
    // Rotated: the Secret now holds key B only.
    gw.identity
        .secret_keys(secret(), vec![("team-a".into(), sha256(KEY_B.as_bytes()))]);
    let (status, _, _) = send(&gw, &[("authorization", &a), lane], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body, _) = send(&gw, &[("authorization", &b), lane], None).await;
    assert!(admitted(status, &body), "{status} {body}");
    // Deleted: no key works.
    gw.identity.secret_gone(&secret());
    let (status, _, _) = send(&gw, &[("authorization", &b), lane], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A config that no longer names the Secret: its keys grant nothing.
    gw.identity
        .secret_keys(secret(), vec![("team-a".into(), sha256(KEY_B.as_bytes()))]);
    gw.install(example(), "test");
    let (status, _, _) = send(&gw, &[("authorization", &b), lane], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_identity_names_the_tenant_and_the_tenant_header_is_ignored() {
    let gw = keys_gateway();
    let parts = |lane: &str| {
        let (parts, ()) = Request::post("/v1/chat/completions")
            .header("authorization", bearer(KEY_A))
            .header("x-lanekeeper-lane", lane)
            .header("x-lanekeeper-tenant", "someone-else")
            .body(())
            .unwrap()
            .into_parts();
        parts
    };
    let c = gw
        .identity
        .caller(&parts(P1), Some(P1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (c.lane.as_str(), c.tenant.as_str()),
        (P1, "team-a"),
        "the Secret's data key"
    );
    let c = gw
        .identity
        .caller(&parts(P3), Some(P3))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.tenant, "shift", "the rule's tenant");
    // Through the router: counted as a named tenant, whatever the header.
    let (status, body, _) = send(
        &gw,
        &[("authorization", &bearer(KEY_A)), ("x-lanekeeper-lane", P1)],
        None,
    )
    .await;
    assert!(admitted(status, &body));
    assert!(page(&gw).contains(&format!(
        "lanekeeper_gateway_requests_total{{attempt=\"original\",lane=\"{P1}\",outcome=\"admitted\",tenant_class=\"named\"}} 1"
    )));
}

#[tokio::test]
async fn the_credentials_file_admits_by_hash_and_one_lane_needs_no_header() {
    let gw = gateway(example(), &["--api-key-header", "x-api-key"]);
    let hex: String = sha256(KEY_A.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let file = format!(
        "apiKeys:\n  - sha256: {hex}\n    tenant: team-a\n    lanes: [{P1}, lane-of-another-config]\n"
    );
    gw.identity
        .credentials_loaded(Credentials::parse(file.as_bytes()).unwrap());
    let (status, body, _) = send(&gw, &[("authorization", &bearer(KEY_A))], None).await;
    assert!(admitted(status, &body), "its one lane: {status} {body}");
    let (status, body, _) = send(&gw, &[("x-api-key", KEY_A)], None).await;
    assert!(admitted(status, &body), "--api-key-header: {status} {body}");
    let (status, _, _) = send(&gw, &[("x-api-key", KEY_B)], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = send(
        &gw,
        &[("authorization", &bearer(KEY_A)), ("x-lanekeeper-lane", P0)],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// An upstream on loopback that answers 200 and keeps the headers of the
/// last request.
async fn recording_upstream() -> (String, Arc<std::sync::Mutex<Option<header::HeaderMap>>>) {
    let seen = Arc::new(std::sync::Mutex::new(None));
    let s = seen.clone();
    let app = axum::Router::new().fallback(move |h: header::HeaderMap| {
        *s.lock().unwrap() = Some(h);
        async { "{}" }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

#[tokio::test]
async fn the_credential_never_goes_upstream() {
    let (url, seen) = recording_upstream().await;
    let cfg = with_clients(&[(P1, rule(ClientIdentity::ApiKeys(secret()), None))]);
    let gw = gateway_to(cfg, &["--api-key-header", "x-api-key"], Some(&url));
    gw.identity
        .secret_keys(secret(), vec![("team-a".into(), sha256(KEY_A.as_bytes()))]);
    for h in [
        ("authorization", bearer(KEY_A)),
        ("x-api-key", KEY_A.to_owned()),
    ] {
        let (status, body, _) = send(&gw, &[(h.0, &h.1), ("x-other", "kept")], None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let got = seen
            .lock()
            .unwrap()
            .take()
            .expect("the upstream was called");
        assert!(
            got.get("authorization").is_none() && got.get("x-api-key").is_none(),
            "{got:?}"
        );
        assert_eq!(got["x-other"], "kept");
    }
}

#[tokio::test]
async fn a_listed_client_certificate_admits_and_another_is_a_401() {
    let cert = ClientIdentity::Certificate(lanes::CertificateName {
        name: "spiffe://cluster.local/ns/ops/sa/pager".into(),
    });
    let gw = gateway(with_clients(&[(P0, rule(cert, Some("ops")))]), &[]);
    let names = ["pager.ops.svc", "spiffe://cluster.local/ns/ops/sa/pager"];
    let (status, body, _) = send(&gw, &[], Some(&names)).await;
    assert!(admitted(status, &body), "{status} {body}");
    let (status, _, _) = send(&gw, &[], Some(&["spiffe://cluster.local/ns/ops/sa/other"])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(refusals(&gw, "unknown_certificate"), 1.0);
    // A token, when sent, decides (here a wrong one).
    let (status, _, _) = send(&gw, &[("authorization", &bearer(KEY_B))], Some(&names)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_service_account_token_without_an_api_server_is_a_503_not_a_pass() {
    let sa = ServiceAccountName {
        namespace: "ai-platform".into(),
        name: "agent".into(),
    };
    let gw = gateway(
        with_clients(&[(P1, rule(ClientIdentity::ServiceAccount(sa), None))]),
        &[],
    );
    let token = unsigned_jwt(
        &json!({"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:ai-platform:agent"}),
    );
    let (status, body, _) = send(&gw, &[("authorization", &bearer(&token))], None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(refusals(&gw, "identity_unavailable"), 1.0);
    // A token claiming a ServiceAccount no lane lists is refused unasked.
    let other = unsigned_jwt(&json!({"sub": "system:serviceaccount:ai-platform:intruder"}));
    let (status, _, _) = send(&gw, &[("authorization", &bearer(&other))], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(refusals(&gw, "rejected_token"), 1.0);
}

#[tokio::test]
async fn trusting_the_lane_header_is_todays_behaviour() {
    let gw = gateway(example(), &["--trust-lane-header"]);
    let (status, body, _) = send(&gw, &[("x-lanekeeper-lane", P1)], None).await;
    assert!(admitted(status, &body), "{status} {body}");
}

/// A JWT with a made-up signature (only its claims are read before a
/// check).
fn unsigned_jwt(claims: &Value) -> String {
    use base64::Engine;
    let e = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!("{}.{}.c2ln", e(&json!({"alg": "RS256"})), e(claims))
}

// ---- JWTs ------------------------------------------------------------------

/// An Ed25519 signing key made for the test, and its public JWK.
struct TestKey {
    pkcs8: Vec<u8>,
    kid: String,
}

impl TestKey {
    fn new(kid: &str) -> TestKey {
        let rng = ring::rand::SystemRandom::new();
        let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        TestKey {
            pkcs8: doc.as_ref().to_vec(),
            kid: kid.into(),
        }
    }

    fn jwk(&self) -> Value {
        use base64::Engine;
        use ring::signature::KeyPair;
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(&self.pkcs8).unwrap();
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
        json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": self.kid, "alg": "EdDSA", "use": "sig"})
    }

    fn sign(&self, claims: &Value) -> String {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(
            &h,
            claims,
            &jsonwebtoken::EncodingKey::from_ed_der(&self.pkcs8),
        )
        .unwrap()
    }
}

/// Serves `app` on loopback: its base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A route that serves `jwks` and counts the fetches.
fn jwks_route(jwks: Value) -> (axum::routing::MethodRouter, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let route = axum::routing::get(move || {
        h.fetch_add(1, Ordering::SeqCst);
        let body = jwks.to_string();
        async move { body }
    });
    (route, hits)
}

/// Serves `jwks` on loopback; counts the fetches.
async fn jwks_server(jwks: Value) -> (String, Arc<AtomicUsize>) {
    let (route, hits) = jwks_route(jwks);
    let base = serve(axum::Router::new().route("/jwks", route)).await;
    (format!("{base}/jwks"), hits)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

const ISSUER: &str = "https://idp.example";

#[tokio::test]
async fn jwts_are_checked_for_signature_issuer_audience_and_time() {
    let key = TestKey::new("k1");
    let (url, hits) = jwks_server(json!({"keys": [key.jwk()]})).await;
    let issuer = JwtIssuer {
        issuer: ISSUER.into(),
        audience: "lanekeeper".into(),
        jwks: JwksSource::Url(url),
        subject: None,
    };
    let mut r = rule(ClientIdentity::Jwt(issuer), None);
    r.tenant_claim = Some("team".into());
    let gw = gateway(with_clients(&[(P1, r)]), &[]);
    let t = now();
    let good = json!({"iss": ISSUER, "aud": "lanekeeper", "sub": "alice", "team": "search", "exp": t + 300, "nbf": t - 10});
    let tweak = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let (status, body, _) = send(&gw, &[("authorization", &bearer(&key.sign(&good)))], None).await;
    assert!(admitted(status, &body), "{status} {body}");
    let (parts, ()) = Request::post("/")
        .header("authorization", bearer(&key.sign(&good)))
        .body(())
        .unwrap()
        .into_parts();
    let c = gw.identity.caller(&parts, None).await.unwrap().unwrap();
    assert_eq!(c.tenant, "search", "the tenant claim");
    let forged = TestKey::new("k1");
    let bad = [
        ("expired", key.sign(&tweak("exp", json!(t - 120)))),
        ("not yet valid", key.sign(&tweak("nbf", json!(t + 120)))),
        (
            "wrong audience",
            key.sign(&tweak("aud", json!("someone-else"))),
        ),
        ("no expiry", {
            let mut c = good.clone();
            c.as_object_mut().unwrap().remove("exp");
            key.sign(&c)
        }),
        ("bad signature", forged.sign(&good)),
        ("unknown key id", TestKey::new("k2").sign(&good)),
        ("no tenant claim", key.sign(&tweak("team", json!(null)))),
    ];
    for (what, token) in &bad {
        let (status, body, _) = send(&gw, &[("authorization", &bearer(token))], None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
    }
    // Another issuer's token (signed by the right key) is not one of ours.
    let evil = key.sign(&tweak("iss", json!("https://evil.example")));
    let (status, _, _) = send(&gw, &[("authorization", &bearer(&evil))], None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(refusals(&gw, "invalid_jwt"), bad.len() as f64 + 1.0);
    // The set was read once; the unknown key id did not make the gateway
    // read it again within the refetch interval.
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_jwks_that_cannot_be_read_is_a_503() {
    let issuer = JwtIssuer {
        issuer: ISSUER.into(),
        audience: "lanekeeper".into(),
        // Nothing listens on port 9 of loopback.
        jwks: JwksSource::Url("http://127.0.0.1:9/jwks".into()),
        subject: None,
    };
    let gw = gateway(
        with_clients(&[(P1, rule(ClientIdentity::Jwt(issuer), None))]),
        &[],
    );
    let key = TestKey::new("k1");
    let t = now();
    let token = key.sign(&json!({"iss": ISSUER, "aud": "lanekeeper", "sub": "a", "exp": t + 60}));
    let (status, _, _) = send(&gw, &[("authorization", &bearer(&token))], None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// A rule for the tokens of `issuer`, whose keys are at `url`.
fn jwt_rule(issuer: &str, url: &str) -> ClientRule {
    let issuer = JwtIssuer {
        issuer: issuer.into(),
        audience: "lanekeeper".into(),
        jwks: JwksSource::Url(url.into()),
        subject: None,
    };
    rule(ClientIdentity::Jwt(issuer), Some("idp"))
}

/// A token of `issuer` for the gateway, signed by `key`, as a header.
fn token_of(key: &TestKey, issuer: &str) -> String {
    let t = now();
    bearer(&key.sign(&json!({"iss": issuer, "aud": "lanekeeper", "sub": "a", "exp": t + 60})))
}

#[tokio::test]
async fn a_jwks_url_that_redirects_is_refused_and_its_target_never_read() {
    // The keys behind the redirect would pass the token: they must not be
    // used. (A redirect is how an https:// URL would be led to http:// or
    // to another host; none is followed.)
    let key = TestKey::new("k1");
    let (keys, hits) = jwks_route(json!({"keys": [key.jwk()]}));
    let moved = axum::routing::get(|| async { axum::response::Redirect::temporary("/keys") });
    let base = serve(
        axum::Router::new()
            .route("/jwks", moved)
            .route("/keys", keys),
    )
    .await;
    let url = format!("{base}/jwks");
    let gw = gateway(with_clients(&[(P1, jwt_rule(ISSUER, &url))]), &[]);
    let (status, body, _) = send(&gw, &[("authorization", &token_of(&key, ISSUER))], None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "identity_unavailable");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the redirect was followed");
    // Said plainly (the WARN log carries the same).
    let err = super::jwks::KeySets::new()
        .get(
            None,
            &super::jwks::KeySource::Issuer(JwksSource::Url(url)),
            false,
        )
        .await
        .unwrap_err();
    assert!(err.contains("redirect"), "{err}");
}

/// The error of a first read of the key set at `url`.
async fn jwks_error(url: &str) -> String {
    super::jwks::KeySets::new()
        .get(
            None,
            &super::jwks::KeySource::Issuer(JwksSource::Url(url.into())),
            false,
        )
        .await
        .unwrap_err()
}

#[tokio::test]
async fn an_endless_jwks_body_is_cut_at_the_limit_not_read_until_the_timeout() {
    // 16 KiB a millisecond, without end (and without Content-Length): read
    // to its end, it would run into the 5 s timeout, and a timeout's error.
    let endless = axum::routing::get(|| async {
        let chunks = futures::stream::unfold((), |()| async {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            let chunk = axum::body::Bytes::from(vec![b' '; 16 << 10]);
            Some((Ok::<_, std::io::Error>(chunk), ()))
        });
        Body::from_stream(chunks)
    });
    let base = serve(axum::Router::new().route("/jwks", endless)).await;
    let err = jwks_error(&format!("{base}/jwks")).await;
    assert!(err.contains("larger than 1048576 bytes"), "{err}");
}

#[tokio::test]
async fn a_jwks_declared_too_large_is_refused_before_its_body() {
    // A Content-Length of 2 MiB, and then nothing: only the header can
    // refuse it before the timeout.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = conn.read(&mut request).await.unwrap();
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2097152\r\n\r\n";
        conn.write_all(head.as_bytes()).await.unwrap();
        std::future::pending::<()>().await;
    });
    let err = jwks_error(&format!("http://{addr}/jwks")).await;
    assert!(err.contains("larger than 1048576 bytes"), "{err}");
}

/// A JWKS on loopback whose answers wait until the test opens the gate.
struct GatedJwks {
    url: String,
    /// Fetches begun.
    hits: Arc<AtomicUsize>,
    /// A message as each fetch arrives.
    arrived: tokio::sync::mpsc::UnboundedReceiver<()>,
    /// `true` lets every fetch, waiting or to come, have its answer.
    gate: tokio::sync::watch::Sender<bool>,
}

async fn gated_jwks(jwks: Value) -> GatedJwks {
    let hits = Arc::new(AtomicUsize::new(0));
    let (arrive, arrived) = tokio::sync::mpsc::unbounded_channel();
    let (gate, open) = tokio::sync::watch::channel(false);
    let (h, body) = (hits.clone(), jwks.to_string());
    let route = axum::routing::get(move || {
        h.fetch_add(1, Ordering::SeqCst);
        let _ = arrive.send(());
        let (mut open, body) = (open.clone(), body.clone());
        async move {
            let _ = open.wait_for(|o| *o).await;
            body
        }
    });
    let base = serve(axum::Router::new().route("/jwks", route)).await;
    GatedJwks {
        url: format!("{base}/jwks"),
        hits,
        arrived,
        gate,
    }
}

/// The identity check of a request with this `Authorization`, in a task of
/// its own (the upstream left out: a run of 502s would open its breaker):
/// the tenant of the caller, or why there is none.
fn check_later(
    gw: &Arc<Gateway>,
    authorization: String,
) -> tokio::task::JoinHandle<Result<String, String>> {
    let gw = gw.clone();
    tokio::spawn(async move {
        let (parts, ()) = Request::post("/v1/chat/completions")
            .header("authorization", authorization)
            .body(())
            .unwrap()
            .into_parts();
        match gw.identity.caller(&parts, None).await {
            Ok(Some(c)) => Ok(c.tenant),
            other => Err(format!("{other:?}")),
        }
    })
}

/// What `check_later` gives a JWT that passes `jwt_rule`.
fn passed() -> Result<String, String> {
    Ok("idp".to_owned())
}

#[tokio::test]
async fn an_issuer_whose_keys_hang_does_not_hold_up_another_issuers_tokens() {
    const SLOW: &str = "https://slow.example";
    let (a, b) = (TestKey::new("a1"), TestKey::new("b1"));
    let mut slow = gated_jwks(json!({"keys": [a.jwk()]})).await;
    let (fast, _) = jwks_server(json!({"keys": [b.jwk()]})).await;
    let cfg = with_clients(&[
        (P1, jwt_rule(SLOW, &slow.url)),
        (P1, jwt_rule(ISSUER, &fast)),
    ]);
    let gw = gateway(cfg, &[]);
    let waiting = check_later(&gw, token_of(&a, SLOW));
    slow.arrived.recv().await.unwrap();
    // The slow issuer's fetch is under way, held until the gate opens (or
    // its 5 s timeout): the other issuer's token is checked meanwhile.
    let other = check_later(&gw, token_of(&b, ISSUER)).await.unwrap();
    assert_eq!(other, passed());
    assert!(!waiting.is_finished(), "the slow fetch ended first");
    slow.gate.send(true).unwrap();
    assert_eq!(waiting.await.unwrap(), passed());
}

#[tokio::test]
async fn the_tokens_of_one_issuer_that_arrive_during_its_fetch_wait_for_that_fetch() {
    let key = TestKey::new("k1");
    let mut jwks = gated_jwks(json!({"keys": [key.jwk()]})).await;
    let gw = gateway(with_clients(&[(P1, jwt_rule(ISSUER, &jwks.url))]), &[]);
    let checks: Vec<_> = (0..8)
        .map(|_| check_later(&gw, token_of(&key, ISSUER)))
        .collect();
    jwks.arrived.recv().await.unwrap();
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    assert!(checks.iter().all(|t| !t.is_finished()), "all wait");
    jwks.gate.send(true).unwrap();
    for c in checks {
        assert_eq!(c.await.unwrap(), passed());
    }
    assert_eq!(jwks.hits.load(Ordering::SeqCst), 1, "one fetch for all");
}

#[tokio::test]
async fn a_fetch_outlives_the_request_that_started_it() {
    // A client that hangs up mid-fetch does not cancel it: the fetch still
    // counts as the issuer's try (no second one for 30 s), so its keys must
    // still arrive, or the issuer would be refused until then.
    let key = TestKey::new("k1");
    let mut jwks = gated_jwks(json!({"keys": [key.jwk()]})).await;
    let gw = gateway(with_clients(&[(P1, jwt_rule(ISSUER, &jwks.url))]), &[]);
    let gone = check_later(&gw, token_of(&key, ISSUER));
    jwks.arrived.recv().await.unwrap();
    gone.abort();
    let later = check_later(&gw, token_of(&key, ISSUER));
    jwks.gate.send(true).unwrap();
    assert_eq!(later.await.unwrap(), passed());
    assert_eq!(jwks.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_stale_key_set_checks_its_own_tokens_at_once_while_the_issuer_hangs() {
    use super::jwks::{KeySets, KeySource};
    use std::time::Duration;
    let key = TestKey::new("k1");
    let mut jwks = gated_jwks(json!({"keys": [key.jwk()]})).await;
    // Every set is past its age at once, and may be read again at once.
    let sets = KeySets::with_ages(Duration::ZERO, Duration::ZERO);
    let source = KeySource::Issuer(JwksSource::Url(jwks.url.clone()));
    jwks.gate.send(true).unwrap();
    sets.get(None, &source, false).await.unwrap();
    jwks.arrived.recv().await.unwrap();
    // From now on the issuer hangs (until its 5 s timeout).
    jwks.gate.send(false).unwrap();
    let rule = JwtIssuer {
        issuer: ISSUER.into(),
        audience: "lanekeeper".into(),
        jwks: JwksSource::Url(jwks.url.clone()),
        subject: None,
    };
    let t = now();
    let token = key.sign(&json!({"iss": ISSUER, "aud": "lanekeeper", "sub": "a", "exp": t + 60}));
    // Its key id is in the kept set: checked with it, without waiting for
    // the issuer (the bound is far below the issuer's 5 s).
    let set = tokio::time::timeout(Duration::from_secs(3), sets.get(None, &source, false))
        .await
        .expect("the kept set answered at once")
        .unwrap();
    assert!(super::jwt::verify(&token, &rule, &set).is_ok());
    // ... and the set is read again in the background.
    jwks.arrived.recv().await.unwrap();
    assert_eq!(jwks.hits.load(Ordering::SeqCst), 2);
    // A key id the set lacks waits for the fetch under way.
    let unknown = tokio::spawn(async move {
        let got = sets.get(None, &source, true).await;
        (got, sets)
    });
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    assert!(!unknown.is_finished(), "a token of an unknown key id waits");
    jwks.gate.send(true).unwrap();
    assert!(unknown.await.unwrap().0.is_ok());
}

// ---- the property ----------------------------------------------------------

/// One lane with a single token that never refills and no queue: a request
/// that took it is the only one ever admitted.
fn one_token_config() -> GatewayConfig {
    let mut cfg = with_clients(&[(P1, rule(ClientIdentity::ApiKeys(secret()), Some("a")))]);
    for l in &mut cfg.lanes {
        l.admitted_requests_per_second = 1e-6;
        l.burst = 1;
        l.queue.max_depth = 0;
        l.spare_capacity = false;
        l.floor_units_per_second = None;
    }
    cfg.with_hash()
}

mod property {
    use super::*;
    use proptest::prelude::*;

    fn request() -> impl Strategy<Value = (Option<String>, Option<String>, Option<String>, bool)> {
        let cred = prop_oneof![
            Just(None),
            Just(Some(bearer(KEY_B))),
            Just(Some("Bearer ".to_owned())),
            Just(Some(format!("Basic {KEY_A}"))),
            Just(Some(bearer(&unsigned_jwt(
                &json!({"iss": ISSUER, "sub": "x"})
            )))),
            "[ -~]{0,40}".prop_map(|s| Some(format!("Bearer {s}"))),
            // The right key, for a lane it may not use (below).
            Just(Some(bearer(KEY_A))),
        ];
        let lane = prop_oneof![
            Just(None),
            Just(Some(P0.to_owned())),
            Just(Some(P3.to_owned())),
            Just(Some(P1.to_owned())),
            "[a-z0-9-]{1,20}".prop_map(Some),
        ];
        let tenant = prop_oneof![Just(None), "[a-z]{1,8}".prop_map(Some)];
        (cred, lane, tenant, any::<bool>())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn no_request_without_an_allowed_identity_reaches_upstream_or_takes_a_token(
            requests in proptest::collection::vec(request(), 1..12)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let gw = gateway(one_token_config(), &[]);
                gw.identity.secret_keys(secret(), vec![("k".into(), sha256(KEY_A.as_bytes()))]);
                for (cred, lane, tenant, cert) in &requests {
                    // The one allowed combination is left out: key A into P1
                    // (or with no lane, its one lane).
                    let allowed = cred.as_deref() == Some(bearer(KEY_A).as_str())
                        && lane.as_deref().is_none_or(|l| l == P1);
                    if allowed {
                        continue;
                    }
                    let mut h: Vec<(&str, &str)> = Vec::new();
                    if let Some(c) = cred { h.push(("authorization", c)); }
                    if let Some(l) = lane { h.push(("x-lanekeeper-lane", l)); }
                    if let Some(t) = tenant { h.push(("x-lanekeeper-tenant", t)); }
                    let names = ["unknown.example"];
                    let (status, body, _) = send(&gw, &h, cert.then_some(&names[..])).await;
                    prop_assert!(
                        matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::BAD_REQUEST),
                        "{:?} {:?}: {} {}", cred, lane, status, body
                    );
                    prop_assert!(!core_saw_requests(&gw), "the core was asked");
                }
                // The one token is still there: the allowed caller gets it,
                // and then nothing is left.
                let a = bearer(KEY_A);
                let (status, body, _) = send(&gw, &[("authorization", &a)], None).await;
                prop_assert!(admitted(status, &body), "{} {}", status, body);
                let (status, _, _) = send(&gw, &[("authorization", &a)], None).await;
                prop_assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
                Ok(())
            })?;
        }
    }
}
