//! The Prometheus source's credentials through the API double with the real
//! controller: a Secret is used (its value sent as the bearer token, or
//! trusted as the CA bundle) only when it carries the label
//! `lanekeeper.dev/prometheus-credential: "true"`. Anyone who may write a
//! CapacityProfile chooses the URL, so without the label a profile could
//! send any Secret of its namespace to a server of its own. A Secret
//! without the label, a missing Secret and a missing key are refused with
//! one text (nothing learnt about which Secrets exist), and the queries are
//! Unknown with reason `auth`. A stand-in Prometheus records every request.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use lanekeeper::controller::Settings;
use lanekeeper::signals::SignalSource;
use lanekeeper::signals::prometheus::PrometheusSource;
use serde_json::{Value, json};
use support::apiserver::{ApiServer, ResourceDef};
use support::operator::*;

/// A database password in the profile's namespace: never to leave it.
const DB_PASSWORD: &str = "db-password-never-to-be-sent-9f3a";
/// Prometheus' token, in a Secret labeled for lanekeeper.
const PROM_TOKEN: &str = "prometheus-token-7c1e";
const SIGNAL: &str = "availableUnitsPerSecond";

/// Every request the stand-in Prometheus got: its query string and headers.
type Seen = Arc<Mutex<Vec<String>>>;

/// A Prometheus HTTP API answering every instant query with 560 (and
/// `timestamp(...)` with the evaluation time), recording each request.
async fn recording_prometheus(seen: Seen) -> String {
    let app = axum::Router::new()
        .route("/api/v1/query", axum::routing::get(answer))
        .with_state(seen);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

async fn answer(
    State(seen): State<Seen>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let q = q.unwrap_or_default();
    let mut record = q.clone();
    for (k, v) in &headers {
        record.push_str(&format!("\n{k}: {}", String::from_utf8_lossy(v.as_bytes())));
    }
    seen.lock().unwrap().push(record);
    let q: HashMap<String, String> = url::form_urlencoded::parse(q.as_bytes())
        .into_owned()
        .collect();
    let t: f64 = q.get("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
    let x = if q["query"].starts_with("timestamp(") {
        t
    } else {
        560.0
    };
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json!({"status": "success", "data": {"resultType": "vector",
            "result": [{"metric": {}, "value": [t, x.to_string()]}]}})
        .to_string(),
    )
}

fn secret(name: &str, key: &str, value: &str, labeled: bool) -> Value {
    let labels = if labeled {
        json!({"lanekeeper.dev/prometheus-credential": "true"})
    } else {
        json!({"app": "billing"})
    };
    let value = serde_json::to_value(k8s_openapi::ByteString(value.into())).unwrap();
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {key: value}})
}

/// Points the profile's Prometheus signals at `url`, with these credentials.
fn use_credentials(s: &ApiServer, url: &str, token: (&str, &str), ca: Option<(&str, &str)>) {
    let mut prom = json!({
        "url": url, "timeoutSeconds": 2, "intervalSeconds": 1,
        "bearerTokenSecretRef": {"name": token.0, "key": token.1},
        "queries": {SIGNAL: "pool:available_units_per_second"}
    });
    if let Some((name, key)) = ca {
        prom["caBundle"] = json!({"secretKeyRef": {"name": name, "key": key}});
    }
    s.merge_patch_direct(
        LK,
        "capacityprofiles",
        Some(NS),
        "agent-assist",
        json!({"spec": {"signals": {"prometheus": prom}}}),
        None,
    )
    .unwrap();
}

fn unknown(s: &ApiServer) -> Option<String> {
    profile_status(s)["unknownSignals"][SIGNAL]
        .as_str()
        .map(str::to_owned)
}

/// The refusal the status gives for `name`/`key`.
fn refusal(name: &str, key: &str) -> String {
    format!(
        "auth: Secret {NS}/{name} key {key}: not found, or the Secret is not labeled \
         lanekeeper.dev/prometheus-credential=true (only Secrets with that label are used)"
    )
}

/// Waits until the signal is Unknown naming `name`, and returns the text.
async fn until_refused(s: &ApiServer, name: &str) -> String {
    let named = |s: &ApiServer| unknown(s).filter(|u| u.contains(&format!("{NS}/{name} ")));
    assert!(
        s.wait_until(T, |s| named(s).is_some()).await,
        "{name} never refused: {:#}",
        profile_status(s)
    );
    named(s).unwrap()
}

fn sent_password(seen: &Seen) -> Vec<String> {
    let seen = seen.lock().unwrap();
    seen.iter()
        .filter(|r| r.contains(DB_PASSWORD))
        .cloned()
        .collect()
}

fn sent_token(seen: &Seen) -> bool {
    let bearer = format!("authorization: Bearer {PROM_TOKEN}");
    seen.lock().unwrap().iter().any(|r| r.contains(&bearer))
}

fn start_controller(s: &ApiServer) -> Running {
    let source: Arc<dyn SignalSource> = Arc::new(PrometheusSource::new(Some(s.client()), None));
    let settings = Settings {
        resync: Duration::from_millis(300),
        ..settings(false, "a")
    };
    start_with(s, settings, vec![source])
}

#[tokio::test(flavor = "multi_thread")]
async fn only_a_secret_labeled_for_lanekeeper_is_sent_to_prometheus() {
    let s = cluster().await;
    s.register(ResourceDef::new("", "v1", "Secret", "secrets", true));
    apply_inc47(&s, None);
    s.put_direct(secret("db-credentials", "password", DB_PASSWORD, false))
        .unwrap();
    let seen = Seen::default();
    let url = recording_prometheus(seen.clone()).await;
    use_credentials(&s, &url, ("db-credentials", "password"), None);
    let c = start_controller(&s);

    // The profile names a Secret that did not opt in: its value goes nowhere.
    assert!(
        s.wait_until(T, |s| unknown(s).is_some()
            || !seen.lock().unwrap().is_empty())
            .await,
        "the Prometheus source never ran: {:#}",
        profile_status(&s)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        sent_password(&seen),
        Vec::<String>::new(),
        "the password was sent"
    );
    // The status says why, and how to opt in.
    let unlabeled = until_refused(&s, "db-credentials").await;
    assert_eq!(unlabeled, refusal("db-credentials", "password"));
    let telemetry = profile_status(&s)["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "TelemetryKnown")
        .cloned()
        .unwrap();
    assert_eq!(telemetry["status"], "False", "{telemetry:#}");
    assert!(
        telemetry["message"].as_str().unwrap().contains(&unlabeled),
        "{telemetry:#}"
    );
    // A missing Secret and a missing key read exactly the same.
    use_credentials(&s, &url, ("no-such-secret", "password"), None);
    let missing = until_refused(&s, "no-such-secret").await;
    assert_eq!(missing, refusal("no-such-secret", "password"));
    use_credentials(&s, &url, ("db-credentials", "username"), None);
    assert!(
        s.wait_until(T, |s| unknown(s)
            == Some(refusal("db-credentials", "username")))
            .await,
        "a missing key: {:#}",
        profile_status(&s)
    );

    // A Secret labeled for lanekeeper is used.
    s.put_direct(secret("prometheus-token", "token", PROM_TOKEN, true))
        .unwrap();
    use_credentials(&s, &url, ("prometheus-token", "token"), None);
    assert!(
        s.wait_until(T, |s| sent_token(&seen) && unknown(s).is_none())
            .await,
        "the labeled token was never used: {:#}",
        profile_status(&s)
    );
    assert_eq!(
        sent_password(&seen),
        Vec::<String>::new(),
        "the password was sent"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ca_bundle_secret_without_the_label_is_refused_too() {
    let s = cluster().await;
    s.register(ResourceDef::new("", "v1", "Secret", "secrets", true));
    apply_inc47(&s, None);
    let ca = rcgen::generate_simple_self_signed(vec!["prometheus".to_owned()])
        .unwrap()
        .cert
        .pem();
    s.put_direct(secret("prometheus-token", "token", PROM_TOKEN, true))
        .unwrap();
    s.put_direct(secret("prometheus-ca", "ca.crt", &ca, false))
        .unwrap();
    let seen = Seen::default();
    let url = recording_prometheus(seen.clone()).await;
    let ca_ref = Some(("prometheus-ca", "ca.crt"));
    use_credentials(&s, &url, ("prometheus-token", "token"), ca_ref);
    let c = start_controller(&s);

    let refused = until_refused(&s, "prometheus-ca").await;
    assert_eq!(refused, refusal("prometheus-ca", "ca.crt"));
    assert!(!sent_token(&seen), "queried without its CA bundle");
    // Labeled, it is used.
    s.put_direct(secret("prometheus-ca", "ca.crt", &ca, true))
        .unwrap();
    assert!(
        s.wait_until(T, |s| sent_token(&seen) && unknown(s).is_none())
            .await,
        "the labeled CA bundle was never used: {:#}",
        profile_status(&s)
    );
    c.stop().await;
}
