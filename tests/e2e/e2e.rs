//! The end-to-end suite, against whatever cluster `KUBECONFIG` names:
//! the local control plane of `e2e/cluster.sh` (real kube-apiserver, etcd,
//! controller-manager and scheduler, kwok nodes) in CI, kind on a user's
//! machine (`e2e/run.sh`). Needs `LANEKEEPER_E2E=1`; without it every test
//! prints a SKIPPED line (a failure with `LANEKEEPER_REQUIRE_CLUSTER=1`).
//!
//! The controller under test is the real binary, out of cluster, with a
//! token of the chart's ServiceAccount: the server enforces the chart's
//! RBAC. Telemetry comes from a real Prometheus scraping the INC-47 series
//! (examples/inc-47/signals.yaml) from a small exporter the test drives.
//! Each test has a namespace of its own. Tests that place GPU pods take the
//! GPU lock (two kwok GPU nodes, 16 GPUs); the restart test takes the
//! cluster lock alone, so no other test sees the API server go away.

use crate::support;
use crate::world;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::cluster::{self, Cluster, Controller, RELEASE, RELEASE_NS, connect, eventually, repo};
use world::*;

// ---- install ---------------------------------------------------------------

/// Names of every object of a release, by kind, in every namespace.
fn release_objects(c: &Cluster, release: &str) -> BTreeSet<String> {
    let out = c.kubectl_ok(&[
        "get",
        "deployments,replicasets,services,serviceaccounts,configmaps,pods,poddisruptionbudgets,leases,roles,rolebindings,clusterroles,clusterrolebindings",
        "-A",
        "-l",
        &format!("app.kubernetes.io/instance={release}"),
        "-o",
        "jsonpath={range .items[*]}{.kind}/{.metadata.name}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn install_with_helm_then_upgrade_and_uninstall() {
    let Some(c) = connect("install_with_helm_then_upgrade_and_uninstall").await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    c.operator_release(); // the CRDs come with the chart (crds/)
    let rel = "lk-install";
    let ns = c.namespace("lk-install").await;
    let chart = repo().join("charts/lanekeeper");
    let chart = chart.to_str().unwrap();
    // On kind the chart's pods really start: e2e/run.sh loads an image and
    // names it. On kwok nodes no image is pulled.
    let mut install = vec![
        "install".to_owned(),
        rel.to_owned(),
        chart.to_owned(),
        "-n".to_owned(),
        ns.name.clone(),
        "--set".to_owned(),
        "controller.resyncSeconds=15".to_owned(),
        "--wait".to_owned(),
        "--timeout".to_owned(),
        "120s".to_owned(),
    ];
    if let Ok(image) = std::env::var("LANEKEEPER_E2E_IMAGE") {
        let (repo_, tag) = image.rsplit_once(':').unwrap_or((&image, "latest"));
        install.extend([
            "--set".to_owned(),
            format!("image.repository={repo_}"),
            "--set".to_owned(),
            format!("image.tag={tag}"),
            "--set".to_owned(),
            "image.pullPolicy=Never".to_owned(),
        ]);
    }
    c.helm_ok(&install.iter().map(String::as_str).collect::<Vec<_>>());
    for crd in [
        "capacityprofiles.lanekeeper.dev",
        "lanecontracts.lanekeeper.dev",
        "degradationpolicies.lanekeeper.dev",
        "lanefreezes.lanekeeper.dev",
    ] {
        let established = c.kubectl_ok(&[
            "get",
            "crd",
            crd,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ]);
        assert_eq!(established, "True", "{crd} Established");
    }
    // The chart's controller pods are placed (on the CPU node) and run.
    let deploy = format!("{rel}-lanekeeper");
    c.kubectl_ok(&[
        "-n",
        &ns.name,
        "rollout",
        "status",
        &format!("deployment/{deploy}"),
        "--timeout=90s",
    ]);
    let controller_pods = || -> BTreeSet<String> {
        let out = c.kubectl(&[
            "-n",
            &ns.name,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={rel}"),
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ]);
        out.stdout.split_whitespace().map(str::to_owned).collect()
    };
    let pods_before = controller_pods();
    assert!(!pods_before.is_empty(), "controller pods");

    // The shipped example applies as it is (in a namespace of its own).
    let example = std::fs::read_to_string(repo().join("manifests/examples/inc-47.yaml"))
        .unwrap()
        .replace("namespace: ai-platform", &format!("namespace: {}", ns.name))
        .replace("name: ai-platform", &format!("name: {}", ns.name));
    let o = c.kubectl_stdin(&["apply", "-f", "-"], &example);
    assert!(
        o.ok,
        "kubectl apply of the example: {}{}",
        o.stdout, o.stderr
    );
    assert!(
        o.stdout
            .contains("capacityprofile.lanekeeper.dev/agent-assist created"),
        "{}",
        o.stdout
    );

    // kubectl explain shows the field's description from the CRD.
    let explain = c.kubectl_ok(&["explain", "lanecontracts.spec.floorUnitsPerSecond"]);
    assert!(explain.contains("FIELD: floorUnitsPerSecond"), "{explain}");
    let crd_desc = lanekeeper::api::crds()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("lanecontracts.lanekeeper.dev"))
        .map(|c| serde_json::to_value(c).unwrap())
        .unwrap()
        .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/floorUnitsPerSecond/description")
        .and_then(Value::as_str)
        .unwrap()
        .to_owned();
    let first_words: String = crd_desc
        .split_whitespace()
        .take(5)
        .collect::<Vec<_>>()
        .join(" ");
    let explain_flat: String = explain.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        explain_flat.contains(&first_words),
        "{explain}\nwant: {crd_desc}"
    );

    // Printer columns.
    let table = c.kubectl_ok(&["-n", &ns.name, "get", "capacityprofiles"]);
    let header = table.lines().next().unwrap_or_default();
    for col in ["NAME", "LEVEL", "CAPACITY"] {
        assert!(header.contains(col), "column {col} in {header:?}");
    }
    assert!(table.contains("agent-assist"), "{table}");

    // helm upgrade with changed values rolls the controller.
    let objects_before = release_objects(&c, rel);
    c.helm_ok(&[
        "upgrade",
        rel,
        chart,
        "-n",
        &ns.name,
        "--reuse-values",
        "--set",
        "controller.resyncSeconds=7",
        "--wait",
        "--timeout",
        "120s",
    ]);
    let args = c.kubectl_ok(&[
        "-n",
        &ns.name,
        "get",
        "deployment",
        &deploy,
        "-o",
        "jsonpath={.spec.template.spec.containers[0].args}",
    ]);
    assert!(args.contains("--resync-seconds=7"), "{args}");
    c.kubectl_ok(&[
        "-n",
        &ns.name,
        "rollout",
        "status",
        &format!("deployment/{deploy}"),
        "--timeout=90s",
    ]);
    let pods_after = eventually("the old controller pods replaced", T, || {
        let now = controller_pods();
        let replaced = !now.is_empty() && now.is_disjoint(&pods_before);
        async move { replaced.then_some(now) }
    })
    .await;
    assert!(!pods_after.is_empty());
    let keep_kinds = |s: &BTreeSet<String>| -> BTreeSet<String> {
        s.iter()
            .filter(|o| !o.starts_with("Pod/") && !o.starts_with("ReplicaSet/"))
            .cloned()
            .collect()
    };
    assert_eq!(
        keep_kinds(&release_objects(&c, rel)),
        keep_kinds(&objects_before),
        "helm upgrade left or added objects"
    );

    // helm uninstall leaves nothing of the release behind; the CRDs and the
    // user's objects stay.
    c.helm_ok(&[
        "uninstall",
        rel,
        "-n",
        &ns.name,
        "--wait",
        "--timeout",
        "120s",
    ]);
    let left = eventually("nothing of the release left", T, || {
        let left = release_objects(&c, rel);
        async move { left.is_empty().then_some(left) }
    })
    .await;
    assert!(left.is_empty(), "{left:?}");
    c.kubectl_ok(&["-n", &ns.name, "get", "capacityprofile", "agent-assist"]);
}

// ---- validation on the real server ------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn the_server_refuses_what_plan_refuses() {
    let Some(c) = connect("the_server_refuses_what_plan_refuses").await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    c.operator_release();
    let ns = c.namespace("validation").await;
    let objects = inc47_objects(&ns.name, "http://127.0.0.1:9");
    let of = |kind: &str| objects.iter().find(|o| o["kind"] == kind).cloned().unwrap();
    let mut high = of("LaneContract");
    high["spec"]["priority"] = json!("high");
    let mut min_max = of("CapacityProfile");
    min_max["spec"]["replicas"]["min"] = json!(9);
    min_max["spec"]["replicas"]["max"] = json!(4);
    let mut misspelt = of("LaneContract");
    let floor = misspelt["spec"]
        .as_object_mut()
        .unwrap()
        .remove("floorUnitsPerSecond")
        .unwrap();
    misspelt["spec"]["flooorUnitsPerSecond"] = floor;
    for (what, obj, server_says, field) in [
        ("priority \"high\"", high, "spec.priority", "spec.priority"),
        (
            "replicas.min > replicas.max",
            min_max,
            "replicas.min must be <= replicas.max",
            "spec.replicas",
        ),
        (
            "a misspelt field",
            misspelt,
            "unknown field \"spec.flooorUnitsPerSecond\"",
            "spec.flooorUnitsPerSecond",
        ),
    ] {
        let yaml = serde_yaml::to_string(&obj).unwrap();
        let o = c.kubectl_stdin(&["apply", "-f", "-"], &yaml);
        assert!(!o.ok, "{what}: the server accepted it: {}", o.stdout);
        assert!(o.stderr.contains(server_says), "{what}: {}", o.stderr);
        // plan refuses the same file, naming the field, exit code 2.
        let dir = cluster::scratch().join(cluster::unique("plan-bad"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("bad.yaml"), &yaml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
            .args(["plan", "-f"])
            .arg(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: plan: {err}");
        assert!(err.contains(&format!(": {field}: ")), "{what}: plan: {err}");
    }
}

// ---- RBAC --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn calls_outside_the_charts_role_are_refused() {
    let Some(c) = connect("calls_outside_the_charts_role_are_refused").await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let kc = controller_kubeconfig(&c).await;
    let ns = c.namespace("rbac").await;
    c.apply(&pool_deployment(&ns.name, 0, 1)).await.unwrap();
    c.kubectl_ok(&[
        "-n",
        &ns.name,
        "create",
        "secret",
        "generic",
        "db-password",
        "--from-literal=password=hunter2",
    ]);
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kc).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let sa = Client::try_from(config).unwrap();
    let forbidden = |r: Result<(), kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    };
    // Reading what it needs works (the scale target is watched by name)...
    let by_name = ListParams::default().fields(&format!("metadata.name={POOL}"));
    let found = Api::<Deployment>::namespaced(sa.clone(), &ns.name)
        .list(&by_name)
        .await
        .expect("list the pool Deployment");
    assert_eq!(found.items.len(), 1);
    // ...deleting a Deployment, listing Secrets, writing a Secret, deleting
    // pods and reading across to another kind are refused.
    forbidden(
        Api::<Deployment>::namespaced(sa.clone(), &ns.name)
            .delete(POOL, &DeleteParams::default())
            .await
            .map(|_| ()),
        "delete a Deployment",
    );
    forbidden(
        Api::<Secret>::namespaced(sa.clone(), &ns.name)
            .list(&ListParams::default())
            .await
            .map(|_| ()),
        "list Secrets",
    );
    forbidden(
        Api::<Secret>::namespaced(sa.clone(), &ns.name)
            .delete("db-password", &DeleteParams::default())
            .await
            .map(|_| ()),
        "delete a Secret",
    );
    forbidden(
        Api::<Pod>::namespaced(sa.clone(), &ns.name)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .map(|_| ()),
        "delete pods",
    );
    forbidden(
        Api::<Lease>::namespaced(sa.clone(), RELEASE_NS)
            .get("some-other-lease")
            .await
            .map(|_| ()),
        "get a Lease other than its own",
    );
    // The same, asked of the authorizer: Secrets may be read by name only
    // (rbac.secrets), never listed.
    let can = |verb: &str, resource: &str| {
        let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
        let o = c.kubectl(&[
            "auth",
            "can-i",
            verb,
            resource,
            &format!("--subresource={sub}"),
            "-n",
            &ns.name,
            &format!("--as={CONTROLLER_USER}"),
        ]);
        o.stdout.trim() == "yes"
    };
    assert!(can("get", "secrets"));
    assert!(!can("list", "secrets"));
    assert!(!can("delete", "deployments"));
    assert!(can("patch", "deployments/scale"));
    assert!(can("patch", "pods/status"));
    assert!(!can("update", "pods"));
}

// ---- INC-47 on the kwok GPU nodes -------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn inc47_on_gpu_nodes() {
    let Some(c) = connect("inc47_on_gpu_nodes").await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let _gpus = GPU.lock().await;
    let kc = controller_kubeconfig(&c).await;
    let (normal, degraded) = inc47_capacities();
    // 16 GPUs on two nodes; the blocker takes 7 of one node, so exactly 9
    // one-GPU pool pods fit.
    let Some(w) = World::new(&c, "inc47", 8, 1, Some(7)).await else {
        return;
    };
    eventually("the 8 pool pods Running", T, || async {
        let pods = w.pods().await;
        (pods.len() == 8 && pods.iter().all(running)).then_some(())
    })
    .await;
    // Not Ready yet: the serving gate is not set (kwok plays the kubelet's
    // readiness-gate rule).
    assert!(
        w.pods()
            .await
            .iter()
            .all(|p| pod_condition(p, "Ready").as_deref() != Some("True")),
        "pods Ready before their gate"
    );

    let mut ctl = Controller::start(&kc, w.name(), "inc47", &["--leader-elect=false"]);

    // 560 from Prometheus, demand 488.1: level 1, every lane admitted.
    let cfg = eventually("level 1 at 560", T, || async {
        w.lanes_json().await.filter(|v| v["level"] == 1)
    })
    .await;
    assert_eq!(cfg["schemaVersion"], 1);
    assert_eq!(cfg["levelName"], "conserve");
    assert_eq!(cfg["flags"]["rejectOptionalContext"], true);
    assert_eq!(cfg["inFlight"]["stopAt"], 1500);
    assert_eq!(
        lane(&cfg, "p1-agent-assist")["optionalContext"]["historyTurns"],
        8,
        "degraded history at conserve"
    );
    for (name, admitted) in [
        ("p0-disruption-assist", 93.6),
        ("p1-agent-assist", 180.0),
        ("p2-email-extract", 66.5),
        ("p3-shift-batch", 99.0),
        ("p4-eval-backfill", 49.0),
    ] {
        assert!(
            close(&lane(&cfg, name)["admittedUnitsPerSecond"], admitted),
            "{name}: {}",
            lane(&cfg, name)
        );
    }
    // The status follows the ConfigMap (written after it).
    eventually("status: capacity 560 from Prometheus", T, || async {
        let st = w.status().await;
        (close(&st["capacityUnitsPerSecond"], normal) && st["level"] == 1).then_some(())
    })
    .await;
    // The pods become Ready through the gate the controller sets.
    eventually("8 pool pods Ready through the serving gate", T, || async {
        let pods = w.pods().await;
        (pods.len() >= 8
            && pods
                .iter()
                .filter(|p| {
                    pod_condition(p, SERVING).as_deref() == Some("True")
                        && pod_condition(p, "Ready").as_deref() == Some("True")
                })
                .count()
                >= 8)
            .then_some(())
    })
    .await;

    // Demand wants 9 replicas: the scale goes through /scale, the new pod is
    // created by the ReplicaSet controller, placed by the scheduler and made
    // Running by kwok.
    eventually(
        "desired replicas 9 written to the Deployment",
        T,
        || async { (w.deployment().await.spec?.replicas? == 9).then_some(()) },
    )
    .await;
    eventually("9 pool pods Running and Ready", T, || async {
        let pods = w.pods().await;
        (pods.len() == 9
            && pods
                .iter()
                .all(|p| running(p) && pod_condition(p, "Ready").as_deref() == Some("True")))
        .then_some(())
    })
    .await;

    // The incident: capacity 420 in Prometheus. Level 2, P4 paused, P3
    // capped at 60, 400.1 admitted.
    w.set(|t| t.available = degraded);
    let cfg = eventually("level 2 with 400.1 admitted at 420", T, || async {
        w.lanes_json().await.filter(is_inc47_level2)
    })
    .await;
    assert_eq!(lane(&cfg, "p4-eval-backfill")["state"], "Paused");
    assert_eq!(lane(&cfg, "p4-eval-backfill")["burst"], 0);
    // Retry after one stable window (the e2e policy's, shortened).
    assert_eq!(
        lane(&cfg, "p4-eval-backfill")["retryAfterSeconds"],
        STABLE_FOR
    );
    assert_eq!(lane(&cfg, "p3-shift-batch")["state"], "Capped");
    let raised = eventually("a LevelRaised 1 -> 2 event", T, || async {
        let ev = w.events("LevelRaised").await;
        ev.iter()
            .any(|(e, _)| e["note"].as_str().unwrap_or_default().contains("1 -> 2"))
            .then_some(ev)
    })
    .await;
    assert!(raised.iter().all(|(e, _)| e["type"] == "Warning"));
    assert!(close(
        &lane(&cfg, "p3-shift-batch")["admittedUnitsPerSecond"],
        60.0
    ));
    assert!(close(
        &lane(&cfg, "p0-disruption-assist")["admittedUnitsPerSecond"],
        93.6
    ));

    // A surge wants more replicas than the GPUs allow: the extra pods stay
    // Pending, add no capacity, and the status says why.
    w.set(|t| {
        for rps in t.lanes.values_mut() {
            *rps *= 1.3;
        }
    });
    let st = eventually("PoolGrowthBlocked for lack of GPUs", T, || async {
        let st = w.status().await;
        let (s, reason, msg) = condition(&st, "PoolGrowthBlocked")?;
        (s == "True" && reason == "PodsUnschedulable" && msg.contains("nvidia.com/gpu"))
            .then_some(st)
    })
    .await;
    assert!(st["desiredReplicas"].as_i64().unwrap() > 9, "{st}");
    let pods = w.pods().await;
    let pending = pods.iter().filter(|p| !running(p)).count();
    assert!(pending >= 1, "pending pods");
    assert_eq!(pods.iter().filter(|p| running(p)).count(), 9);
    assert!(st["readyReplicas"].as_i64().unwrap() <= 9, "{st}");
    w.set(|t| {
        for rps in t.lanes.values_mut() {
            *rps /= 1.3;
        }
    });

    // Three misbehaving pods; the bound (maxDrained 25 %, minServing 2)
    // lets two drain at once. Checked at every sample.
    let bad: Vec<String> = w
        .pods()
        .await
        .iter()
        .filter(|p| running(p))
        .take(3)
        .map(|p| p.name_any())
        .collect();
    // Error ratios 0.9, 0.6 and 0.3: the two worst are the ones drained.
    w.set(|t| {
        for (p, e) in bad.iter().zip([0.9, 0.6, 0.3]) {
            t.errors.insert(p.clone(), e);
        }
    });
    let start = Instant::now();
    let mut most = 0;
    let mut budget_seen = None;
    while start.elapsed() < Duration::from_secs(30) {
        let pods = w.pods().await;
        let n = pods.iter().filter(|p| drained(p)).count();
        let budget = w.status().await["drainBudget"].as_u64();
        if let Some(b) = budget {
            budget_seen = Some(b);
            assert!(n as u64 <= b.max(2), "{n} pods drained, the bound is {b}");
        }
        assert!(n <= 2, "{n} pods drained, the bound is 2");
        most = most.max(n);
        if most == 2 && start.elapsed() > Duration::from_secs(10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(most, 2, "two pods drained (budget {budget_seen:?})");
    let worst = w.drained_pods().await;
    let mut want = bad[..2].to_vec();
    want.sort();
    assert_eq!(worst, want, "the two worst pods drained");
    for p in w.pods().await.iter().filter(|p| drained(p)) {
        assert!(
            bad.contains(&p.name_any()),
            "{} drained but healthy",
            p.name_any()
        );
        eventually("a drained pod: gate False, not Ready", T, || async {
            let pods = w.pods().await;
            let q = pods.iter().find(|q| q.name_any() == p.name_any())?;
            (pod_condition(q, SERVING).as_deref() == Some("False")
                && pod_condition(q, "Ready").as_deref() == Some("False"))
            .then_some(())
        })
        .await;
    }
    eventually("the third bad pod waits for the bound", T, || async {
        condition(&w.status().await, "DrainBudgetExhausted")
            .is_some_and(|c| c.0 == "True")
            .then_some(())
    })
    .await;

    // The errors stop: the pods are undrained after healthyForSeconds and
    // serve again.
    w.set(|t| t.errors.clear());
    eventually(
        "no pod drained, all running pods Ready again",
        T,
        || async {
            let pods = w.pods().await;
            (pods.iter().all(|p| !drained(p))
                && pods
                    .iter()
                    .filter(|p| running(p))
                    .all(|p| pod_condition(p, "Ready").as_deref() == Some("True")))
            .then_some(())
        },
    )
    .await;
    // A lane changes: the config follows. A lane is deleted: it leaves.
    let mut p1 = inc47_objects(w.name(), &w.prom.url())
        .into_iter()
        .find(|o| o["metadata"]["name"] == "p1-agent-assist")
        .unwrap();
    p1["spec"]["ceilingUnitsPerSecond"] = json!("150");
    c.apply(&p1).await.unwrap();
    eventually("the config follows a lane change", T, || async {
        let cfg = w.lanes_json().await?;
        close(
            &lane(&cfg, "p1-agent-assist")["admittedUnitsPerSecond"],
            150.0,
        )
        .then_some(())
    })
    .await;
    c.kubectl_ok(&["-n", w.name(), "delete", "lanecontract", "p4-eval-backfill"]);
    eventually("a deleted lane leaves the config", T, || async {
        let cfg = w.lanes_json().await?;
        (cfg["lanes"].as_array()?.len() == 4).then_some(())
    })
    .await;
    assert!(ctl.running(), "controller exited:\n{}", ctl.log_text());

    // Every call the controller made was one the chart grants; none was
    // refused. (Local control plane: its audit log.)
    if c.local.is_some() {
        tokio::time::sleep(Duration::from_secs(2)).await; // audit batch flush
        let (seen, refused) = audited_accesses(&c, w.name());
        assert!(refused.is_empty(), "refused calls: {refused:#?}");
        let granted = chart_rules();
        let extra: Vec<_> = seen.iter().filter(|a| !granted.contains(a)).collect();
        assert!(
            extra.is_empty(),
            "calls beyond the chart's rules: {extra:?}"
        );
        assert!(
            seen.contains(&("apps".into(), "deployments/scale".into(), "patch".into())),
            "the scale went through the /scale subresource: {seen:?}"
        );
        assert!(seen.contains(&("".into(), "pods/status".into(), "patch".into())));
    }
    ctl.kill();
}

// ---- faults ------------------------------------------------------------------

async fn lease_holder(c: &Cluster) -> Option<String> {
    Api::<Lease>::namespaced(c.client.clone(), RELEASE_NS)
        .get_opt(RELEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_failover_within_one_lease_duration() {
    let Some(c) = connect("leader_failover_within_one_lease_duration").await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let kc = controller_kubeconfig(&c).await;
    let (normal, degraded) = inc47_capacities();
    // Pool pods without GPUs: this test needs none.
    let Some(w) = World::new(&c, "failover", 8, 0, None).await else {
        return;
    };
    let lease_secs = 4;
    let lease_arg = lease_secs.to_string();
    let args = [
        "--leader-elect=true",
        "--lease-duration-seconds",
        &lease_arg,
    ];
    let mut a = Controller::start(&kc, w.name(), "failover-a", &args);
    let first = eventually("failover-a holds the lease", T, || async {
        lease_holder(&c).await.filter(|h| h == "failover-a")
    })
    .await;
    let mut b = Controller::start(&kc, w.name(), "failover-b", &args);
    eventually("level 1", T, || async {
        w.lanes_json().await.filter(|v| v["level"] == 1)
    })
    .await;
    w.set(|t| t.available = degraded);
    eventually("level 2 under the first leader", T, || async {
        w.lanes_json().await.filter(is_inc47_level2)
    })
    .await;
    assert_eq!(lease_holder(&c).await.as_deref(), Some(first.as_str()));
    // Only the leader writes; the standby waits.
    assert_eq!(a.metric_sum("lanekeeper_leader").await, 1.0);
    assert_eq!(b.metric_sum("lanekeeper_leader").await, 0.0);
    assert!(a.metric_sum("lanekeeper_api_writes_total").await > 0.0);
    assert_eq!(
        b.metric_sum("lanekeeper_api_writes_total").await,
        0.0,
        "the standby never writes"
    );

    // The leader dies without releasing the Lease.
    a.kill();
    let killed = Instant::now();
    let mut levels = BTreeSet::new();
    loop {
        if let Some(cfg) = w.lanes_json().await {
            levels.insert(cfg["level"].as_u64().unwrap_or(99));
        }
        if lease_holder(&c).await.as_deref() == Some("failover-b") {
            break;
        }
        assert!(killed.elapsed() < T, "failover-b never took the lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = killed.elapsed();
    eprintln!(
        "failover: the standby led {took:?} after the leader was killed (lease {lease_secs} s)"
    );
    assert!(
        took <= Duration::from_secs(lease_secs + 2),
        "took {took:?}, more than one lease duration ({lease_secs} s) and a renew period"
    );
    // No decision lost: the new leader continues at level 2 (the engine
    // state is in status), then acts: capacity back, one step down after
    // the stable window.
    assert_eq!(
        levels,
        BTreeSet::from([2]),
        "levels seen during the failover"
    );
    let cfg = w.lanes_json().await.unwrap();
    assert!(is_inc47_level2(&cfg), "{cfg}");
    w.set(|t| t.available = normal);
    let back = Instant::now();
    eventually("the new leader steps down to level 1", T, || async {
        w.lanes_json().await.filter(|v| v["level"] == 1)
    })
    .await;
    assert!(
        back.elapsed() >= Duration::from_secs(STABLE_FOR as u64 - 1),
        "stepped down after {:?}, before the stable window",
        back.elapsed()
    );
    assert!(b.running(), "standby exited:\n{}", b.log_text());
    b.kill();
}

/// Watches the gateway ConfigMap and records every version's lanes.json.
/// Where two `lanes.json` documents differ: the paths of the values that
/// do, each with both values.
fn changed_paths(a: &str, b: &str) -> Vec<String> {
    fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                    let (va, vb) = (
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                    );
                    walk(&format!("{path}/{k}"), va, vb, out);
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                    walk(&format!("{path}/{i}"), va, vb, out);
                }
            }
            _ if a != b => out.push(format!("{path}: {a} -> {b}")),
            _ => {}
        }
    }
    let parse = |t: &str| serde_json::from_str(t).unwrap_or(Value::String(t.to_owned()));
    let mut out = Vec::new();
    walk("", &parse(a), &parse(b), &mut out);
    out
}

fn record_config_versions(client: Client, ns: String) -> Arc<Mutex<Vec<(String, String)>>> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let seen = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        let api = Api::<ConfigMap>::namespaced(client, &ns);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={CONFIG}"));
        let mut s = watcher(api, cfg).applied_objects().boxed();
        while let Some(ev) = s.next().await {
            if let Ok(cm) = ev {
                let rv = cm.resource_version().unwrap_or_default();
                let data = cm
                    .data
                    .and_then(|d| d.get("lanes.json").cloned())
                    .unwrap_or_default();
                let mut v = out.lock().unwrap();
                if v.last().is_none_or(|(r, _)| *r != rv) {
                    v.push((rv, data));
                }
            }
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn apiserver_and_etcd_restarts_mid_incident() {
    let Some(c) = connect("apiserver_and_etcd_restarts_mid_incident").await else {
        return;
    };
    if !c.has_local_processes(
        "apiserver_and_etcd_restarts_mid_incident",
        "restarts need the local control plane (e2e/cluster.sh)",
    ) {
        return;
    }
    // Alone on the cluster: nothing else may see the API server go away.
    let _alone = CLUSTER.write().await;
    let kc = controller_kubeconfig(&c).await;
    let (normal, degraded) = inc47_capacities();
    let Some(w) = World::new(&c, "restarts", 8, 0, None).await else {
        return;
    };
    let versions = record_config_versions(c.client.clone(), w.name().to_owned());
    let mut ctl = Controller::start(&kc, w.name(), "restarts", &["--leader-elect=false"]);
    eventually("level 1 and 9 Ready pods", T, || async {
        let st = w.status().await;
        (st["level"] == 1 && st["readyReplicas"] == 9).then_some(())
    })
    .await;

    // The drain bound is sampled all along.
    let bound_broken = Arc::new(Mutex::new(None::<String>));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    {
        let (client, ns, broken, on) = (
            c.client.clone(),
            w.name().to_owned(),
            bound_broken.clone(),
            sampling.clone(),
        );
        tokio::spawn(async move {
            while on.load(std::sync::atomic::Ordering::Relaxed) {
                let pods = pool_pods(&client, &ns).await;
                let n = pods.iter().filter(|p| drained(p)).count();
                if n > 2 {
                    *broken.lock().unwrap() = Some(format!("{n} drained"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
    let bad: Vec<String> = w
        .pods()
        .await
        .iter()
        .take(3)
        .map(|p| p.name_any())
        .collect();
    w.set(|t| {
        for p in &bad {
            t.errors.insert(p.clone(), 0.5);
        }
    });
    eventually("two pods drained", T, || async {
        (w.pods().await.iter().filter(|p| drained(p)).count() == 2).then_some(())
    })
    .await;

    // kube-apiserver restarts; the incident starts while it is down.
    c.cluster_sh("stop", "kube-apiserver");
    w.set(|t| t.available = degraded);
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.cluster_sh("start", "kube-apiserver");
    eventually("level 2 after the API server restart", T, || async {
        w.lanes_json().await.filter(is_inc47_level2)
    })
    .await;

    // etcd restarts; the incident ends while it is down.
    c.cluster_sh("stop", "etcd");
    w.set(|t| {
        t.available = normal;
        t.errors.clear();
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.cluster_sh("start", "etcd");
    eventually(
        "level 1 and nothing drained after the etcd restart",
        T,
        || async {
            let cfg = w.lanes_json().await?;
            let pods = w.pods().await;
            (cfg["level"] == 1 && pods.iter().all(|p| !drained(p))).then_some(())
        },
    )
    .await;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(*bound_broken.lock().unwrap(), None, "drain bound");
    assert!(ctl.running(), "controller exited:\n{}", ctl.log_text());

    // Quiet: once a recovery ramp that may still be writing has ended
    // (3 s without a new version), nothing changes, nothing is written.
    let settled = Instant::now();
    let mut before = versions.lock().unwrap().len();
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = versions.lock().unwrap().len();
        if now == before || settled.elapsed() > T {
            break;
        }
        before = now;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let v = versions.lock().unwrap().clone();
    assert_eq!(
        v.len(),
        before,
        "ConfigMap writes at steady state; what each changed: {:?}",
        v[before.saturating_sub(1)..]
            .windows(2)
            .map(|w| changed_paths(&w[0].1, &w[1].1))
            .collect::<Vec<_>>()
    );
    // Every version of the ConfigMap says something new: no decision
    // written twice, none lost (1 → 2 → 1 seen in order).
    for pair in v.windows(2) {
        assert_ne!(pair[0].1, pair[1].1, "the same config written twice");
    }
    // From the audit log: every ConfigMap write the controller made that
    // the server took produced a new version (no write repeated one that
    // changed nothing, across both restarts).
    tokio::time::sleep(Duration::from_millis(1500)).await; // the audit batch
    let written: Vec<String> = c
        .audit(CONTROLLER_USER)
        .into_iter()
        .filter(|e| {
            e["objectRef"]["namespace"] == w.name()
                && e["objectRef"]["resource"] == "configmaps"
                && e["objectRef"]["name"] == CONFIG
                && e["verb"] == "patch"
                && e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| c < 300)
        })
        .map(|e| {
            e["responseObject"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let distinct: BTreeSet<&String> = written.iter().collect();
    assert!(
        written.len() >= 3,
        "ConfigMap writes seen in the audit log: {written:?}"
    );
    assert_eq!(
        distinct.len(),
        written.len(),
        "a ConfigMap write that changed nothing: {written:?}"
    );
    let levels: Vec<u64> = v
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok()?["level"].as_u64())
        .collect();
    let mut path = levels.clone();
    path.dedup();
    // Before the others get the cluster back: the controller-manager's
    // watches are back too (a new namespace gets its ServiceAccount).
    drop(c.namespace("after-restarts").await);
    assert_eq!(
        path,
        vec![1, 2, 1],
        "levels of the written configs: {levels:?}; the first: {}",
        v[0].1
    );
    ctl.kill();
}
