//! API keys from a Secret at the gateway, on real sockets: `lanekeeper
//! gateway` with a kubeconfig for the API double. The gateway reads a
//! Secret only by its name (a `metadata.name` field selector on every list
//! and watch), which is what lets the chart's Role name the Secrets
//! (`gateway.auth.apiKeySecretNames`, RBAC `resourceNames`) instead of
//! granting every Secret of the namespace.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use crate::gateway::client;
use crate::gateway_service_account::rig_with;
use crate::support::apiserver::{ApiServer, ResourceDef};

const KEY: &str = "sk-team-a-0123456789abcdef";

#[tokio::test]
async fn api_keys_are_read_from_their_secret_by_name_only() {
    let api = ApiServer::start().await;
    api.register(ResourceDef::new("", "v1", "Secret", "secrets", true));
    for (name, value) in [("agent-keys", KEY), ("unrelated", "a-database-password")] {
        api.put_direct(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "ai-platform"},
            "data": {"team-a": STANDARD.encode(value)}
        }))
        .unwrap();
    }
    let clients =
        json!([{"apiKeys": {"namespace": "ai-platform", "secret": "agent-keys"}, "tenant": "a"}]);
    let rig = rig_with("api-key-secret", api, clients).await;
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.status(&c, KEY).await != 200 {
        assert!(Instant::now() < deadline, "the Secret's key never admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reads: Vec<_> = rig
        .api
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/secrets"))
        .collect();
    assert!(!reads.is_empty());
    for r in &reads {
        assert_eq!(r.method, "GET");
        assert!(
            r.path == "/api/v1/namespaces/ai-platform/secrets"
                && r.query.get("fieldSelector").map(String::as_str)
                    == Some("metadata.name=agent-keys"),
            "a Secret read not by name, which a Role with resourceNames refuses: {r:?}"
        );
    }
}
