//! Where the config and the replica count come from: a mounted file, a
//! ConfigMap watched through the API, and the gateway Service's
//! EndpointSlices.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use lanes::{CONFIG_KEY, GatewayConfig};

use super::state::Gateway;

/// Parses and installs a config's bytes, or says why not.
fn load(gw: &Gateway, bytes: &[u8], source: &str) {
    match GatewayConfig::from_json(bytes) {
        Ok(cfg) => gw.install(cfg, source),
        Err(e) => gw.source_failed(source, &e.to_string(), true),
    }
}

/// Reloads a mounted `lanes.json` when its bytes change.
pub(super) async fn watch_file(gw: Arc<Gateway>, path: PathBuf) {
    let source = path.display().to_string();
    let mut last: Option<Vec<u8>> = None;
    let mut reported_unreadable = false;
    loop {
        // A small file, read every reload interval: a blocking read is fine.
        match std::fs::read(&path) {
            Ok(bytes) => {
                reported_unreadable = false;
                if last.as_deref() != Some(&bytes[..]) {
                    load(&gw, &bytes, &source);
                    last = Some(bytes);
                }
            }
            Err(e) if !reported_unreadable => {
                gw.source_failed(&source, &e.to_string(), false);
                reported_unreadable = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(gw.args.reload_millis.max(10))).await;
    }
}

/// Follows a ConfigMap's `lanes.json` through a watch.
pub(super) async fn watch_configmap(
    gw: Arc<Gateway>,
    client: kube::Client,
    ns: String,
    name: String,
) {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &ns);
    let source = format!("configmap {ns}/{name}");
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, cfg).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                match cm.data.as_ref().and_then(|d| d.get(CONFIG_KEY)) {
                    Some(text) => load(&gw, text.as_bytes(), &source),
                    None => gw.source_failed(&source, "the ConfigMap has no lanes.json key", true),
                }
            }
            Ok(watcher::Event::Delete(_)) => {
                tracing::warn!(
                    source,
                    "the ConfigMap was deleted; keeping the last good config"
                );
            }
            Ok(_) => {}
            Err(e) => {
                gw.source_failed(
                    &source,
                    &format!("watching the ConfigMap failed, retrying: {e}"),
                    false,
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The number of distinct ready endpoints in a Service's EndpointSlices. A
/// dual-stack Service has one slice per address family listing the same
/// pods, so an endpoint is its target (the pod) when it names one, else its
/// first address; a missing `ready` condition means ready (as the API
/// documents).
pub(super) fn ready_endpoints<'a>(slices: impl Iterator<Item = &'a EndpointSlice>) -> u32 {
    let mut seen = HashSet::new();
    for e in slices.flat_map(|s| s.endpoints.iter()) {
        if !e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
            continue;
        }
        let key = match &e.target_ref {
            Some(t) => format!(
                "{}/{}/{}",
                t.kind.as_deref().unwrap_or(""),
                t.namespace.as_deref().unwrap_or(""),
                t.name.as_deref().unwrap_or("")
            ),
            None => format!("address {}", e.addresses.first().map_or("", String::as_str)),
        };
        seen.insert(key);
    }
    seen.len() as u32
}

/// Follows the gateway Service's ready endpoints: N of the 1/N share.
pub(super) async fn watch_endpoints(
    gw: Arc<Gateway>,
    client: kube::Client,
    ns: String,
    service: String,
) {
    let api: kube::Api<EndpointSlice> = kube::Api::namespaced(client, &ns);
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
    let mut stream = reflector(writer, watcher(api, cfg))
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            // A (re)list reaches the store only when it is done: count then,
            // not on each of its objects (the store still holds the
            // previous list, empty at start-up).
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "watching the gateway's EndpointSlices failed; keeping the replica count");
                continue;
            }
            // InitDone, Apply, Delete: the store is whole.
            Ok(_) => {}
        }
        // No ready endpoint (none yet, or no slices): this replica counts
        // itself; a Service routes only to ready endpoints.
        let ready = ready_endpoints(reader.state().iter().map(|s| s.as_ref()));
        gw.reshare(ready.max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_endpoints_count_each_pod_once_across_address_families() {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let slice = |family: &str, eps: serde_json::Value| -> EndpointSlice {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("gw-{family}")},
                "addressType": family,
                "endpoints": eps,
            }))
            .unwrap()
        };
        let ep = |addr: &str, pod: Option<&str>, ready: Option<bool>| {
            let mut e = serde_json::json!({"addresses": [addr]});
            if let Some(p) = pod {
                e["targetRef"] = serde_json::json!({"kind": "Pod", "namespace": "ns", "name": p});
            }
            if let Some(r) = ready {
                e["conditions"] = serde_json::json!({"ready": r});
            }
            e
        };
        let v4 = slice(
            "IPv4",
            serde_json::json!([
                ep("10.0.0.1", Some("gw-a"), Some(true)),
                ep("10.0.0.2", Some("gw-b"), None),
                ep("10.0.0.3", Some("gw-c"), Some(false)),
                ep("10.0.0.9", None, Some(true)),
            ]),
        );
        let v6 = slice(
            "IPv6",
            serde_json::json!([
                ep("fd00::1", Some("gw-a"), Some(true)),
                ep("fd00::2", Some("gw-b"), Some(true)),
                ep("fd00::3", Some("gw-c"), Some(false)),
            ]),
        );
        // gw-a, gw-b (ready when the condition is missing) and the address
        // without a target; gw-c is not ready; each pod once over both
        // families.
        assert_eq!(ready_endpoints([&v4, &v6].into_iter()), 3);
        assert_eq!(ready_endpoints([&v4].into_iter()), 3);
        assert_eq!(ready_endpoints(std::iter::empty()), 0);
    }
}
