//! The change freeze on the cluster: the freeze parameters the API
//! server's admission policy reads (one ConfigMap per profile, written
//! when they change, never in observe mode), the exceptions in force on the
//! profile's objects (read from the watch caches, checked by the rules the
//! policy applies) for the profile's status, and the events when the
//! freeze or its exceptions change.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::events::EventType;

use super::super::context::{Context, FIELD_MANAGER};
use super::super::error::Error;
use super::events::{Note, Target};
use super::observe::Observation;
use crate::api::freeze::{EXCEPTION_ANNOTATION, parse_exception};
use crate::api::{CapacityProfileStatus, FreezeException, FreezeState, FreezeStatus, ObjectKey};
use crate::policy::ProfileDecision;
use crate::policy::freeze::{self, Covered, PARAMS_LABEL};

/// The name of a profile's freeze parameter ConfigMap.
pub fn params_name(profile: &str) -> String {
    format!("{profile}-freeze")
}

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
/// force).
pub async fn actuate(
    ctx: &Context,
    obs: &Observation,
    decision: &ProfileDecision,
) -> Result<Option<FreezeStatus>, Error> {
    let f = freeze::freeze(&decision.lanes);
    let objects = covered(obs);
    let refs: Vec<(&str, &str, Covered)> = objects
        .iter()
        .map(|(k, n, c)| (k.as_str(), n.as_str(), *c))
        .collect();
    let wanted = if obs.observe_only() {
        BTreeMap::new()
    } else {
        freeze::params(obs.profile.name_str(), &f, &refs, obs.now)
    };
    write_params(ctx, obs, wanted).await?;
    let exceptions = exceptions(obs, &objects);
    if f.band.is_none() && exceptions.is_empty() {
        return Ok(None);
    }
    Ok(Some(FreezeStatus {
        state: f.state,
        band: f.band,
        lanes: f.lanes,
        exceptions,
    }))
}

/// Writes the parameters when they differ from what the server has (our
/// last write, else the watch cache); an open freeze with no ConfigMap
/// needs none.
async fn write_params(
    ctx: &Context,
    obs: &Observation,
    wanted: BTreeMap<String, String>,
) -> Result<(), Error> {
    let profile = &obs.profile;
    let name = params_name(profile.name_str());
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
            .configmap(profile.namespace_str(), &name)
            .map(|cm| cm.data.clone().unwrap_or_default())
    });
    if current.as_ref().unwrap_or(&BTreeMap::new()) == &wanted {
        return Ok(());
    }
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "lanekeeper".to_owned(),
        ),
        (
            "lanekeeper.dev/profile".to_owned(),
            profile.name_str().to_owned(),
        ),
        (PARAMS_LABEL.to_owned(), "true".to_owned()),
    ]);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: profile.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: profile.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(wanted.clone()),
        ..Default::default()
    };
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), profile.namespace_str());
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .map_err(|e| Error::kube("apply freeze parameters", e))?;
    ctx.metrics.write("ConfigMap", "apply");
    tracing::info!(profile = %key, configmap = %name, band = wanted.get("band").map_or("none", String::as_str), "freeze parameters written");
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
