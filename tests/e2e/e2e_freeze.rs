//! The change freeze of the error budgets on a real API server (issue 25
//! item 6): the chart's ValidatingAdmissionPolicy enforces it with the
//! parameters the controller keeps current (the profile's `LaneFreeze`),
//! while a real Prometheus serves a lane's error budget
//! (`laneErrorBudgetRemainingPercent`).
//!
//! With the budget of P0 driven to Exhausted: `kubectl set image` on the
//! pool and an edit of a lane's routes are denied with a message naming the
//! profile, the lane and its band; an exception missing a field or expiring
//! more than 24 h ahead is denied, a valid one admitted and recorded (status
//! and event); the freeze's parameters cannot be deleted by an admin; the
//! controller still scales the pool; and when the budget recovers above
//! 20 % the freeze lifts within one evaluation. Creating a lane or a policy
//! for the frozen profile and deleting one of its lanes are denied the same
//! way (an exception lets them through), and the freeze survives its policy
//! and binding being deleted and re-created, as a reinstall does
//! (kubernetes/kubernetes#130887 does not hit a custom-resource paramKind).

use crate::support;
use crate::world;

use std::time::{Duration, Instant};

use kube::api::Api;
use lanekeeper::api::{Covered, FreezeState, LaneFreeze, LaneFreezeSpec};
use serde_json::{Value, json};
use support::cluster::{Cluster, Controller, connect, eventually};
use world::*;

const P0: &str = "p0-disruption-assist";
const P1: &str = "p1-agent-assist";
const PARAMS: &str = PROFILE;
const EXCEPTION: &str = "lanekeeper.dev/freeze-exception";

/// The world with an objective on P0 and the profile reading its budget
/// from Prometheus, P0's budget at `left` percent.
async fn budget_world(c: &Cluster, left: f64) -> Option<World> {
    let w = World::new(c, "freeze", 8, 0, None).await?;
    w.set(|t| {
        t.budgets.insert(P0.into(), left);
    });
    let ns = w.name().to_owned();
    for mut o in inc47_objects(&ns, &w.prom.url()) {
        if o["kind"] == "LaneContract" && o["metadata"]["name"] == P0 {
            o["spec"]["objective"] = json!({"withinDeadlinePercent": "99.9", "window": "28d"});
        } else if o["kind"] == "CapacityProfile" {
            o["spec"]["signals"]["prometheus"]["queries"]["laneErrorBudgetRemainingPercent"] = json!(
                format!("lane:error_budget_remaining_percent{{namespace=\"{ns}\"}}")
            );
        } else {
            continue;
        }
        c.apply(&o).await.unwrap();
    }
    until_budget(&w, left).await;
    Some(w)
}

/// Waits until Prometheus answers P0's budget as `want` (and the sample is a
/// second old).
async fn until_budget(w: &World, want: f64) {
    let query = format!(
        "{}/api/v1/query?query=lane:error_budget_remaining_percent",
        w.prom.url()
    );
    eventually("Prometheus has P0's budget", T, || {
        let query = query.clone();
        async move {
            let v: Value = reqwest::get(&query).await.ok()?.json().await.ok()?;
            let got: f64 = v["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
            ((got - want).abs() < 1e-9).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
}

/// The profile's LaneFreeze spec (None: none yet).
async fn params(w: &World) -> Option<LaneFreezeSpec> {
    Api::<LaneFreeze>::namespaced(w.client.clone(), w.name())
        .get_opt(PARAMS)
        .await
        .ok()?
        .map(|f| f.spec)
}

/// Whether a LaneFreeze spec freezes nothing.
fn open(p: &Option<LaneFreezeSpec>) -> bool {
    p.as_ref()
        .is_none_or(|p| p.state == FreezeState::Open && p.lanes.is_empty() && p.objects.is_empty())
}

/// Waits until the profile's LaneFreeze is in `state`.
async fn until_state(w: &World, state: FreezeState) -> LaneFreezeSpec {
    eventually("the LaneFreeze in the wanted state", T, || async {
        params(w).await.filter(|p| p.state == state)
    })
    .await
}

/// The role the LaneFreeze gives `kind`/`name`.
fn role(p: &LaneFreezeSpec, kind: &str, name: &str) -> Option<Covered> {
    p.objects
        .iter()
        .find(|o| o.kind == kind && o.name == name)
        .map(|o| o.role)
}

/// `kubectl set image` on the pool: Ok(stdout) or Err(stderr).
fn set_image(c: &Cluster, w: &World, tag: &str) -> Result<String, String> {
    let image = format!("vllm=registry.k8s.io/pause:{tag}");
    let o = c.kubectl(&[
        "-n",
        w.name(),
        "set",
        "image",
        &format!("deployment/{POOL}"),
        &image,
    ]);
    if o.ok { Ok(o.stdout) } else { Err(o.stderr) }
}

/// A new image on the pool together with the exception annotation.
fn image_with_exception(
    c: &Cluster,
    w: &World,
    tag: &str,
    exception: &str,
) -> Result<String, String> {
    let patch = json!({
        "metadata": {"annotations": {EXCEPTION: exception}},
        "spec": {"template": {"spec": {"containers": [{"name": "vllm", "image": format!("registry.k8s.io/pause:{tag}")}]}}}
    });
    let o = c.kubectl(&[
        "-n",
        w.name(),
        "patch",
        &format!("deployment/{POOL}"),
        "--type=strategic",
        "-p",
        &patch.to_string(),
    ]);
    if o.ok { Ok(o.stdout) } else { Err(o.stderr) }
}

/// Adds a primary route to a lane.
fn add_route(c: &Cluster, w: &World, lane: &str, model: &str) -> Result<String, String> {
    let patch = json!([{"op": "add", "path": "/spec/routes/primary/-", "value": model}]);
    let o = c.kubectl(&[
        "-n",
        w.name(),
        "patch",
        "lanecontract",
        lane,
        "--type=json",
        "-p",
        &patch.to_string(),
    ]);
    if o.ok { Ok(o.stdout) } else { Err(o.stderr) }
}

fn rfc3339_in(secs: i64) -> String {
    lanekeeper::api::common::rfc3339(world_now() + secs)
}

fn world_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn exception(expires: &str) -> String {
    format!(
        "reason=CVE fix in the serving image; risk=low, image only; scope=pool {POOL}; rollback=kubectl rollout undo; expires={expires}"
    )
}

/// The denial names the profile, the lane and its band.
fn names_cause(err: &str, band: &str) {
    assert!(
        err.contains("CapacityProfile agent-assist") && err.contains(P0) && err.contains(band),
        "the denial names profile, lane and band: {err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_budget_freezes_changes_at_the_api_server_until_it_recovers() {
    let test = "an_exhausted_budget_freezes_changes_at_the_api_server_until_it_recovers";
    let Some(c) = connect(test).await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let kc = controller_kubeconfig(&c).await;
    let Some(w) = budget_world(&c, 80.0).await else {
        return;
    };
    let _ctl = Controller::start(&kc, w.name(), "freeze", &["--leader-elect=false"]);
    eventually("P0 Routine, the freeze open", T, || async {
        let f = w.status().await["freeze"].clone();
        (f["state"] == "Open" && f["band"] == "Routine").then_some(())
    })
    .await;
    assert!(open(&params(&w).await), "open: nothing frozen");
    set_image(&c, &w, "open-1").expect("an open freeze admits a new image");

    // P0's budget is spent.
    w.set(|t| {
        t.budgets.insert(P0.into(), -5.0);
    });
    until_budget(&w, -5.0).await;
    let p = until_state(&w, FreezeState::Everything).await;
    assert_eq!(p.lanes.len(), 1);
    assert_eq!(
        (p.lanes[0].name.as_str(), p.lanes[0].band.as_str()),
        (P0, "Exhausted")
    );
    assert_eq!(role(&p, "Deployment", POOL), Some(Covered::ScaleTarget));
    assert_eq!(role(&p, "LaneContract", P1), Some(Covered::Lane));
    assert!(p.clock.is_some(), "the minute clock");
    // The API server's parameter cache follows the LaneFreeze within moments.
    let mut n = 0;
    let denied = eventually("kubectl set image denied", T, || {
        n += 1;
        let r = set_image(&c, &w, &format!("frozen-{n}"));
        async move { r.err() }
    })
    .await;
    names_cause(&denied, "Exhausted");
    assert!(
        denied.contains("lanekeeper.dev/freeze-exception"),
        "{denied}"
    );
    let routes = add_route(&c, &w, P1, "agent-xl").expect_err("a routes edit is frozen");
    names_cause(&routes, "Exhausted");
    assert!(routes.contains(&format!("LaneContract {P1}")), "{routes}");

    // Nobody but the controller may lift the freeze by its parameters.
    let o = c.kubectl(&["-n", w.name(), "delete", "lanefreeze", PARAMS]);
    assert!(
        !o.ok && o.stderr.contains("written by lanekeeper only"),
        "{}",
        o.stderr
    );
    let o = c.kubectl(&["-n", w.name(), "label", "lanefreeze", PARAMS, "x=y"]);
    assert!(!o.ok, "an admin relabels the parameters: {}", o.stdout);
    let o = c.kubectl(&[
        "-n",
        w.name(),
        "patch",
        "lanefreeze",
        PARAMS,
        "--type=merge",
        "-p",
        r#"{"spec":{"state":"Open","lanes":[],"objects":[]}}"#,
    ]);
    assert!(
        !o.ok && o.stderr.contains("written by lanekeeper only"),
        "an admin opens the freeze: {}",
        o.stderr
    );

    // The controller still scales the pool (the scale subresource).
    let before = w.deployment().await.spec.unwrap().replicas.unwrap();
    w.set(|t| {
        t.lanes.insert(P1.into(), 330.0);
    });
    eventually("the controller scales the frozen pool up", T, || async {
        let now = w.deployment().await.spec?.replicas?;
        let want = w.status().await["desiredReplicas"].as_i64()?;
        (now > before && i64::from(now) == want).then_some(())
    })
    .await;

    // Exceptions: a missing field and an expiry beyond 24 h are denied.
    let missing = exception(&rfc3339_in(7200)).replace("risk=low, image only; ", "");
    let err = image_with_exception(&c, &w, "exc-1", &missing).expect_err("missing risk");
    assert!(err.contains("missing risk"), "{err}");
    names_cause(&err, "Exhausted");
    let far = exception(&rfc3339_in(25 * 3600));
    let err = image_with_exception(&c, &w, "exc-2", &far).expect_err("25 h ahead");
    assert!(err.contains("at most 24h ahead"), "{err}");
    let past = exception(&rfc3339_in(-600));
    image_with_exception(&c, &w, "exc-3", &past).expect_err("an expired exception");
    // A valid one is admitted, and recorded in status and as an event.
    let valid = exception(&rfc3339_in(7200));
    image_with_exception(&c, &w, "exc-4", &valid).expect("a valid exception is admitted");
    let recorded = eventually("the exception in the profile's status", T, || async {
        let ex = w.status().await["freeze"]["exceptions"].clone();
        ex.as_array()?
            .iter()
            .find(|e| e["kind"] == "Deployment" && e["name"] == POOL)
            .cloned()
    })
    .await;
    assert_eq!(recorded["reason"], "CVE fix in the serving image");
    assert_eq!(recorded["rollback"], "kubectl rollout undo");
    eventually("a FreezeExceptionAccepted event", T, || async {
        let ev = w.events("FreezeExceptionAccepted").await;
        ev.iter()
            .any(|(e, _)| e["note"].as_str().is_some_and(|n| n.contains(POOL)))
            .then_some(())
    })
    .await;

    // Without its exception the pool is frozen again.
    c.kubectl_ok(&[
        "-n",
        w.name(),
        "annotate",
        &format!("deployment/{POOL}"),
        &format!("{EXCEPTION}-"),
    ]);
    names_cause(
        &set_image(&c, &w, "frozen-again").expect_err("frozen again"),
        "Exhausted",
    );

    // The budget recovers above 20 %: the freeze lifts within one
    // evaluation (a 1 s resync here).
    w.set(|t| {
        t.budgets.insert(P0.into(), 30.0);
    });
    until_budget(&w, 30.0).await;
    let started = Instant::now();
    eventually("the LaneFreeze open", T, || async {
        let p = params(&w).await;
        open(&p).then_some(())
    })
    .await;
    let lifted = started.elapsed();
    assert!(lifted < Duration::from_secs(4), "lifted after {lifted:?}");
    // The status follows in the same evaluation (written after the
    // parameters).
    eventually("status.freeze Open with P0 Cautious", T, || async {
        let f = w.status().await["freeze"].clone();
        (f["state"] == "Open" && f["band"] == "Cautious").then_some(())
    })
    .await;
    let mut n = 0;
    eventually("a new image admitted again", T, || {
        n += 1;
        let r = set_image(&c, &w, &format!("thawed-{n}"));
        async move { r.ok() }
    })
    .await;
    add_route(&c, &w, P1, "agent-xl").expect("routes may change again");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restricted_budget_freezes_rollouts_and_routes_only() {
    let test = "a_restricted_budget_freezes_rollouts_and_routes_only";
    let Some(c) = connect(test).await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let kc = controller_kubeconfig(&c).await;
    let Some(w) = budget_world(&c, 10.0).await else {
        return;
    };
    let _ctl = Controller::start(
        &kc,
        w.name(),
        "freeze-restricted",
        &["--leader-elect=false"],
    );
    let p = until_state(&w, FreezeState::Rollouts).await;
    assert_eq!(p.lanes[0].band.as_str(), "Restricted");
    let mut n = 0;
    let denied = eventually("kubectl set image denied", T, || {
        n += 1;
        let r = set_image(&c, &w, &format!("restricted-{n}"));
        async move { r.err() }
    })
    .await;
    names_cause(&denied, "Restricted");
    names_cause(
        &add_route(&c, &w, P1, "agent-xl").expect_err("routes frozen"),
        "Restricted",
    );
    // Other spec changes pass while Restricted: a lane's priority-neutral
    // field and the profile's warning line.
    let o = c.kubectl(&[
        "-n",
        w.name(),
        "patch",
        "capacityprofile",
        "agent-assist",
        "--type=merge",
        "-p",
        r#"{"spec":{"capacity":{"warningUtilizationPercent":80}}}"#,
    ]);
    assert!(o.ok, "a profile edit passes while Restricted: {}", o.stderr);
    let o = c.kubectl(&[
        "-n",
        w.name(),
        "patch",
        "lanecontract",
        P1,
        "--type=merge",
        "-p",
        r#"{"spec":{"expectedRequestsPerSecond":"181"}}"#,
    ]);
    assert!(
        o.ok,
        "a lane edit beside its routes passes while Restricted: {}",
        o.stderr
    );
    // Creating a lane is not a rollout: it passes while Restricted.
    create(&c, &new_lane(&w, "p5-restricted", json!({})))
        .expect("a new lane passes while Restricted");
}

/// A new lane for the profile, `name`, a copy of P1 (with `annotations`).
fn new_lane(w: &World, name: &str, annotations: Value) -> Value {
    let mut lane = inc47_objects(w.name(), &w.prom.url())
        .into_iter()
        .find(|o| o["kind"] == "LaneContract" && o["metadata"]["name"] == P1)
        .unwrap();
    lane["metadata"]["name"] = json!(name);
    lane["metadata"]["annotations"] = annotations;
    lane
}

/// `kubectl create -f -`: Ok(stdout) or Err(stderr).
fn create(c: &Cluster, v: &Value) -> Result<String, String> {
    let o = c.kubectl_stdin(&["create", "-f", "-"], &v.to_string());
    if o.ok { Ok(o.stdout) } else { Err(o.stderr) }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_budget_freezes_creating_and_deleting_lanes_and_policies() {
    let test = "an_exhausted_budget_freezes_creating_and_deleting_lanes_and_policies";
    let Some(c) = connect(test).await else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let kc = controller_kubeconfig(&c).await;
    let Some(w) = budget_world(&c, -5.0).await else {
        return;
    };
    let _ctl = Controller::start(&kc, w.name(), "freeze-create", &["--leader-elect=false"]);
    until_state(&w, FreezeState::Everything).await;
    // Once the API server's parameter cache has the LaneFreeze:
    let mut n = 0;
    eventually("kubectl set image denied", T, || {
        n += 1;
        let r = set_image(&c, &w, &format!("frozen-{n}"));
        async move { r.err() }
    })
    .await;
    // a new lane for the frozen profile is a spec change of the profile's
    // lanes: denied, naming profile, lane and band.
    let lane = new_lane(&w, "p5-new-lane", json!({}));
    let denied = create(&c, &lane).expect_err("creating a lane is frozen");
    names_cause(&denied, "Exhausted");
    assert!(
        denied.contains("LaneContract p5-new-lane") && denied.contains("creating it"),
        "{denied}"
    );
    // So is a second DegradationPolicy for the profile.
    let mut policy = inc47_objects(w.name(), &w.prom.url())
        .into_iter()
        .find(|o| o["kind"] == "DegradationPolicy")
        .unwrap();
    policy["metadata"]["name"] = json!("another-ladder");
    names_cause(
        &create(&c, &policy).expect_err("creating a policy is frozen"),
        "Exhausted",
    );
    // A lane for another profile is not this freeze's business.
    let mut other = new_lane(&w, "p5-other-profile", json!({}));
    other["spec"]["profile"] = json!("some-other-pool");
    create(&c, &other).expect("a lane of another profile is admitted");
    // Moving that lane onto the frozen profile is a change of its lanes.
    let o = c.kubectl(&[
        "-n",
        w.name(),
        "patch",
        "lanecontract",
        "p5-other-profile",
        "--type=merge",
        "-p",
        r#"{"spec":{"profile":"agent-assist"}}"#,
    ]);
    assert!(!o.ok, "moving a lane onto the frozen profile: {}", o.stdout);
    names_cause(&o.stderr, "Exhausted");
    // With an exception, the new lane is admitted and recorded.
    let with = new_lane(
        &w,
        "p5-excepted",
        json!({EXCEPTION: exception(&rfc3339_in(3600))}),
    );
    create(&c, &with).expect("a new lane with a valid exception");
    let bad = new_lane(
        &w,
        "p5-bad-exception",
        json!({EXCEPTION: exception(&rfc3339_in(25 * 3600))}),
    );
    let err = create(&c, &bad).expect_err("an exception 25 h ahead");
    assert!(err.contains("at most 24h ahead"), "{err}");

    // Deleting a lane is a change too: denied without an exception.
    let o = c.kubectl(&["-n", w.name(), "delete", "lanecontract", P1, "--wait=false"]);
    assert!(!o.ok, "deleting a lane under Exhausted: {}", o.stdout);
    names_cause(&o.stderr, "Exhausted");
    assert!(o.stderr.contains("deleting it"), "{}", o.stderr);
    let o = c.kubectl(&[
        "-n",
        w.name(),
        "delete",
        "capacityprofile",
        PROFILE,
        "--wait=false",
    ]);
    assert!(!o.ok, "deleting the profile under Exhausted: {}", o.stdout);
    // Annotating is not a spec change; the annotated lane may go.
    c.kubectl_ok(&[
        "-n",
        w.name(),
        "annotate",
        "lanecontract",
        P1,
        &format!("{EXCEPTION}={}", exception(&rfc3339_in(3600))),
    ]);
    c.kubectl_ok(&["-n", w.name(), "delete", "lanecontract", P1, "--wait=false"]);
    eventually("the excepted lane gone", T, || async {
        let o = c.kubectl(&["-n", w.name(), "get", "lanecontract", P1]);
        (!o.ok && o.stderr.contains("NotFound")).then_some(())
    })
    .await;
}

/// The policy or binding as the API server has it, ready to be created
/// again (server-set metadata and status removed, Helm's labels and
/// annotations kept).
fn as_created(c: &Cluster, kind: &str, name: &str) -> Value {
    let mut v: Value = serde_json::from_str(&c.kubectl_ok(&["get", kind, name, "-o", "json"]))
        .expect("kubectl prints JSON");
    let meta = v["metadata"].as_object_mut().unwrap();
    for k in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
        "managedFields",
    ] {
        meta.remove(k);
    }
    v.as_object_mut().unwrap().remove("status");
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn the_freeze_holds_after_its_policy_and_binding_are_recreated() {
    let test = "the_freeze_holds_after_its_policy_and_binding_are_recreated";
    let Some(c) = connect(test).await else {
        return;
    };
    // Alone: every other test relies on the freeze policy being there.
    let _alone = CLUSTER.write().await;
    let kc = controller_kubeconfig(&c).await;
    let Some(w) = budget_world(&c, -5.0).await else {
        return;
    };
    let _ctl = Controller::start(&kc, w.name(), "freeze-reinstall", &["--leader-elect=false"]);
    until_state(&w, FreezeState::Everything).await;
    let mut n = 0;
    eventually("frozen before the reinstall", T, || {
        n += 1;
        let r = set_image(&c, &w, &format!("before-{n}"));
        async move { r.err() }
    })
    .await;
    // What `helm uninstall` then `helm install` does to the policy: both
    // objects deleted, then created anew.
    let name = format!("{}-freeze", support::cluster::RELEASE);
    let policy = as_created(&c, "validatingadmissionpolicy", &name);
    let binding = as_created(&c, "validatingadmissionpolicybinding", &name);
    c.kubectl_ok(&["delete", "validatingadmissionpolicybinding", &name]);
    c.kubectl_ok(&["delete", "validatingadmissionpolicy", &name]);
    eventually("the pool may change without the policy", T, || {
        n += 1;
        let r = set_image(&c, &w, &format!("unbound-{n}"));
        async move { r.ok() }
    })
    .await;
    create(&c, &policy).expect("policy created again");
    create(&c, &binding).expect("binding created again");
    // The same LaneFreeze, not rewritten: the API server reads it again.
    // (With a built-in paramKind, kubernetes/kubernetes#130887, the
    // parameter informer stops once no binding names the kind: the API
    // server then finds no parameters, or keeps judging by the ones it had,
    // so the freeze is either gone here or never lifts below.)
    let denied = eventually("frozen again after the reinstall", T, || {
        n += 1;
        let r = set_image(&c, &w, &format!("after-{n}"));
        async move { r.err() }
    })
    .await;
    names_cause(&denied, "Exhausted");
    // And it keeps following the LaneFreeze: the budget recovers, the
    // freeze lifts.
    w.set(|t| {
        t.budgets.insert(P0.into(), 30.0);
    });
    until_budget(&w, 30.0).await;
    until_state(&w, FreezeState::Open).await;
    eventually("thawed after the reinstall", T, || {
        n += 1;
        let r = set_image(&c, &w, &format!("thawed-{n}"));
        async move { r.ok() }
    })
    .await;
}
