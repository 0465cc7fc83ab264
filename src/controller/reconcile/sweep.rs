//! Sweep: the periodic pass over what no profile's reconcile sees: objects
//! that cannot be read (an event and a condition naming the field), lanes and
//! policies whose profile does not exist (by the binding rule's
//! `unbound_lane`/`unbound_policy`), and profiles that are gone (their pod
//! watch stops and their metric series go).

use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::super::context::{Context, Reconciled};
use super::super::status;
use super::events::{Note, Target, publish};
use super::observe::now;
use super::writes::Written;
use crate::api::common::rfc3339;
use crate::api::{CapacityProfile, DegradationPolicy, LaneContract};
use crate::policy::bind::{unbound_lane, unbound_policy};

/// One pass.
pub async fn sweep(
    ctx: &Context,
    profiles: &Store<DeserializeGuard<CapacityProfile>>,
    lanes: &Store<DeserializeGuard<LaneContract>>,
    policies: &Store<DeserializeGuard<DegradationPolicy>>,
) {
    // Profiles that exist, readable or not: a lane naming an unreadable
    // profile is bound (the profile's own condition says what is wrong).
    let existing: BTreeSet<(String, String)> = profiles
        .state()
        .iter()
        .map(|p| match &p.0 {
            Ok(p) => (p.namespace().unwrap_or_default(), p.name_any()),
            Err(i) => (
                i.metadata.namespace.clone().unwrap_or_default(),
                i.metadata.name.clone().unwrap_or_default(),
            ),
        })
        .collect();
    let exists = |ns: &str, name: &str| existing.contains(&(ns.to_owned(), name.to_owned()));
    let now = now();
    for l in lanes.state().iter() {
        match &l.0 {
            Err(invalid) => report_invalid(ctx, "LaneContract", invalid).await,
            Ok(lane) => {
                let lane = &ctx.writes.freshen(lane);
                if let Some(problem) = unbound_lane(lane, exists) {
                    let msg = problem.to_string();
                    let st = status::lane_status(lane, None, Some(msg.clone()), 0.0, now);
                    report_unbound(ctx, lane, lane.status.as_ref(), &st, msg).await;
                }
            }
        }
    }
    for p in policies.state().iter() {
        match &p.0 {
            Err(invalid) => report_invalid(ctx, "DegradationPolicy", invalid).await,
            Ok(policy) => {
                let policy = &ctx.writes.freshen(policy);
                if let Some(problem) = unbound_policy(policy, exists) {
                    let msg = problem.to_string();
                    let st = status::policy_status(policy, None, Some(msg.clone()), None, &[], now);
                    report_unbound(ctx, policy, policy.status.as_ref(), &st, msg).await;
                }
            }
        }
    }
    forget_gone(ctx, profiles);
}

/// Profiles that left: stop their pod watches and drop their series.
fn forget_gone(ctx: &Context, profiles: &Store<DeserializeGuard<CapacityProfile>>) {
    let live: BTreeSet<String> = profiles
        .state()
        .iter()
        .filter_map(|p| p.0.as_ref().ok().and_then(|p| p.uid()))
        .collect();
    let gone: Vec<Reconciled> = {
        let mut reconciled = ctx.seen.reconciled.lock().expect("not poisoned");
        let uids: Vec<String> = reconciled
            .keys()
            .filter(|u| !live.contains(*u))
            .cloned()
            .collect();
        uids.iter().filter_map(|u| reconciled.remove(u)).collect()
    };
    for w in gone {
        ctx.metrics.forget_profile(&w.namespace, &w.name, &w.lanes);
        let mut r = ObjectRef::<CapacityProfile>::new(&w.name);
        r.namespace = Some(w.namespace.clone());
        ctx.pods.forget(&r);
        ctx.index.forget(&r);
        for source in &ctx.sources {
            source.forget(&w.namespace, &w.name);
        }
    }
}

/// Writes the status of an object whose profile does not exist, with a
/// `ProfileNotFound` event when it changes.
async fn report_unbound<K, S>(ctx: &Context, obj: &K, current: Option<&S>, status: &S, msg: String)
where
    K: Written,
    S: serde::Serialize + PartialEq,
{
    match ctx.writes.status(obj, current, status).await {
        Ok(true) => {
            let n = Note {
                target: Target::Profile,
                type_: EventType::Warning,
                reason: "ProfileNotFound",
                action: "ProfileNotFound".into(),
                note: msg,
            };
            publish(ctx, obj, &n).await;
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %e, "failed to report an object whose profile does not exist")
        }
    }
}

/// Reports an invalid object once per spec generation: an event and a
/// condition in its status naming the field.
pub async fn report_invalid(ctx: &Context, kind: &str, invalid: &InvalidObject) {
    // Once per spec generation (our own status writes don't change it).
    let uid = invalid.metadata.uid.clone().unwrap_or_default();
    let generation = invalid.metadata.generation.unwrap_or_default().to_string();
    {
        let mut seen = ctx.seen.reported_invalid.lock().expect("not poisoned");
        if seen.get(&uid) == Some(&generation) {
            return;
        }
        seen.insert(uid.clone(), generation);
    }
    let ns = invalid.metadata.namespace.clone().unwrap_or_default();
    let name = invalid.metadata.name.clone().unwrap_or_default();
    tracing::warn!(kind, namespace = %ns, name = %name, error = %invalid.error, "invalid object");
    let (plural, cond_type) = match kind {
        "CapacityProfile" => ("capacityprofiles", "Ready"),
        "LaneContract" => ("lanecontracts", "Bound"),
        _ => ("degradationpolicies", "Valid"),
    };
    let ar = kube::core::ApiResource {
        group: crate::api::GROUP.into(),
        version: "v1alpha1".into(),
        api_version: "lanekeeper.dev/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
    // Name the field: read the raw object again with a path-tracking reader.
    let detail = match api.get_opt(&name).await {
        Ok(Some(raw)) => serde_json::to_value(&raw)
            .ok()
            .and_then(|v| crate::manifest::explain(kind, &v)),
        _ => None,
    };
    let message = match detail {
        Some((field, why)) => format!("the object cannot be read: {field}: {why}"),
        None => format!("the object cannot be read: {}", invalid.error),
    };
    let patch = json!({
        "status": {"conditions": [{
            "type": cond_type,
            "status": "False",
            "reason": "InvalidSpec",
            "message": message,
            "lastTransitionTime": rfc3339(now()),
            "observedGeneration": invalid.metadata.generation,
        }]}
    });
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => ctx.metrics.write(kind, "merge-status"),
        Err(e) => tracing::warn!(error = %e, "failed to report the invalid object in its status"),
    }
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("lanekeeper.dev/v1alpha1".into()),
        kind: Some(kind.into()),
        name: Some(name),
        namespace: Some(ns),
        uid: invalid.metadata.uid.clone(),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: "InvalidObject".into(),
        note: Some(message.chars().take(1000).collect()),
        action: "Validate".into(),
        secondary: None,
    };
    match ctx.recorder.publish(&ev, &reference).await {
        Ok(()) => ctx.metrics.write("Event", "create"),
        Err(e) => tracing::warn!(error = %e, "failed to publish event"),
    }
}
