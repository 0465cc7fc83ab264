//! The change freeze on the cluster: the freeze parameters the API
//! server's admission policy reads (the profile's `LaneFreeze`, same name,
//! owned by the profile, written by server-side apply when they change,
//! open in observe mode), the exceptions in force on the profile's objects
//! (read from the watch caches, checked by the rules the policy applies)
//! for the profile's status, and the events when the freeze or its
//! exceptions change.
//!
//! A `<profile>-freeze` ConfigMap that an earlier version wrote as the
//! parameters is left alone: nothing reads it any more, it goes with its
//! profile (owner reference), and deleting it would need the right to
//! delete every ConfigMap of the watched namespaces, which the controller
//! does not have (docs/operations.md says how to remove it).

use std::collections::BTreeMap;

use kube::Resource;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::events::EventType;

use super::super::context::{Context, FIELD_MANAGER};
use super::super::error::Error;
use super::events::{Note, Target};
use super::observe::Observation;
use super::refusals::Refused;
use crate::api::freeze::{EXCEPTION_ANNOTATION, parse_exception};
use crate::api::{
    CapacityProfileStatus, Covered, FreezeException, FreezeState, FreezeStatus, LaneFreeze,
    LaneFreezeSpec, ObjectKey,
};
use crate::policy::ProfileDecision;
use crate::policy::freeze;

/// The objects a profile's freeze covers: (kind, name, what it is).
fn covered(obs: &Observation) -> Vec<(String, String, Covered)> {
    let target = &obs.profile.spec.pool.scale_target_ref;
    let mut out = vec![
        (
            target.kind.clone(),
            target.name.clone(),
            Covered::ScaleTarget,
        ),
        (
            "CapacityProfile".to_owned(),
            obs.profile.name_str().to_owned(),
            Covered::Profile,
        ),
    ];
    let binding = obs.binding();
    for l in &binding.lanes {
        out.push(("LaneContract".into(), l.name_str().into(), Covered::Lane));
    }
    if let Some(p) = binding.policy {
        out.push((
            "DegradationPolicy".into(),
            p.name_str().into(),
            Covered::Policy,
        ));
    }
    out
}

/// The exceptions in force on the covered objects (annotation present,
/// every field, not expired, at most 24 h ahead), in the order covered.
fn exceptions(obs: &Observation, objects: &[(String, String, Covered)]) -> Vec<FreezeException> {
    let annotation = |kind: &str, name: &str| -> Option<String> {
        let meta = match kind {
            "CapacityProfile" => Some(obs.profile.meta().clone()),
            "LaneContract" => obs
                .lanes
                .iter()
                .find(|l| l.name_str() == name)
                .map(|l| l.meta().clone()),
            "DegradationPolicy" => obs
                .policies
                .iter()
                .find(|p| p.name_str() == name)
                .map(|p| p.meta().clone()),
            _ => obs
                .target
                .as_ref()?
                .workload
                .as_ref()
                .map(|w| w.meta().clone()),
        }?;
        meta.annotations?.get(EXCEPTION_ANNOTATION).cloned()
    };
    objects
        .iter()
        .filter_map(|(kind, name, _)| {
            let text = annotation(kind, name)?;
            parse_exception(kind, name, &text, obs.now).ok()
        })
        .collect()
}

/// Keeps the profile's freeze parameters current and returns the freeze
/// for its status (None: no lane has an objective and no exception is in
/// force). A refused write of the parameters goes into `refused`.
pub async fn actuate(
    ctx: &Context,
    obs: &Observation,
    decision: &ProfileDecision,
    refused: &mut Vec<Refused>,
) -> Option<FreezeStatus> {
    let f = freeze::freeze(&decision.lanes);
    let objects = covered(obs);
    let refs: Vec<(&str, &str, Covered)> = objects
        .iter()
        .map(|(k, n, c)| (k.as_str(), n.as_str(), *c))
        .collect();
    let wanted = if obs.observe_only() {
        freeze::open(obs.profile.name_str())
    } else {
        freeze::params(obs.profile.name_str(), &f, &refs, obs.now)
    };
    if let Err(r) = write_params(ctx, obs, wanted).await {
        refused.push(r);
    }
    let exceptions = exceptions(obs, &objects);
    if f.band.is_none() && exceptions.is_empty() {
        return None;
    }
    Some(FreezeStatus {
        state: f.state,
        band: f.band,
        lanes: f.lane_names(),
        exceptions,
    })
}

/// Writes the profile's LaneFreeze when its spec differs from what the
/// server has (our last write, else the watch cache); an open freeze with
/// no LaneFreeze needs none.
async fn write_params(
    ctx: &Context,
    obs: &Observation,
    wanted: LaneFreezeSpec,
) -> Result<(), Refused> {
    let profile = &obs.profile;
    let name = profile.name_str().to_owned();
    let key = profile.key();
    let remembered = ctx
        .seen
        .freeze_params
        .lock()
        .expect("not poisoned")
        .get(&key)
        .cloned();
    let current = remembered.or_else(|| {
        ctx.index
            .lane_freeze(profile.namespace_str(), &name)
            .map(|f| f.spec.clone())
    });
    if current.unwrap_or_else(|| freeze::open(&name)) == wanted {
        return Ok(());
    }
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "lanekeeper".to_owned(),
        ),
        ("lanekeeper.dev/profile".to_owned(), name.clone()),
    ]);
    let mut object = LaneFreeze::new(&name, wanted.clone());
    object.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: profile.metadata.namespace.clone(),
        labels: Some(labels),
        owner_references: profile.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    };
    let api: Api<LaneFreeze> = Api::namespaced(ctx.client.clone(), profile.namespace_str());
    let write = async {
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(|e| Error::kube("apply LaneFreeze", e))
    };
    let target = format!("LaneFreeze/{key}");
    let spec = serde_json::to_string(&wanted).unwrap_or_default();
    let what = || format!("apply the freeze parameters {target}");
    ctx.refusals
        .attempt(&ctx.metrics, (&target, &spec), what, write)
        .await?;
    ctx.metrics.write("LaneFreeze", "apply");
    tracing::info!(profile = %key, state = wanted.state.as_str(), "freeze parameters written");
    ctx.seen
        .freeze_params
        .lock()
        .expect("not poisoned")
        .insert(key, wanted);
    Ok(())
}

/// The freeze's events: the state changed (a Warning when it tightened),
/// and each exception newly in force (Normal, naming its fields).
pub fn events(before: &CapacityProfileStatus, after: &CapacityProfileStatus) -> Vec<Note> {
    let mut out = Vec::new();
    let (was, now) = (before.freeze.as_ref(), after.freeze.as_ref());
    let state = |f: Option<&FreezeStatus>| f.map_or(FreezeState::Open, |f| f.state);
    if state(was) != state(now) {
        let f = now.cloned().unwrap_or_default();
        let cause = f.band.map_or_else(String::new, |b| {
            format!(" (lane {} is {})", f.lanes.join(", "), b.as_str())
        });
        out.push(Note {
            target: Target::Profile,
            type_: if state(now) > state(was) {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: "FreezeChanged",
            action: format!("Freeze{}", f.state.as_str()),
            note: format!(
                "change freeze {} -> {}{cause}",
                state(was).as_str(),
                f.state.as_str()
            ),
        });
    }
    let old: &[FreezeException] = was.map_or(&[], |f| &f.exceptions);
    for e in now.map_or(&[][..], |f| &f.exceptions) {
        if old.contains(e) {
            continue;
        }
        out.push(Note {
            target: Target::Profile,
            type_: EventType::Normal,
            reason: "FreezeExceptionAccepted",
            action: format!("Exception{}", e.kind),
            note: format!(
                "freeze exception on {} {} until {}: reason: {}; risk: {}; scope: {}; rollback: {}",
                e.kind, e.name, e.expires, e.reason, e.risk, e.scope, e.rollback
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Band;

    fn status(state: FreezeState, exceptions: Vec<FreezeException>) -> CapacityProfileStatus {
        CapacityProfileStatus {
            freeze: Some(FreezeStatus {
                state,
                band: Some(Band::Exhausted),
                lanes: vec!["p0".into()],
                exceptions,
            }),
            ..Default::default()
        }
    }

    fn exception(name: &str) -> FreezeException {
        FreezeException {
            kind: "Deployment".into(),
            name: name.into(),
            reason: "CVE".into(),
            risk: "low".into(),
            scope: "image".into(),
            rollback: "undo".into(),
            expires: "2026-12-03T18:00:00Z".into(),
        }
    }

    #[test]
    fn a_tighter_freeze_warns_once_and_names_lane_and_band() {
        let open = CapacityProfileStatus::default();
        let frozen = status(FreezeState::Everything, vec![]);
        let n = events(&open, &frozen);
        assert_eq!(n.len(), 1);
        assert_eq!(
            (n[0].reason, n[0].type_),
            ("FreezeChanged", EventType::Warning)
        );
        assert!(n[0].note.contains("lane p0 is Exhausted"), "{}", n[0].note);
        assert!(events(&frozen, &frozen).is_empty(), "steady: no event");
        let lifted = events(&frozen, &open);
        assert_eq!(
            (lifted[0].reason, lifted[0].type_),
            ("FreezeChanged", EventType::Normal)
        );
    }

    #[test]
    fn each_new_exception_is_recorded_once() {
        let one = status(FreezeState::Everything, vec![exception("a")]);
        let two = status(
            FreezeState::Everything,
            vec![exception("a"), exception("b")],
        );
        let n = events(&one, &two);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].reason, "FreezeExceptionAccepted");
        assert!(n[0].note.contains("Deployment b") && n[0].note.contains("reason: CVE"));
        assert!(events(&two, &two).is_empty());
    }
}
