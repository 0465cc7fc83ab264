//! Tests of the API server double, all through kube's real client and kube-runtime.

use crate::support;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::Discovery;
use kube::runtime::{reflector, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};
use support::apiserver::{ApiServer, Fault};

fn cm(name: &str, data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": data,
    }))
    .unwrap()
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn configmap_crud_and_conflicts() {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");

    let created = api
        .create(&PostParams::default(), &cm("a", json!({"k": "1"})))
        .await
        .unwrap();
    assert_eq!(created.namespace().as_deref(), Some("default"));
    assert!(created.uid().is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();

    let dup = api_err(
        api.create(&PostParams::default(), &cm("a", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));

    // Replace with the current resourceVersion works, a stale one conflicts.
    let mut next = created.clone();
    next.data = Some([("k".to_string(), "2".to_string())].into());
    let replaced = api
        .replace("a", &PostParams::default(), &next)
        .await
        .unwrap();
    let rv2: u64 = replaced.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1);
    let stale = api_err(
        api.replace("a", &PostParams::default(), &next)
            .await
            .unwrap_err(),
    );
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));

    // Merge patch: adds a key, null deletes one.
    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": null, "n": "x"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.data.unwrap(),
        [("n".to_string(), "x".to_string())].into()
    );

    // A merge patch carrying a stale resourceVersion conflicts.
    let stale_patch =
        Patch::Merge(json!({"metadata": {"resourceVersion": rv1.to_string()}, "data": {"z": "1"}}));
    let e = api_err(
        api.patch("a", &PatchParams::default(), &stale_patch)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);

    // JSON patch.
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/data/j", "value": "y"}])).unwrap();
    let patched = api
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .unwrap();
    assert_eq!(
        patched.data.unwrap().get("j").map(String::as_str),
        Some("y")
    );

    // Apply creates a missing object.
    let applied = api
        .patch("b", &PatchParams::apply("me"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"x": "1"}})))
        .await
        .unwrap();
    assert_eq!(
        applied.data.unwrap().get("x").map(String::as_str),
        Some("1")
    );
    let mf = applied.metadata.managed_fields.unwrap();
    assert!(
        mf.iter()
            .any(|m| m.manager.as_deref() == Some("me") && m.operation.as_deref() == Some("Apply"))
    );

    // Apply without a field manager is a 400.
    let e = api_err(
        api.patch(
            "b",
            &PatchParams::default(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap"})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 400);

    // Name in the body contradicting the path: 422 Invalid.
    let e = api_err(
        api.replace("b", &PostParams::default(), &cm("other", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));

    // Delete, then 404 with a proper Status.
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let e = api_err(api.get("a").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert!(e.message.contains("\"a\" not found"), "{}", e.message);

    // Garbage body: 400.
    let req = axum::http::Request::post("/api/v1/namespaces/default/configmaps")
        .body(b"{not json".to_vec())
        .unwrap();
    let e = server.client().request::<ConfigMap>(req).await.unwrap_err();
    assert_eq!(api_err(e).code, 400);

    // Unknown resource: 404.
    let req = axum::http::Request::get("/api/v1/namespaces/default/widgets")
        .body(vec![])
        .unwrap();
    let e = server
        .client()
        .request::<serde_json::Value>(req)
        .await
        .unwrap_err();
    assert_eq!(api_err(e).code, 404);
}

#[tokio::test]
async fn server_side_apply_conflicts_force_and_removal() {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let apply = |labels: serde_json::Value| {
        Patch::Apply(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": labels}}),
        )
    };
    api.patch(
        "c",
        &PatchParams::apply("alice"),
        &apply(json!({"team": "a", "tier": "1"})),
    )
    .await
    .unwrap();

    // Same value from another manager: shared ownership, no conflict.
    api.patch(
        "c",
        &PatchParams::apply("bob"),
        &apply(json!({"team": "a"})),
    )
    .await
    .unwrap();
    // Different value: conflict, reason "Conflict".
    let e = api_err(
        api.patch(
            "c",
            &PatchParams::apply("carol"),
            &apply(json!({"tier": "2"})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(e.message.contains("alice"), "{}", e.message);
    // Force takes the field over.
    let got = api
        .patch(
            "c",
            &PatchParams::apply("carol").force(),
            &apply(json!({"tier": "2"})),
        )
        .await
        .unwrap();
    assert_eq!(got.labels().get("tier").map(String::as_str), Some("2"));
    // Alice no longer owns tier: when she stops applying it, it stays (carol owns it).
    let got = api
        .patch(
            "c",
            &PatchParams::apply("alice"),
            &apply(json!({"team": "a"})),
        )
        .await
        .unwrap();
    assert_eq!(got.labels().get("tier").map(String::as_str), Some("2"));

    // SSA removal: a field only alice owned disappears when she stops applying it.
    api.patch(
        "c",
        &PatchParams::apply("alice"),
        &apply(json!({"team": "a", "owner": "x"})),
    )
    .await
    .unwrap();
    let got = api
        .patch(
            "c",
            &PatchParams::apply("alice"),
            &apply(json!({"team": "a"})),
        )
        .await
        .unwrap();
    assert!(!got.labels().contains_key("owner"));
    // team is shared with bob, so it stays when alice drops it.
    let got = api
        .patch("c", &PatchParams::apply("alice"), &apply(json!({})))
        .await
        .unwrap();
    assert_eq!(got.labels().get("team").map(String::as_str), Some("a"));

    // An Update (merge patch) by another manager takes ownership; then applying a different value conflicts.
    api.patch(
        "c",
        &PatchParams {
            field_manager: Some("dave".into()),
            ..Default::default()
        },
        &Patch::Merge(json!({"metadata": {"labels": {"team": "d"}}})),
    )
    .await
    .unwrap();
    let e = api_err(
        api.patch(
            "c",
            &PatchParams::apply("bob"),
            &apply(json!({"team": "b"})),
        )
        .await
        .unwrap_err(),
    );
    assert!(e.message.contains("dave"), "{}", e.message);

    // managedFields look real.
    let got = api.get("c").await.unwrap();
    let managers: Vec<_> = got
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .map(|m| (m.manager.unwrap(), m.operation.unwrap()))
        .collect();
    assert!(
        managers.contains(&("dave".into(), "Update".into())),
        "{managers:?}"
    );
    assert!(
        managers.contains(&("carol".into(), "Apply".into())),
        "{managers:?}"
    );

    // A no-op apply does not write (no new resourceVersion).
    let before = server.resource_version();
    api.patch(
        "c",
        &PatchParams::apply("carol"),
        &apply(json!({"tier": "2"})),
    )
    .await
    .unwrap();
    assert_eq!(server.resource_version(), before);
}

fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "img"}]},
        "status": {"phase": "Running"},
    }))
    .unwrap()
}

#[tokio::test]
async fn status_subresource_isolation() {
    let server = ApiServer::start().await;
    let api: Api<Pod> = Api::namespaced(server.client(), "default");
    let created = api
        .create(&PostParams::default(), &pod("p", json!({"app": "x"})))
        .await
        .unwrap();
    assert!(
        created.status.is_none(),
        "status is dropped on create for kinds with a status subresource"
    );

    // Status write changes only status.
    let st = api
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"sneaky": "1"}}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "True"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        st.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert!(!st.labels().contains_key("sneaky"));

    // Main-resource write ignores status and keeps it.
    let main = api
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"b": "2"}}, "status": {"phase": "Failed"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(main.labels().get("b").map(String::as_str), Some("2"));
    assert_eq!(
        main.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );

    // Strategic merge patch merges conditions by type.
    let got = api
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
        )
        .await
        .unwrap();
    let conds = got.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(
        conds.iter().find(|c| c.type_ == "Ready").unwrap().status,
        "True"
    );
    assert_eq!(
        conds
            .iter()
            .find(|c| c.type_ == "ContainersReady")
            .unwrap()
            .status,
        "True"
    );

    // Apply on the status subresource.
    let got = api
        .patch_status(
            "p",
            &PatchParams::apply("kubelet"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": {"conditions": [{"type": "lanekeeper.dev/serving", "status": "False"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(got.status.unwrap().conditions.unwrap().len(), 3);
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "img"}]}},
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn scale_subresource_typed_and_dynamic() {
    let server = ApiServer::start().await;
    let client = server.client();
    let api: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d = api
        .create(&PostParams::default(), &deployment("web", 2))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    server
        .merge_patch_direct(
            "apps/v1",
            "Deployment",
            Some("default"),
            "web",
            json!({"status": {"replicas": 2, "readyReplicas": 2}}),
            Some("status"),
        )
        .unwrap();

    let scale = api.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    let status = scale.status.unwrap();
    assert_eq!(status.replicas, 2);
    assert_eq!(status.selector.as_deref(), Some("app=web"));

    let scaled = api
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(5));
    let d = api.get("web").await.unwrap();
    assert_eq!(d.spec.unwrap().replicas, Some(5));
    assert_eq!(d.metadata.generation, Some(2));
    assert_eq!(
        d.status.unwrap().ready_replicas,
        Some(2),
        "status survives a scale write"
    );

    // Through discovery and a dynamic Api.
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let (ar, caps) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.kind == "Deployment")
        .expect("Deployment discovered");
    assert_eq!(ar.plural, "deployments");
    assert!(
        caps.subresources.iter().any(|(sr, _)| sr.plural == "scale"),
        "{:?}",
        caps.subresources
    );
    let dynapi: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let scaled = dynapi
        .patch_scale(
            "web",
            &PatchParams::apply("lanekeeper").force(),
            &Patch::Apply(
                json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 7}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(7));
    assert_eq!(
        dynapi
            .get_scale("web")
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(7)
    );
    let scale_requests = server.requests_matching(Some("PATCH"), "/deployments/web/scale");
    assert_eq!(scale_requests.len(), 2);
    assert_eq!(
        scale_requests[1].field_manager.as_deref(),
        Some("lanekeeper")
    );

    // The scale applier now owns spec.replicas: another manager's different apply conflicts.
    let e = api_err(
        api.patch(
            "web",
            &PatchParams::apply("someone"),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 1}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 409);
}

#[tokio::test]
async fn label_and_field_selectors_and_pagination() {
    let server = ApiServer::start().await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, labels) in [
        ("p1", json!({"app": "a", "tier": "web"})),
        ("p2", json!({"app": "a", "tier": "db"})),
        ("p3", json!({"app": "b"})),
        ("p4", json!({"app": "a", "lanekeeper.dev/drain": "true"})),
    ] {
        pods.create(&PostParams::default(), &pod(name, labels))
            .await
            .unwrap();
    }
    Api::<Pod>::namespaced(client.clone(), "other")
        .create(&PostParams::default(), &pod("q1", json!({"app": "a"})))
        .await
        .unwrap();

    let names =
        |l: kube::core::ObjectList<Pod>| l.items.iter().map(|p| p.name_any()).collect::<Vec<_>>();
    let sel = |s: &str| ListParams::default().labels(s);
    assert_eq!(
        names(pods.list(&sel("app=a")).await.unwrap()),
        ["p1", "p2", "p4"]
    );
    assert_eq!(names(pods.list(&sel("app!=a")).await.unwrap()), ["p3"]);
    assert_eq!(
        names(pods.list(&sel("tier in (web,db)")).await.unwrap()),
        ["p1", "p2"]
    );
    assert_eq!(
        names(pods.list(&sel("app=a,tier notin (db)")).await.unwrap()),
        ["p1", "p4"]
    );
    assert_eq!(names(pods.list(&sel("tier")).await.unwrap()), ["p1", "p2"]);
    assert_eq!(
        names(
            pods.list(&sel("app=a,!lanekeeper.dev/drain"))
                .await
                .unwrap()
        ),
        ["p1", "p2"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("metadata.name=p3"))
                .await
                .unwrap()
        ),
        ["p3"]
    );
    let all: Api<Pod> = Api::all(client.clone());
    assert_eq!(
        names(all.list(&sel("app=a")).await.unwrap()),
        ["p1", "p2", "p4", "q1"]
    );
    assert_eq!(
        names(
            all.list(&ListParams::default().fields("metadata.namespace=other"))
                .await
                .unwrap()
        ),
        ["q1"]
    );

    // Pagination.
    let page1 = all.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(page1.clone()), ["p1", "p2"]);
    let token = page1.metadata.continue_.clone().expect("continue token");
    assert!(page1.metadata.resource_version.is_some());
    let page2 = all
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(page2.clone()), ["p3", "p4"]);
    let page3 = all
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(page2.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(names(page3.clone()), ["q1"]);
    assert!(
        page3
            .metadata
            .continue_
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    );

    // A bad selector is a 400.
    let e = api_err(pods.list(&sel("a in (")).await.unwrap_err());
    assert_eq!(e.code, 400);
}

#[tokio::test]
async fn watcher_and_reflector_recover_from_dropped_watch() {
    let server = ApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm("w1", json!({"v": "1"})))
        .await
        .unwrap();

    let (reader, writer) = reflector::store();
    // The first watch after the initial list closes after one event.
    server.inject(Fault::drop_watch(1).path("/configmaps"));
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default()));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen2 = seen.clone();
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        while let Some(ev) = s.next().await {
            if let Ok(ev) = ev {
                let tag = match &ev {
                    watcher::Event::Apply(o) => format!(
                        "apply {} {:?}",
                        o.name_any(),
                        o.data.as_ref().and_then(|d| d.get("v").cloned())
                    ),
                    watcher::Event::Delete(o) => format!("delete {}", o.name_any()),
                    watcher::Event::Init => "init".to_string(),
                    watcher::Event::InitApply(o) => format!("initapply {}", o.name_any()),
                    watcher::Event::InitDone => "initdone".to_string(),
                };
                seen2.lock().unwrap().push(tag);
            }
        }
    });
    reader.wait_until_ready().await.unwrap();
    assert_eq!(reader.state().len(), 1);

    api.create(&PostParams::default(), &cm("w2", json!({"v": "1"})))
        .await
        .unwrap();
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await
    .unwrap();
    api.delete("w2", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("w3", json!({"v": "1"})))
        .await
        .unwrap();

    let ok = server
        .wait_until(Duration::from_secs(10), |_| {
            let names: Vec<_> = reader.state().iter().map(|o| o.name_any()).collect();
            let w1v = reader
                .state()
                .iter()
                .find(|o| o.name_any() == "w1")
                .and_then(|o| o.data.as_ref().and_then(|d| d.get("v").cloned()));
            names.len() == 2 && names.contains(&"w3".to_string()) && w1v.as_deref() == Some("2")
        })
        .await;
    assert!(ok, "reflector converged: {:?}", seen.lock().unwrap());
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.contains(&"apply w2 Some(\"1\")".to_string()),
        "{seen:?}"
    );
    assert!(
        seen.contains(&"apply w1 Some(\"2\")".to_string()),
        "{seen:?}"
    );
    assert!(seen.contains(&"delete w2".to_string()), "{seen:?}");
    // The dropped watch was re-established.
    let watches = server
        .requests()
        .into_iter()
        .filter(|r| r.watch && r.path.contains("/configmaps"))
        .count();
    assert!(watches >= 2, "watch re-established ({watches})");
    assert!(server.pending_faults().is_empty());
    task.abort();
}

#[tokio::test]
async fn raw_watch_events_bookmarks_and_expiry() {
    let server = ApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &cm("x", json!({})))
        .await
        .unwrap();
    api.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "b"}})),
    )
    .await
    .unwrap();
    api.delete("x", &DeleteParams::default()).await.unwrap();
    let wp = kube::api::WatchParams::default().timeout(2);
    let events: Vec<_> = api.watch(&wp, &rv).await.unwrap().collect().await;
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            Ok(kube::api::WatchEvent::Added(_)) => "ADDED",
            Ok(kube::api::WatchEvent::Modified(_)) => "MODIFIED",
            Ok(kube::api::WatchEvent::Deleted(_)) => "DELETED",
            Ok(kube::api::WatchEvent::Bookmark(_)) => "BOOKMARK",
            Ok(kube::api::WatchEvent::Error(_)) => "ERROR",
            Err(_) => "ERR",
        })
        .collect();
    assert_eq!(kinds, ["ADDED", "MODIFIED", "DELETED"]);

    // After compaction, a watch from the old resourceVersion gets 410 Expired.
    server.compact();
    let events: Vec<_> = api.watch(&wp, &rv).await.unwrap().collect().await;
    match &events[0] {
        Ok(kube::api::WatchEvent::Error(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected 410, got {other:?}"),
    }

    // Bookmarks when allowed.
    let fast = ApiServer::start_with(support::apiserver::Options {
        bookmark_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(fast.client(), "default");
    let wp = kube::api::WatchParams::default().timeout(1);
    let events: Vec<_> = api.watch(&wp, "1").await.unwrap().collect().await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Ok(kube::api::WatchEvent::Bookmark(_))))
    );
}

#[tokio::test]
async fn owner_reference_cascade_and_history() {
    let server = ApiServer::start().await;
    let client = server.client();
    let deps: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let owner = deps
        .create(&PostParams::default(), &deployment("owner", 1))
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut child = cm("child", json!({}));
    child.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "owner".into(),
            uid: owner.uid().unwrap(),
            ..Default::default()
        },
    ]);
    cms.create(&PostParams::default(), &child).await.unwrap();
    cms.patch(
        "child",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "1"}})),
    )
    .await
    .unwrap();
    deps.delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        cms.get_opt("child").await.unwrap().is_none(),
        "dependent deleted with its owner"
    );

    let history = server.history("v1", "configmaps", Some("default"), "child");
    let events: Vec<&str> = history.iter().map(|w| w.event.as_str()).collect();
    assert_eq!(events, ["ADDED", "MODIFIED", "DELETED"]);
    assert_eq!(history[1].object["data"]["a"], "1");
    assert!(
        history
            .windows(2)
            .all(|w| w[0].resource_version < w[1].resource_version)
    );
}

#[tokio::test]
async fn crds_become_served() {
    let server = ApiServer::start().await;
    let client = server.client();
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in lanekeeper::api::crds() {
        crd_api.create(&PostParams::default(), &crd).await.unwrap();
    }
    let got = crd_api
        .get("capacityprofiles.lanekeeper.dev")
        .await
        .unwrap();
    let established = got
        .status
        .unwrap()
        .conditions
        .unwrap()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established);

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/inc-47/inc-47.yaml"
    ))
    .unwrap();
    let doc = serde_yaml::Deserializer::from_str(&text)
        .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|v| v.get("kind").and_then(|k| k.as_str()) == Some("CapacityProfile"))
        .expect("a CapacityProfile in the example");
    let mut profile: lanekeeper::api::CapacityProfile = serde_yaml::from_value(doc).unwrap();
    profile.metadata.namespace = Some("ai-platform".into());
    let profiles: Api<lanekeeper::api::CapacityProfile> =
        Api::namespaced(client.clone(), "ai-platform");
    let created = profiles
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let list = profiles.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].spec, profile.spec);
    // Status subresource declared by the CRD.
    let status = profiles
        .patch_status(
            "agent-assist",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(
        status.metadata.generation,
        Some(1),
        "status writes do not bump generation"
    );
    // Strategic merge is refused for custom resources, as on a real server.
    let e = api_err(
        profiles
            .patch(
                "agent-assist",
                &PatchParams::default(),
                &Patch::Strategic(json!({})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 415);

    // The direct helper loads the same CRDs.
    let other = ApiServer::start().await;
    other.install_lanekeeper_crds();
    let discovery = Discovery::new(other.client()).run().await.unwrap();
    assert!(discovery.groups().any(|g| g.name() == "lanekeeper.dev"));
}

#[tokio::test]
async fn recorder_publishes_events() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let server = ApiServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let obj = cms
        .create(&PostParams::default(), &cm("target", json!({})))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "lanekeeper".into(),
            instance: Some("test".into()),
        },
    );
    let ev = Event {
        type_: EventType::Warning,
        reason: "LevelUp".into(),
        note: Some("capacity dropped".into()),
        action: "Degrade".into(),
        secondary: None,
    };
    recorder.publish(&ev, &obj.object_ref(&())).await.unwrap();
    recorder.publish(&ev, &obj.object_ref(&())).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        list.items.len(),
        1,
        "a repeated event is patched into a series"
    );
    let e = &list.items[0];
    assert_eq!(e.reason.as_deref(), Some("LevelUp"));
    assert_eq!(
        e.regarding.as_ref().unwrap().name.as_deref(),
        Some("target")
    );
    assert!(e.series.is_some());
}

#[tokio::test]
async fn lease_manager_leader_election() {
    use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
    let server = ApiServer::start().await;
    let build = |id: &str| {
        LeaseManagerBuilder::new(server.client(), "lanekeeper-leader")
            .with_namespace("default")
            .with_parameters(LeaseParams::new(id, 3, 1))
            .build()
    };
    let a = build("a").await.unwrap();
    let b = build("b").await.unwrap();
    let (mut a_rx, a_task) = a.watch().await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while !*a_rx.borrow_and_update() {
            a_rx.changed().await.unwrap();
        }
    })
    .await
    .expect("a becomes leader");
    let (b_rx, b_task) = b.watch().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(*a_rx.borrow(), "a still leads after a lease duration");
    assert!(!*b_rx.borrow(), "only one holds the lease");
    let lease: Lease = Api::namespaced(server.client(), "default")
        .get("lanekeeper-leader")
        .await
        .unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("a"));

    // a releases (dropping its receiver makes the watch task release and stop).
    drop(a_rx);
    let _ = tokio::time::timeout(Duration::from_secs(10), a_task)
        .await
        .expect("a stops");
    let started = Instant::now();
    let mut b_rx = b_rx;
    tokio::time::timeout(Duration::from_secs(10), async {
        while !*b_rx.borrow_and_update() {
            b_rx.changed().await.unwrap();
        }
    })
    .await
    .expect("b takes over");
    assert!(started.elapsed() < Duration::from_secs(10));
    let lease: Lease = Api::namespaced(server.client(), "default")
        .get("lanekeeper-leader")
        .await
        .unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("b"));
    // Some lease manager write hit an SSA conflict or none did; either way the double answered
    // apply patches with a field manager.
    assert!(server.requests().iter().any(|r| r.content_type.as_deref()
        == Some("application/apply-patch+yaml")
        && r.field_manager.is_some()));
    drop(b_rx);
    let _ = tokio::time::timeout(Duration::from_secs(10), b_task).await;
}

#[tokio::test]
async fn lease_manager_takes_over_when_holder_stops_renewing() {
    use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
    let server = ApiServer::start().await;
    let build = |id: &str| {
        LeaseManagerBuilder::new(server.client(), "l2")
            .with_namespace("default")
            .with_parameters(LeaseParams::new(id, 2, 1))
            .build()
    };
    let a = build("a").await.unwrap();
    assert!(a.changed().await.unwrap(), "a acquires");
    // a never renews again (it is not polled); b takes over after the lease expires.
    let b = build("b").await.unwrap();
    let started = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(15), b.changed())
        .await
        .expect("b acquires in time")
        .unwrap();
    assert!(got);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "not before the lease expired"
    );
    let lease: Lease = Api::namespaced(server.client(), "default")
        .get("l2")
        .await
        .unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn faults_500_conflict_and_delay() {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    api.create(&PostParams::default(), &cm("f", json!({})))
        .await
        .unwrap();

    server.inject(
        Fault::status(500)
            .method("GET")
            .path("/configmaps/f")
            .times(2),
    );
    for _ in 0..2 {
        let e = api_err(api.get("f").await.unwrap_err());
        assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    }
    api.get("f").await.unwrap();

    server.inject(Fault::conflict().method("PATCH"));
    let e = api_err(
        api.patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "1"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        !api.get("f")
            .await
            .unwrap()
            .data
            .unwrap_or_default()
            .contains_key("a"),
        "a faulted write changes nothing"
    );

    server.inject(Fault::delay(Duration::from_millis(300)).path("/configmaps/f"));
    let t = Instant::now();
    api.get("f").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));

    let recorded = server.requests_matching(Some("GET"), "/configmaps/f");
    let statuses: Vec<u16> = recorded.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [500, 500, 200, 200, 200]);
    assert!(recorded[4].fault.is_some());
    server.clear_requests();
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn direct_access_produces_watch_events() {
    let server = ApiServer::start().await;
    let api: Api<Pod> = Api::namespaced(server.client(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut p = serde_json::to_value(pod("d", json!({"app": "d"}))).unwrap();
    p["metadata"]["namespace"] = json!("default");
    let created = server.put_direct(p).unwrap();
    assert_eq!(
        created["status"]["phase"], "Running",
        "direct puts keep status"
    );
    server
        .apply_direct("tester", json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "d", "namespace": "default", "labels": {"x": "1"}}}), false)
        .unwrap();
    server
        .delete_direct("v1", "Pod", Some("default"), "d")
        .unwrap();
    assert!(
        server
            .get_object("v1", "pods", Some("default"), "d")
            .is_none()
    );
    let events: Vec<_> = api
        .watch(&kube::api::WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(events.len(), 3);
    assert!(matches!(events[2], Ok(kube::api::WatchEvent::Deleted(_))));
}

#[tokio::test]
async fn concurrent_requests() {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    api.create(&PostParams::default(), &cm("counter", json!({"n": "0"})))
        .await
        .unwrap();
    // 20 writers doing optimistic-concurrency increments: no lost update.
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let mut c = api.get("counter").await.unwrap();
                let n: u32 = c.data.as_ref().unwrap()["n"].parse().unwrap();
                c.data = Some([("n".to_string(), (n + 1).to_string())].into());
                match api.replace("counter", &PostParams::default(), &c).await {
                    Ok(_) => break,
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(api.get("counter").await.unwrap().data.unwrap()["n"], "20");
}

#[tokio::test]
async fn pinned_kind_resolves_scale_subresource() {
    let server = ApiServer::start().await;
    let gvk = kube::api::GroupVersionKind::gvk("apps", "v1", "StatefulSet");
    let (ar, caps) = kube::discovery::pinned_kind(&server.client(), &gvk)
        .await
        .unwrap();
    assert_eq!(ar.plural, "statefulsets");
    assert!(caps.subresources.iter().any(|(sr, _)| sr.plural == "scale"));
    assert!(
        caps.subresources
            .iter()
            .any(|(sr, _)| sr.plural == "status")
    );
    let gvk = kube::api::GroupVersionKind::gvk("", "v1", "ConfigMap");
    let (_, caps) = kube::discovery::pinned_kind(&server.client(), &gvk)
        .await
        .unwrap();
    assert!(caps.subresources.is_empty());
}

#[tokio::test]
async fn label_selected_watch_sees_objects_leave_and_enter() {
    let server = ApiServer::start().await;
    let api: Api<Pod> = Api::namespaced(server.client(), "default");
    api.create(&PostParams::default(), &pod("s1", json!({"app": "a"})))
        .await
        .unwrap();
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let relabel = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"app": v}}}));
    api.patch("s1", &PatchParams::default(), &relabel("b"))
        .await
        .unwrap();
    api.patch("s1", &PatchParams::default(), &relabel("a"))
        .await
        .unwrap();
    let wp = kube::api::WatchParams::default().labels("app=a").timeout(1);
    let kinds: Vec<&str> = api
        .watch(&wp, &rv)
        .await
        .unwrap()
        .collect::<Vec<_>>()
        .await
        .iter()
        .map(|e| match e {
            Ok(kube::api::WatchEvent::Added(_)) => "ADDED",
            Ok(kube::api::WatchEvent::Modified(_)) => "MODIFIED",
            Ok(kube::api::WatchEvent::Deleted(_)) => "DELETED",
            _ => "OTHER",
        })
        .collect();
    assert_eq!(kinds, ["DELETED", "ADDED"]);
}

#[tokio::test]
async fn streaming_list_watcher() {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    api.create(&PostParams::default(), &cm("s", json!({})))
        .await
        .unwrap();
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().streaming_lists()),
    );
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        while s.next().await.is_some() {}
    });
    tokio::time::timeout(Duration::from_secs(5), reader.wait_until_ready())
        .await
        .expect("initial events end")
        .unwrap();
    assert_eq!(reader.state().len(), 1);
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.query.get("sendInitialEvents").map(String::as_str) == Some("true"))
    );
    task.abort();
}

#[tokio::test]
async fn finalizers_delay_deletion() {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut c = cm("fin", json!({}));
    c.metadata.finalizers = Some(vec!["lanekeeper.dev/cleanup".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    api.delete("fin", &DeleteParams::default()).await.unwrap();
    let marked = api.get("fin").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    api.patch(
        "fin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("fin").await.unwrap().is_none());
}

#[tokio::test]
async fn dropping_the_server_stops_it() {
    let server = ApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default()).await.unwrap();
    let url = server.url();
    let watch = api
        .watch(&kube::api::WatchParams::default().timeout(60), "0")
        .await
        .unwrap();
    drop(server);
    // The open watch ends promptly.
    let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(5), watch.collect::<Vec<_>>())
        .await
        .expect("watch ended on shutdown");
    assert!(
        rest.iter()
            .all(|e| !matches!(e, Ok(kube::api::WatchEvent::Added(_))))
    );
    // New connections are refused.
    let fresh = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let again: Api<ConfigMap> = Api::namespaced(fresh, "default");
    assert!(again.list(&ListParams::default()).await.is_err());
}
