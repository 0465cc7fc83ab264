//! The chart's RBAC is exactly what the controller calls, on a real API
//! server (`LANEKEEPER_E2E=1` on the local control plane of
//! `e2e/cluster.sh`, whose audit log records every request of the chart's
//! ServiceAccount).
//!
//! The real controller runs, with a token of the chart's ServiceAccount,
//! through scenarios that together use every permission: INC-47 with leader
//! election, a capacity drop and drain requests beyond the bound; an HPA in
//! `HPAMinReplicas` mode; a StatefulSet pool (with an objective: a LaneFreeze); a Prometheus source that reads
//! its bearer token from a Secret (refused until the Secret is labeled for
//! lanekeeper) and its CA bundle from a ConfigMap; an approval entered and consumed; an
//! object stored under a looser schema than the current CRD's. Every
//! request in the audit log becomes (apiGroup, resource[/subresource],
//! verb), and the set is compared with the rules of the ClusterRoles and
//! Roles in `manifests/install.yaml` (the chart rendered with default
//! values): nothing refused, nothing granted that no scenario used.

use crate::support;
use crate::world;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use support::cluster::{Cluster, Controller, RELEASE_NS, connect, eventually};
use world::*;

fn object(w: &World, kind: &str) -> Value {
    inc47_objects(w.name(), &w.prom.url())
        .into_iter()
        .find(|o| o["kind"] == kind)
        .unwrap()
}

/// INC-47 with leader election: the capacity drop twice (the repeated event
/// is folded with a patch), then three drain requests where the bound
/// allows two.
async fn scenario_inc47(c: &Cluster, kc: &std::path::Path) -> String {
    let w = World::new(c, "rbac-inc47", 8, 0, None).await.unwrap();
    let _ctl = Controller::start(
        kc,
        w.name(),
        "rbac-inc47",
        &["--leader-elect=true", "--lease-duration-seconds", "4"],
    );
    eventually("level 1 and 9 Ready pods", T, || async {
        let st = w.status().await;
        (st["level"] == 1 && st["readyReplicas"] == 9).then_some(())
    })
    .await;
    let (_, degraded) = inc47_capacities();
    w.set(|t| t.available = degraded);
    eventually("level 2", T, || async {
        w.lanes_json().await.filter(is_inc47_level2)
    })
    .await;
    // Down and up again: the same LevelRaised event a second time, which
    // the recorder folds into a series with a patch.
    let (normal, _) = inc47_capacities();
    w.set(|t| t.available = normal);
    eventually("level 1 again", T, || async {
        w.lanes_json().await.filter(|c| c["level"] == 1)
    })
    .await;
    w.set(|t| t.available = degraded);
    eventually("level 2 again, the event folded", T, || async {
        let raised: u64 = w
            .events("LevelRaised")
            .await
            .iter()
            .filter(|(e, _)| e["note"].as_str().unwrap_or_default().contains("1 -> 2"))
            .map(|e| e.1)
            .sum();
        (raised >= 2).then_some(())
    })
    .await;
    let api = Api::<Pod>::namespaced(c.client.clone(), w.name());
    let ask = json!({"metadata": {"annotations": {"lanekeeper.dev/drain-request": "true"}}});
    for p in w.pods().await.iter().take(3) {
        api.patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(&ask))
            .await
            .unwrap();
    }
    eventually("two drained, the third refused", T, || async {
        let n = w.pods().await.iter().filter(|p| drained(p)).count();
        let refused = !w.events("DrainBudgetExhausted").await.is_empty();
        (n == 2 && refused).then_some(())
    })
    .await;
    w.name().to_owned()
}

/// A real HPA on the pool, with the profile in `HPAMinReplicas` mode.
async fn scenario_hpa(c: &Cluster, kc: &std::path::Path) -> String {
    let w = World::new(c, "rbac-hpa", 8, 0, None).await.unwrap();
    c.apply(&pool_hpa(w.name())).await.unwrap();
    let mut profile = object(&w, "CapacityProfile");
    profile["spec"]["scaling"] = json!({"mode": "HPAMinReplicas"});
    c.apply(&profile).await.unwrap();
    let _ctl = Controller::start(kc, w.name(), "rbac-hpa", &["--leader-elect=false"]);
    let hpas = Api::<HorizontalPodAutoscaler>::namespaced(c.client.clone(), w.name());
    eventually("the HPA's minimum raised", T, || async {
        (hpas.get("vllm").await.ok()?.spec?.min_replicas? == 9).then_some(())
    })
    .await;
    w.name().to_owned()
}

/// A StatefulSet pool, scaled through its scale subresource.
async fn scenario_statefulset(c: &Cluster, kc: &std::path::Path) -> String {
    let w = World::new(c, "rbac-sts", 0, 0, None).await.unwrap();
    let mut sts = pool_deployment(w.name(), 3, 0);
    sts["kind"] = json!("StatefulSet");
    sts["metadata"]["name"] = json!("vllm-sts");
    sts["spec"]["serviceName"] = json!("vllm-sts");
    sts["spec"]["podManagementPolicy"] = json!("Parallel");
    c.apply(&sts).await.unwrap();
    let mut profile = object(&w, "CapacityProfile");
    profile["spec"]["pool"]["scaleTargetRef"] =
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "vllm-sts"});
    c.apply(&profile).await.unwrap();
    // An objective without budget data: Restricted, so the controller
    // writes the profile's LaneFreeze (a server-side apply that creates it).
    let mut p0 = inc47_objects(w.name(), &w.prom.url())
        .into_iter()
        .find(|o| o["kind"] == "LaneContract" && o["metadata"]["name"] == "p0-disruption-assist")
        .unwrap();
    p0["spec"]["objective"] = json!({"withinDeadlinePercent": "99.9"});
    c.apply(&p0).await.unwrap();
    let _ctl = Controller::start(kc, w.name(), "rbac-sts", &["--leader-elect=false"]);
    let api = support::cluster::dynamic(
        &c.client,
        &json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"namespace": w.name()}}),
    );
    eventually("the StatefulSet scaled to 9", T, || async {
        let s = api.get("vllm-sts").await.ok()?;
        (s.data["spec"]["replicas"] == 9).then_some(())
    })
    .await;
    let freezes = Api::<lanekeeper::api::LaneFreeze>::namespaced(c.client.clone(), w.name());
    eventually("the LaneFreeze written", T, || async {
        let f = freezes.get_opt(PROFILE).await.ok()??;
        (f.spec.state == lanekeeper::api::FreezeState::Rollouts).then_some(())
    })
    .await;
    w.name().to_owned()
}

/// The Prometheus source reads its bearer token from a Secret and its CA
/// bundle from a ConfigMap (the cluster's own CA, from the kubeconfig: any
/// valid PEM will do for an http:// URL). The Secret is refused until it is
/// labeled for lanekeeper.
async fn scenario_prometheus_secret(c: &Cluster, kc: &std::path::Path) -> String {
    let w = World::new(c, "rbac-secret", 8, 0, None).await.unwrap();
    let kubeconfig: Value = serde_yaml::from_str(&std::fs::read_to_string(kc).unwrap()).unwrap();
    let ca: k8s_openapi::ByteString = serde_json::from_value(
        kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"].clone(),
    )
    .expect("the kubeconfig carries its CA");
    c.apply(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "prometheus-ca", "namespace": w.name()},
        "data": {"ca.crt": String::from_utf8(ca.0).unwrap()}
    }))
    .await
    .unwrap();
    c.kubectl_ok(&[
        "-n",
        w.name(),
        "create",
        "secret",
        "generic",
        "prometheus-token",
        "--from-literal=token=secret",
    ]);
    let mut profile = object(&w, "CapacityProfile");
    profile["spec"]["signals"]["prometheus"]["bearerTokenSecretRef"] =
        json!({"name": "prometheus-token", "key": "token"});
    profile["spec"]["signals"]["prometheus"]["caBundle"] =
        json!({"configMapKeyRef": {"name": "prometheus-ca", "key": "ca.crt"}});
    c.apply(&profile).await.unwrap();
    let _ctl = Controller::start(kc, w.name(), "rbac-secret", &["--leader-elect=false"]);
    eventually("the unlabeled Secret refused", T, || async {
        let st = w.status().await;
        let why = st["unknownSignals"]["availableUnitsPerSecond"].as_str()?;
        why.contains("not labeled lanekeeper.dev/prometheus-credential=true")
            .then_some(())
    })
    .await;
    c.kubectl_ok(&[
        "-n",
        w.name(),
        "label",
        "secret",
        "prometheus-token",
        "lanekeeper.dev/prometheus-credential=true",
    ]);
    eventually("level 1 read with the token", T, || async {
        (w.status().await["level"] == 1).then_some(())
    })
    .await;
    w.name().to_owned()
}

const CRDS: [&str; 3] = [
    "capacityprofiles.lanekeeper.dev",
    "lanecontracts.lanekeeper.dev",
    "degradationpolicies.lanekeeper.dev",
];

/// Puts the three CRDs back as the chart ships them, also when the scenario
/// fails.
struct RestoreCrds<'a>(&'a Cluster);

impl Drop for RestoreCrds<'_> {
    fn drop(&mut self) {
        for name in CRDS {
            let crd = support::cluster::repo().join(format!("crds/{name}.yaml"));
            let o = self.0.kubectl(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                crd.to_str().unwrap(),
            ]);
            assert!(o.ok, "restoring {name}: {}", o.stderr);
        }
    }
}

/// An object stored under an older, looser schema (a CRD upgrade tightened
/// it): the controller cannot read it and says so with a Warning event that
/// names the field (it reads the raw object for that), and the good objects
/// next to it keep working.
async fn scenario_malformed(c: &Cluster, kc: &std::path::Path) -> String {
    let w = World::new(c, "rbac-malformed", 8, 0, None).await.unwrap();
    let restore = RestoreCrds(c);
    for name in CRDS {
        c.kubectl_ok(&[
            "patch",
            "crd",
            name,
            "--type=json",
            "-p",
            r#"[{"op": "replace", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec", "value": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}]"#,
        ]);
    }
    let broken = [
        (
            "LaneContract",
            "broken",
            json!({"profile": "agent-assist", "priority": "high"}),
        ),
        ("CapacityProfile", "broken-pool", json!({"pool": "nope"})),
        (
            "DegradationPolicy",
            "broken-ladder",
            json!({"profile": "agent-assist", "levels": "none"}),
        ),
    ];
    for (kind, name, spec) in &broken {
        let o = json!({
            "apiVersion": support::cluster::LK, "kind": kind,
            "metadata": {"name": name, "namespace": w.name()},
            "spec": spec
        });
        eventually("the loose schema in force", T, || async {
            c.apply(&o).await.ok()
        })
        .await;
    }
    drop(restore);
    let _ctl = Controller::start(kc, w.name(), "rbac-malformed", &["--leader-elect=false"]);
    eventually("level 1 for the good objects", T, || async {
        w.lanes_json().await.filter(|c| c["level"] == 1)
    })
    .await;
    // The event names the field. (Its InvalidSpec condition cannot be
    // written here: the real server validates a status patch against the
    // current schema's rules, which the stored object breaks; the
    // controller logs that and goes on.)
    for (_, name, _) in &broken {
        let ev = eventually(
            "an InvalidObject event for each broken object",
            T,
            || async {
                w.events("InvalidObject")
                    .await
                    .into_iter()
                    .find(|(e, _)| e["regarding"]["name"] == *name)
            },
        )
        .await;
        assert_eq!(ev.0["type"], "Warning", "{}", ev.0);
        assert!(
            ev.0["note"].as_str().unwrap_or_default().contains("spec."),
            "the field is named: {}",
            ev.0
        );
    }
    // The broken objects go, so the namespace can be cleaned up normally.
    for (kind, name, _) in &broken {
        c.kubectl_ok(&["-n", w.name(), "delete", &kind.to_lowercase(), name]);
    }
    w.name().to_owned()
}

/// A Confirm level approved, entered and left: the approval is consumed.
async fn scenario_approval(c: &Cluster, kc: &std::path::Path) -> String {
    let w = World::new(c, "rbac-approval", 8, 0, None).await.unwrap();
    w.set(|t| t.available = 140.0);
    let mut policy = object(&w, "DegradationPolicy");
    policy["spec"]["hysteresis"]["stableForSeconds"] = json!(1);
    policy["spec"]["levels"][3]["approval"]["timeoutSeconds"] = json!(100_000);
    policy["metadata"]["annotations"] = json!({"lanekeeper.dev/approve-level": "4"});
    c.apply(&policy).await.unwrap();
    let _ctl = Controller::start(kc, w.name(), "rbac-approval", &["--leader-elect=false"]);
    eventually("the approved level entered", T, || async {
        w.lanes_json().await.filter(|c| c["level"] == 4)
    })
    .await;
    w.set(|t| t.available = 560.0);
    let probe = json!({"apiVersion": support::cluster::LK, "kind": "DegradationPolicy", "metadata": {"namespace": w.name()}});
    let api = support::cluster::dynamic(&c.client, &probe);
    eventually("the approval consumed", T, || async {
        let p = api.get("agent-assist-ladder").await.ok()?;
        (!p.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("lanekeeper.dev/approve-level"))
        .then_some(())
    })
    .await;
    w.name().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_charts_rules_are_exactly_what_the_controller_calls() {
    let Some(c) = connect("the_charts_rules_are_exactly_what_the_controller_calls").await else {
        return;
    };
    if !c.has_local_processes(
        "the_charts_rules_are_exactly_what_the_controller_calls",
        "reads the local control plane's audit log",
    ) {
        return;
    }
    // Alone: it deletes and takes the leader Lease the failover test uses.
    let _alone = CLUSTER.write().await;
    let kc = controller_kubeconfig(&c).await;
    // The controller creates its Lease (another test's may be left).
    c.kubectl_ok(&[
        "-n",
        RELEASE_NS,
        "delete",
        "lease",
        support::cluster::RELEASE,
        "--ignore-not-found",
    ]);
    let began = k8s_openapi::jiff::Timestamp::now();
    let namespaces: BTreeSet<String> = BTreeSet::from([
        scenario_inc47(&c, &kc).await,
        scenario_hpa(&c, &kc).await,
        scenario_statefulset(&c, &kc).await,
        scenario_prometheus_secret(&c, &kc).await,
        scenario_approval(&c, &kc).await,
        scenario_malformed(&c, &kc).await,
    ]);
    tokio::time::sleep(Duration::from_millis(1500)).await; // the audit batch

    let mut used = BTreeSet::new();
    let mut refused = Vec::new();
    for ns in &namespaces {
        let (seen, no) = audited_accesses(&c, ns);
        used.extend(seen);
        refused.extend(no);
    }
    // The leader Lease, in the release namespace, during this test.
    for e in c.audit(CONTROLLER_USER) {
        let o = &e["objectRef"];
        let during = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .is_some_and(|t| t >= began);
        if during && o["namespace"] == RELEASE_NS && o["resource"] == "leases" {
            used.insert((
                o["apiGroup"].as_str().unwrap_or_default().to_owned(),
                o["resource"].as_str().unwrap_or_default().to_owned(),
                e["verb"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
    for a in &used {
        println!("used: {a:?}");
    }
    assert!(
        refused.is_empty(),
        "refused by the chart's RBAC: {refused:#?}"
    );
    let granted = chart_rules();
    let missing: Vec<_> = used.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&used).collect();
    assert!(missing.is_empty(), "called but not granted: {missing:?}");
    assert!(extra.is_empty(), "granted but never called: {extra:?}");
}
