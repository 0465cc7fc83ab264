//! The object store: served resources, objects, managed fields, the watch event log and the
//! write history. Every operation runs under one lock; nothing here awaits.

use super::fields::{self, FieldSet, Path};
use super::select::{Selector, label_selector_string};
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A served resource type.
#[derive(Clone, Debug)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    /// Has a `/status` subresource (writes to the main resource keep status).
    pub status: bool,
    pub scale: Option<ScaleDef>,
    /// `metadata.generation` is maintained.
    pub generation: bool,
    pub short_names: Vec<String>,
}

/// Where the scale subresource reads and writes, as in a CRD's `subresources.scale`.
#[derive(Clone, Debug)]
pub struct ScaleDef {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

impl ResourceDef {
    pub fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        ResourceDef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            namespaced,
            status: false,
            scale: None,
            generation: false,
            short_names: vec![],
        }
    }
    pub fn with_status(mut self) -> Self {
        self.status = true;
        self
    }
    pub fn with_generation(mut self) -> Self {
        self.generation = true;
        self
    }
    pub fn with_scale(mut self, spec: &str, status: &str, selector: Option<&str>) -> Self {
        self.scale = Some(ScaleDef {
            spec_replicas_path: spec.into(),
            status_replicas_path: status.into(),
            label_selector_path: selector.map(Into::into),
        });
        self
    }
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub fn builtin_resources() -> Vec<ResourceDef> {
    vec![
        ResourceDef::new("", "v1", "Pod", "pods", true).with_status(),
        ResourceDef::new("", "v1", "ConfigMap", "configmaps", true),
        ResourceDef::new("", "v1", "Event", "events", true),
        ResourceDef::new("", "v1", "Namespace", "namespaces", false).with_status(),
        ResourceDef::new("events.k8s.io", "v1", "Event", "events", true),
        ResourceDef::new("coordination.k8s.io", "v1", "Lease", "leases", true),
        ResourceDef::new("apps", "v1", "Deployment", "deployments", true)
            .with_status()
            .with_generation()
            .with_scale(".spec.replicas", ".status.replicas", Some(".spec.selector")),
        ResourceDef::new("apps", "v1", "ReplicaSet", "replicasets", true).with_status(),
        ResourceDef::new("apps", "v1", "StatefulSet", "statefulsets", true)
            .with_status()
            .with_generation()
            .with_scale(".spec.replicas", ".status.replicas", Some(".spec.selector")),
        ResourceDef::new(
            "autoscaling",
            "v2",
            "HorizontalPodAutoscaler",
            "horizontalpodautoscalers",
            true,
        )
        .with_status()
        .with_generation(),
        ResourceDef::new(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
        )
        .with_status()
        .with_generation(),
    ]
}

/// An error answered as a `Status` body.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn not_found(rd: &ResourceDef, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(rd)),
        );
        e.details = Some(json!({"name": name, "group": rd.group, "kind": rd.plural}));
        e
    }
    pub fn conflict(rd: &ResourceDef, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(rd)
            ),
        );
        e.details = Some(json!({"name": name, "group": rd.group, "kind": rd.plural}));
        e
    }
    pub fn invalid(rd: &ResourceDef, name: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!(
                "{}.{} \"{name}\" is invalid: {}",
                rd.kind,
                rd.group,
                message.into()
            ),
        );
        e.details = Some(json!({"name": name, "group": rd.group, "kind": rd.kind}));
        e
    }
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

fn qualified(rd: &ResourceDef) -> String {
    if rd.group.is_empty() {
        rd.plural.clone()
    } else {
        format!("{}.{}", rd.plural, rd.group)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
    Scale,
}

impl Sub {
    fn name(self) -> &'static str {
        match self {
            Sub::Main => "",
            Sub::Status => "status",
            Sub::Scale => "scale",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ManagerEntry {
    pub manager: String,
    pub operation: String,
    pub subresource: String,
    pub api_version: String,
    pub time: String,
    pub fields: FieldSet,
}

#[derive(Clone, Debug)]
pub struct Stored {
    pub obj: Value,
    pub managers: Vec<ManagerEntry>,
}

/// Storage key: group, plural, namespace ("" when cluster scoped), name.
pub type Key = (String, String, String, String);

#[derive(Clone, Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub kind: &'static str,
    pub object: Arc<Value>,
    pub old: Option<Arc<Value>>,
}

/// One write as the server committed it: the full object after the write (or the last state
/// for a deletion).
#[derive(Clone, Debug)]
pub struct WriteRecord {
    pub resource_version: u64,
    pub api_version: String,
    pub kind: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub name: String,
    /// "ADDED", "MODIFIED" or "DELETED".
    pub event: String,
    pub object: Value,
    pub time: SystemTime,
}

pub struct Limits {
    pub event_history: usize,
    pub write_log: usize,
}

pub struct State {
    pub rv: u64,
    pub resources: Vec<ResourceDef>,
    pub objects: BTreeMap<Key, Stored>,
    pub events: VecDeque<StoredEvent>,
    /// Watches from a resourceVersion below this are too old (410 Expired).
    pub oldest_watchable: u64,
    pub writes: VecDeque<WriteRecord>,
    pub writes_dropped: u64,
    pub limits: Limits,
    uid_seed: u64,
    uid_counter: u64,
}

pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60
    )
}

fn strip_meta_status(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("apiVersion");
        m.remove("kind");
    }
    v
}

fn without_volatile(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    v
}

fn same_fields(a: &[ManagerEntry], b: &[ManagerEntry]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.manager == y.manager
                && x.operation == y.operation
                && x.subresource == y.subresource
                && x.fields == y.fields
        })
}

fn meta_str<'a>(v: &'a Value, f: &str) -> Option<&'a str> {
    v.get("metadata")
        .and_then(|m| m.get(f))
        .and_then(Value::as_str)
}

/// The parts of an object a write to `sub` may change, taken from `new`, the rest from `old`.
fn project(rd: &ResourceDef, sub: Sub, old: Option<&Value>, new: Value) -> Value {
    match (sub, old) {
        (Sub::Status, Some(old)) => {
            let mut out = old.clone();
            match new.get("status") {
                Some(s) => out["status"] = s.clone(),
                None => {
                    if let Some(m) = out.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            out
        }
        (Sub::Main, old) if rd.status => {
            let mut out = new;
            if let Some(m) = out.as_object_mut() {
                match old.and_then(|o| o.get("status")) {
                    Some(s) => {
                        m.insert("status".into(), s.clone());
                    }
                    None => {
                        m.remove("status");
                    }
                }
            }
            out
        }
        _ => new,
    }
}

impl State {
    pub fn new(limits: Limits) -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7);
        State {
            rv: 1,
            resources: builtin_resources(),
            objects: BTreeMap::new(),
            events: VecDeque::new(),
            oldest_watchable: 1,
            writes: VecDeque::new(),
            writes_dropped: 0,
            limits,
            uid_seed: seed,
            uid_counter: 0,
        }
    }

    fn new_uid(&mut self) -> String {
        self.uid_counter += 1;
        let x = self.uid_seed ^ self.uid_counter.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (x >> 32) as u32,
            (x >> 16) as u16,
            (x & 0xfff) as u16,
            (self.uid_counter & 0xfff) as u16,
            self.uid_counter
        )
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<ResourceDef> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    /// Looks a resource up by `apiVersion` and kind or plural (case-insensitive).
    pub fn find_by(&self, api_version: &str, kind_or_plural: &str) -> Option<ResourceDef> {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        self.resources
            .iter()
            .find(|r| {
                r.group == group
                    && r.version == version
                    && (r.plural.eq_ignore_ascii_case(kind_or_plural)
                        || r.kind.eq_ignore_ascii_case(kind_or_plural))
            })
            .cloned()
    }

    fn key(rd: &ResourceDef, ns: &str, name: &str) -> Key {
        let ns = if rd.namespaced { ns } else { "" };
        (
            rd.group.clone(),
            rd.plural.clone(),
            ns.to_string(),
            name.to_string(),
        )
    }

    /// The object as served through `rd` (its apiVersion set to the served version).
    fn view(rd: &ResourceDef, obj: &Value) -> Value {
        let mut v = obj.clone();
        v["apiVersion"] = json!(rd.api_version());
        v["kind"] = json!(rd.kind);
        v
    }

    pub fn get(&self, rd: &ResourceDef, ns: &str, name: &str) -> Option<Value> {
        self.objects
            .get(&Self::key(rd, ns, name))
            .map(|s| Self::view(rd, &s.obj))
    }

    pub fn list(&self, rd: &ResourceDef, ns: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((g, p, n, _), _)| {
                *g == rd.group && *p == rd.plural && ns.is_none_or(|ns| !rd.namespaced || n == ns)
            })
            .map(|(_, s)| Self::view(rd, &s.obj))
            .collect()
    }

    fn render_managed(entries: &[ManagerEntry]) -> Value {
        Value::Array(
            entries
                .iter()
                .map(|e| {
                    let mut v = json!({
                        "manager": e.manager,
                        "operation": e.operation,
                        "apiVersion": e.api_version,
                        "time": e.time,
                        "fieldsType": "FieldsV1",
                        "fieldsV1": fields::fields_v1(&e.fields),
                    });
                    if !e.subresource.is_empty() {
                        v["subresource"] = json!(e.subresource);
                    }
                    v
                })
                .collect(),
        )
    }

    /// Commits `new` as the next state of the object at `key`; returns the stored view.
    /// A write that changes nothing is not committed (no new resourceVersion, no event).
    fn commit(
        &mut self,
        rd: &ResourceDef,
        key: Key,
        new: Value,
        managers: Vec<ManagerEntry>,
    ) -> Value {
        let old = self.objects.get(&key).cloned();
        let mut new = new;
        if !new.is_object() {
            new = json!({});
        }
        if new.get("metadata").is_none_or(|m| !m.is_object()) {
            new["metadata"] = json!({});
        }
        new["apiVersion"] = json!(rd.api_version());
        new["kind"] = json!(rd.kind);
        {
            let meta = new["metadata"].as_object_mut().expect("metadata object");
            meta.insert("name".into(), json!(key.3));
            if rd.namespaced {
                meta.insert("namespace".into(), json!(key.2));
            } else {
                meta.remove("namespace");
            }
            meta.remove("managedFields");
            if let Some(old) = &old {
                for f in [
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                ] {
                    match old.obj["metadata"].get(f) {
                        Some(v) => {
                            meta.insert(f.into(), v.clone());
                        }
                        None => {
                            meta.remove(f);
                        }
                    }
                }
            }
        }
        let managers: Vec<ManagerEntry> = managers
            .into_iter()
            .filter(|m| !m.fields.is_empty())
            .collect();
        if let Some(old) = &old {
            let mut old_cmp = without_volatile(&old.obj);
            old_cmp["apiVersion"] = new["apiVersion"].clone();
            old_cmp["kind"] = new["kind"].clone();
            if old_cmp == without_volatile(&new) && same_fields(&old.managers, &managers) {
                return Self::view(rd, &old.obj);
            }
        }
        // Finalizers emptied on an object marked for deletion: it goes now.
        if let Some(old) = &old {
            let marked = old.obj["metadata"].get("deletionTimestamp").is_some();
            let no_finalizers = new["metadata"]
                .get("finalizers")
                .and_then(Value::as_array)
                .is_none_or(|a| a.is_empty());
            if marked && no_finalizers {
                self.objects
                    .insert(key.clone(), Stored { obj: new, managers });
                return self.remove_now(rd, &key).unwrap_or_default();
            }
        }
        self.rv += 1;
        let rv = self.rv;
        let meta = new["metadata"].as_object_mut().expect("metadata object");
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        match &old {
            None => {
                let uid = meta.get("uid").and_then(Value::as_str).map(str::to_string);
                let uid = match uid {
                    Some(u) => u,
                    None => self.new_uid(),
                };
                let meta = new["metadata"].as_object_mut().expect("metadata object");
                meta.insert("uid".into(), json!(uid));
                meta.entry("creationTimestamp")
                    .or_insert_with(|| json!(now_rfc3339()));
                if rd.generation {
                    meta.insert("generation".into(), json!(1));
                }
            }
            Some(old) => {
                if rd.generation && strip_meta_status(&old.obj) != strip_meta_status(&new) {
                    let g = old.obj["metadata"]
                        .get("generation")
                        .and_then(Value::as_i64)
                        .unwrap_or(0)
                        + 1;
                    new["metadata"]["generation"] = json!(g);
                }
            }
        }
        if !managers.is_empty() {
            new["metadata"]["managedFields"] = Self::render_managed(&managers);
        }
        let event = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.objects.insert(
            key.clone(),
            Stored {
                obj: new.clone(),
                managers,
            },
        );
        self.record(rd, &key, event, &new, old.map(|o| o.obj));
        if rd.group == "apiextensions.k8s.io" && rd.plural == "customresourcedefinitions" {
            self.crd_changed(&key);
            return self
                .objects
                .get(&key)
                .map(|s| Self::view(rd, &s.obj))
                .unwrap_or(new);
        }
        Self::view(rd, &new)
    }

    fn record(
        &mut self,
        rd: &ResourceDef,
        key: &Key,
        event: &'static str,
        obj: &Value,
        old: Option<Value>,
    ) {
        let rv = self.rv;
        self.events.push_back(StoredEvent {
            rv,
            group: key.0.clone(),
            plural: key.1.clone(),
            namespace: key.2.clone(),
            kind: event,
            object: Arc::new(obj.clone()),
            old: old.map(Arc::new),
        });
        while self.events.len() > self.limits.event_history {
            if let Some(e) = self.events.pop_front() {
                self.oldest_watchable = e.rv;
            }
        }
        self.writes.push_back(WriteRecord {
            resource_version: rv,
            api_version: rd.api_version(),
            kind: rd.kind.clone(),
            plural: rd.plural.clone(),
            namespace: rd.namespaced.then(|| key.2.clone()),
            name: key.3.clone(),
            event: event.to_string(),
            object: obj.clone(),
            time: SystemTime::now(),
        });
        while self.writes.len() > self.limits.write_log {
            self.writes.pop_front();
            self.writes_dropped += 1;
        }
    }

    /// Forgets the watch history: any watch from a resourceVersion before now gets 410.
    pub fn compact(&mut self) {
        self.events.clear();
        self.oldest_watchable = self.rv;
    }

    // ----- managed fields -----

    fn default_manager(manager: Option<&str>) -> String {
        manager
            .filter(|m| !m.is_empty())
            .unwrap_or("unknown")
            .to_string()
    }

    /// Ownership after an Update (PUT, merge/strategic/JSON patch) by `manager`.
    fn update_managers(
        rd: &ResourceDef,
        old: Option<&Stored>,
        new: &Value,
        manager: &str,
        sub: Sub,
    ) -> Vec<ManagerEntry> {
        let old_leaves = old
            .map(|o| fields::leaves(&fields::trackable(&o.obj)))
            .unwrap_or_default();
        let new_leaves = fields::leaves(&fields::trackable(new));
        let changed: Vec<&Path> = new_leaves
            .iter()
            .filter(|(p, v)| old_leaves.get(*p) != Some(*v))
            .map(|(p, _)| p)
            .collect();
        let removed: Vec<&Path> = old_leaves
            .keys()
            .filter(|p| !new_leaves.contains_key(*p))
            .collect();
        let mut managers = old.map(|o| o.managers.clone()).unwrap_or_default();
        for m in managers.iter_mut() {
            m.fields.retain(|q| {
                !changed
                    .iter()
                    .chain(removed.iter())
                    .any(|p| fields::overlaps(p, q))
            });
        }
        let sub_name = sub.name();
        let idx = managers.iter().position(|m| {
            m.manager == manager && m.operation == "Update" && m.subresource == sub_name
        });
        let entry = match idx {
            Some(i) => &mut managers[i],
            None => {
                managers.push(ManagerEntry {
                    manager: manager.to_string(),
                    operation: "Update".into(),
                    subresource: sub_name.into(),
                    api_version: rd.api_version(),
                    time: String::new(),
                    fields: FieldSet::new(),
                });
                managers.last_mut().expect("pushed")
            }
        };
        if !changed.is_empty() || entry.fields.is_empty() {
            entry.time = now_rfc3339();
        }
        entry.fields.extend(changed.into_iter().cloned());
        managers
    }

    // ----- operations -----

    fn check_body_identity(
        rd: &ResourceDef,
        ns: &str,
        name: Option<&str>,
        body: &Value,
    ) -> Result<(), ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request was in an unknown format",
            ));
        }
        let bname = meta_str(body, "name").unwrap_or_default();
        let is_scale =
            rd.scale.is_some() && body.get("kind").and_then(Value::as_str) == Some("Scale");
        if let Some(bv) = body
            .get("apiVersion")
            .and_then(Value::as_str)
            .filter(|_| !is_scale)
            && bv != rd.api_version()
            && !(rd.group.is_empty() && bv == "v1")
        {
            let same_group = bv.split_once('/').map(|(g, _)| g) == Some(rd.group.as_str());
            if !same_group {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({bv}) does not match the expected API version ({})",
                    rd.api_version()
                )));
            }
        }
        if let Some(bk) = body.get("kind").and_then(Value::as_str)
            && bk != rd.kind
            && !(rd.scale.is_some() && bk == "Scale")
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({bk}) does not match the expected kind ({})",
                rd.kind
            )));
        }
        if let Some(name) = name
            && !bname.is_empty()
            && bname != name
        {
            return Err(ApiError::invalid(
                rd,
                bname,
                format!(
                    "metadata.name: Invalid value: \"{bname}\": field is immutable (the name in the body does not match the name in the URL {name:?})"
                ),
            ));
        }
        if rd.namespaced
            && let Some(bns) = meta_str(body, "namespace")
            && !bns.is_empty()
            && bns != ns
        {
            return Err(ApiError::new(
                400,
                "BadRequest",
                format!(
                    "the namespace of the provided object does not match the namespace sent on the request ({bns} != {ns})"
                ),
            ));
        }
        Ok(())
    }

    fn check_rv(rd: &ResourceDef, name: &str, body: &Value, cur: &Value) -> Result<(), ApiError> {
        if let Some(rv) = meta_str(body, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(cur, "resourceVersion")
        {
            return Err(ApiError::conflict(rd, name));
        }
        Ok(())
    }

    pub fn create(
        &mut self,
        rd: &ResourceDef,
        ns: &str,
        mut body: Value,
        manager: Option<&str>,
        raw: bool,
    ) -> Result<Value, ApiError> {
        Self::check_body_identity(rd, ns, None, &body)?;
        let mut name = meta_str(&body, "name").unwrap_or_default().to_string();
        if name.is_empty()
            && let Some(prefix) = meta_str(&body, "generateName")
        {
            let n = self.uid_counter + 1;
            name = format!(
                "{prefix}{:05x}",
                (self.uid_seed.wrapping_add(n) ^ n.wrapping_mul(7919)) & 0xfffff
            );
        }
        if name.is_empty() {
            return Err(ApiError::invalid(
                rd,
                "",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
        if rd.namespaced && ns.is_empty() {
            return Err(ApiError::bad_request(
                "the namespace of the object is required",
            ));
        }
        let key = Self::key(rd, ns, &name);
        if self.objects.contains_key(&key) {
            let mut e = ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", qualified(rd)),
            );
            e.details = Some(json!({"name": name, "group": rd.group, "kind": rd.plural}));
            return Err(e);
        }
        if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in [
                "resourceVersion",
                "uid",
                "generation",
                "deletionTimestamp",
                "managedFields",
            ] {
                meta.remove(f);
            }
            if !raw {
                meta.remove("creationTimestamp");
            }
        }
        if rd.status
            && !raw
            && let Some(m) = body.as_object_mut()
        {
            m.remove("status");
        }
        let manager = Self::default_manager(manager);
        let managers = Self::update_managers(rd, None, &body, &manager, Sub::Main);
        Ok(self.commit(rd, key, body, managers))
    }

    /// Commits an update (PUT or patch) of `cur` to `new`: the updater owns
    /// what changed; a scale write answers with the Scale view.
    #[allow(clippy::too_many_arguments)]
    fn commit_update(
        &mut self,
        rd: &ResourceDef,
        ns: &str,
        name: &str,
        cur: &Stored,
        new: Value,
        manager: Option<&str>,
        sub: Sub,
    ) -> Value {
        let manager = Self::default_manager(manager);
        let managers = Self::update_managers(rd, Some(cur), &new, &manager, sub);
        let out = self.commit(rd, Self::key(rd, ns, name), new, managers);
        if sub == Sub::Scale {
            self.scale_view(rd, &out)
        } else {
            out
        }
    }

    fn current(&self, rd: &ResourceDef, ns: &str, name: &str) -> Result<Stored, ApiError> {
        self.objects
            .get(&Self::key(rd, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rd, name))
    }

    /// PUT. `raw` (direct test access) writes every part, status included.
    #[allow(clippy::too_many_arguments)]
    pub fn replace(
        &mut self,
        rd: &ResourceDef,
        ns: &str,
        name: &str,
        sub: Sub,
        body: Value,
        manager: Option<&str>,
        raw: bool,
    ) -> Result<Value, ApiError> {
        Self::check_body_identity(rd, ns, Some(name), &body)?;
        let cur = self.current(rd, ns, name)?;
        Self::check_rv(rd, name, &body, &cur.obj)?;
        let new = match sub {
            Sub::Scale => self.scale_into(rd, &cur.obj, &body)?,
            _ if raw => body,
            _ => project(rd, sub, Some(&cur.obj), body),
        };
        Ok(self.commit_update(rd, ns, name, &cur, new, manager, sub))
    }

    /// Merge, strategic merge or JSON patch.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        rd: &ResourceDef,
        ns: &str,
        name: &str,
        sub: Sub,
        ptype: PatchType,
        patch: &Value,
        manager: Option<&str>,
    ) -> Result<Value, ApiError> {
        let cur = self.current(rd, ns, name)?;
        let base = if sub == Sub::Scale {
            self.scale_view(rd, &Self::view(rd, &cur.obj))
        } else {
            Self::view(rd, &cur.obj)
        };
        let mut doc = base.clone();
        match ptype {
            PatchType::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "the body of the request was in an unknown format: a merge patch must be a JSON object",
                    ));
                }
                fields::merge_patch(&mut doc, patch)
            }
            PatchType::Strategic => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "the body of the request was in an unknown format: a strategic merge patch must be a JSON object",
                    ));
                }
                fields::strategic_patch(&mut doc, patch, None)
            }
            PatchType::Json => {
                let ops: json_patch::Patch =
                    serde_json::from_value(patch.clone()).map_err(|e| {
                        ApiError::bad_request(format!(
                            "the body of the request was in an unknown format: {e}"
                        ))
                    })?;
                json_patch::patch(&mut doc, &ops).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the JSON patch could not be applied: {e}"),
                    )
                })?;
            }
        }
        if ptype != PatchType::Json {
            Self::check_rv(rd, name, patch, &cur.obj)?;
        } else if meta_str(&doc, "resourceVersion") != meta_str(&base, "resourceVersion") {
            Self::check_rv(rd, name, &doc, &cur.obj)?;
        }
        if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        Self::check_body_identity(rd, ns, Some(name), &doc)?;
        let new = match sub {
            Sub::Scale => self.scale_into(rd, &cur.obj, &doc)?,
            _ => project(rd, sub, Some(&cur.obj), doc),
        };
        Ok(self.commit_update(rd, ns, name, &cur, new, manager, sub))
    }

    /// Server-side apply.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        rd: &ResourceDef,
        ns: &str,
        name: &str,
        sub: Sub,
        applied: &Value,
        manager: Option<&str>,
        force: bool,
    ) -> Result<(Value, bool), ApiError> {
        let Some(manager) = manager.filter(|m| !m.is_empty()) else {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml requests require a fieldManager query parameter",
            ));
        };
        if !applied.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request was in an unknown format: an applied configuration must be an object",
            ));
        }
        if sub != Sub::Scale {
            Self::check_body_identity(rd, ns, Some(name), applied)?;
            if applied.get("apiVersion").is_none() || applied.get("kind").is_none() {
                return Err(ApiError::bad_request(
                    "apiVersion and kind must be set in an applied configuration",
                ));
            }
        }
        let cur = self.objects.get(&Self::key(rd, ns, name)).cloned();
        if let Some(cur) = &cur {
            Self::check_rv(rd, name, applied, &cur.obj)?;
        }
        // The part of the applied configuration this endpoint may write, in object terms.
        let mut config = match sub {
            Sub::Scale => {
                let cur = cur.as_ref().ok_or_else(|| ApiError::not_found(rd, name))?;
                let sd = rd
                    .scale
                    .clone()
                    .ok_or_else(|| ApiError::not_found(rd, name))?;
                let mut c = json!({});
                if let Some(r) = applied.pointer("/spec/replicas") {
                    fields::set_path(
                        &mut c,
                        &fields::dotted_to_path(&sd.spec_replicas_path),
                        r.clone(),
                    );
                }
                let _ = cur;
                c
            }
            Sub::Status => json!({"status": applied.get("status").cloned().unwrap_or(json!({}))}),
            Sub::Main => {
                let mut c = applied.clone();
                if rd.status
                    && let Some(m) = c.as_object_mut()
                {
                    m.remove("status");
                }
                c
            }
        };
        if let Some(meta) = config.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        let applied_leaves = fields::leaves(&fields::trackable(&config));
        let sub_name = sub.name();
        let mut managers = cur.as_ref().map(|c| c.managers.clone()).unwrap_or_default();
        let mut live = cur
            .as_ref()
            .map(|c| c.obj.clone())
            .unwrap_or_else(|| json!({"metadata": {"name": name}}));

        // Conflicts: a field another manager owns whose live value the apply would change.
        let mut conflicts: Vec<(String, Path)> = Vec::new();
        for (p, v) in &applied_leaves {
            let Some(lv) = fields::get_path(&live, p) else {
                continue;
            };
            if lv == v {
                continue;
            }
            for m in &managers {
                if m.manager != manager && m.fields.contains(p) {
                    conflicts.push((m.manager.clone(), p.clone()));
                }
            }
        }
        if !conflicts.is_empty() {
            if !force {
                let causes: Vec<Value> = conflicts
                    .iter()
                    .map(|(m, p)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m:?}"), "field": fields::path_string(p)}))
                    .collect();
                let list: Vec<String> = conflicts
                    .iter()
                    .map(|(m, p)| format!("conflict with {m:?}: {}", fields::path_string(p)))
                    .collect();
                let mut e = ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Apply failed with {} conflict{}: {}",
                        conflicts.len(),
                        if conflicts.len() == 1 { "" } else { "s" },
                        list.join("; ")
                    ),
                );
                e.details = Some(
                    json!({"name": name, "group": rd.group, "kind": rd.plural, "causes": causes}),
                );
                return Err(e);
            }
            for m in managers.iter_mut() {
                if m.manager != manager {
                    m.fields.retain(|q| !conflicts.iter().any(|(_, p)| p == q));
                }
            }
        }
        // Removal: fields this manager applied before, no longer applies, and nobody else owns.
        let idx = managers.iter().position(|m| {
            m.manager == manager && m.operation == "Apply" && m.subresource == sub_name
        });
        if let Some(i) = idx {
            let previous = managers[i].fields.clone();
            for p in previous.iter().filter(|p| !applied_leaves.contains_key(*p)) {
                let shared = managers
                    .iter()
                    .enumerate()
                    .any(|(j, m)| j != i && m.fields.contains(p));
                if !shared {
                    fields::remove_path(&mut live, p);
                }
            }
        }
        fields::apply_merge(&mut live, &config, None);
        let set: FieldSet = applied_leaves.keys().cloned().collect();
        match idx {
            Some(i) => {
                if managers[i].fields != set {
                    managers[i].time = now_rfc3339();
                }
                managers[i].fields = set;
            }
            None => managers.push(ManagerEntry {
                manager: manager.to_string(),
                operation: "Apply".into(),
                subresource: sub_name.into(),
                api_version: rd.api_version(),
                time: now_rfc3339(),
                fields: set,
            }),
        }
        let created = cur.is_none();
        if created {
            if rd.namespaced && ns.is_empty() {
                return Err(ApiError::bad_request(
                    "the namespace of the object is required",
                ));
            }
            if let Some(meta) = live.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("uid");
                meta.remove("creationTimestamp");
            }
        }
        let out = self.commit(rd, Self::key(rd, ns, name), live, managers);
        Ok((
            if sub == Sub::Scale {
                self.scale_view(rd, &out)
            } else {
                out
            },
            created,
        ))
    }

    pub fn delete(
        &mut self,
        rd: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &Value,
    ) -> Result<Value, ApiError> {
        let cur = self.current(rd, ns, name)?;
        if let Some(pre) = opts.get("preconditions") {
            let uid_ok = pre
                .get("uid")
                .and_then(Value::as_str)
                .is_none_or(|u| Some(u) == meta_str(&cur.obj, "uid"));
            let rv_ok = pre
                .get("resourceVersion")
                .and_then(Value::as_str)
                .is_none_or(|r| Some(r) == meta_str(&cur.obj, "resourceVersion"));
            if !uid_ok || !rv_ok {
                return Err(ApiError::conflict(rd, name));
            }
        }
        let orphan = opts.get("propagationPolicy").and_then(Value::as_str) == Some("Orphan")
            || opts.get("orphanDependents").and_then(Value::as_bool) == Some(true);
        let key = Self::key(rd, ns, name);
        let has_finalizers = cur.obj["metadata"]
            .get("finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if has_finalizers {
            if cur.obj["metadata"].get("deletionTimestamp").is_some() {
                return Ok(Self::view(rd, &cur.obj));
            }
            let mut obj = cur.obj.clone();
            obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            // commit() carries deletionTimestamp over from the old state, so set it directly.
            self.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            self.objects.insert(
                key.clone(),
                Stored {
                    obj: obj.clone(),
                    managers: cur.managers,
                },
            );
            self.record(rd, &key, "MODIFIED", &obj, Some(cur.obj));
            return Ok(Self::view(rd, &obj));
        }
        let out = self.remove_now(rd, &key).unwrap_or_default();
        if !orphan {
            self.cascade(&cur.obj);
        }
        Ok(out)
    }

    fn remove_now(&mut self, rd: &ResourceDef, key: &Key) -> Option<Value> {
        let stored = self.objects.remove(key)?;
        self.rv += 1;
        let mut obj = stored.obj;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(rd, key, "DELETED", &obj, None);
        if rd.group == "apiextensions.k8s.io" && rd.plural == "customresourcedefinitions" {
            self.crd_deleted(&obj);
        }
        if rd.group.is_empty() && rd.plural == "namespaces" {
            let ns = key.3.clone();
            let doomed: Vec<Key> = self.objects.keys().filter(|k| k.2 == ns).cloned().collect();
            for k in doomed {
                if let Some(rd) = self
                    .resources
                    .iter()
                    .find(|r| r.group == k.0 && r.plural == k.1)
                    .cloned()
                {
                    self.remove_now(&rd, &k);
                }
            }
        }
        Some(Self::view(rd, &obj))
    }

    /// Deletes the dependents of a deleted owner (foreground-free, synchronous garbage collection).
    fn cascade(&mut self, owner: &Value) {
        let Some(uid) = meta_str(owner, "uid").map(str::to_string) else {
            return;
        };
        let dependents: Vec<Key> = self
            .objects
            .iter()
            .filter(|(_, s)| {
                s.obj
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| {
                        refs.iter()
                            .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid.as_str()))
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in dependents {
            let Some(rd) = self
                .resources
                .iter()
                .find(|r| r.group == k.0 && r.plural == k.1)
                .cloned()
            else {
                continue;
            };
            let _ = self.delete(&rd, &k.2, &k.3, &json!({}));
        }
    }

    // ----- scale -----

    pub fn scale_view(&self, rd: &ResourceDef, obj: &Value) -> Value {
        let Some(sd) = &rd.scale else {
            return json!({});
        };
        let spec = fields::get_dotted(obj, &sd.spec_replicas_path)
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let status = fields::get_dotted(obj, &sd.status_replicas_path)
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let selector = sd
            .label_selector_path
            .as_deref()
            .and_then(|p| fields::get_dotted(obj, p))
            .map(|s| match s {
                Value::String(s) => s.clone(),
                other => label_selector_string(other),
            });
        let meta = &obj["metadata"];
        let mut status_v = json!({"replicas": status});
        if let Some(sel) = selector {
            status_v["selector"] = json!(sel);
        }
        json!({
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
                "creationTimestamp": meta.get("creationTimestamp"),
            },
            "spec": {"replicas": spec},
            "status": status_v,
        })
    }

    fn scale_into(&self, rd: &ResourceDef, cur: &Value, scale: &Value) -> Result<Value, ApiError> {
        let sd = rd.scale.as_ref().ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })?;
        let replicas = scale.pointer("/spec/replicas").cloned().unwrap_or(json!(0));
        if !replicas.is_i64() || replicas.as_i64().unwrap_or(-1) < 0 {
            return Err(ApiError::invalid(
                rd,
                meta_str(cur, "name").unwrap_or_default(),
                "spec.replicas: Invalid value: must be a non-negative integer",
            ));
        }
        let mut new = cur.clone();
        fields::set_path(
            &mut new,
            &fields::dotted_to_path(&sd.spec_replicas_path),
            replicas,
        );
        Ok(new)
    }

    // ----- CRDs -----

    fn crd_changed(&mut self, key: &Key) {
        let Some(stored) = self.objects.get(key).cloned() else {
            return;
        };
        let crd = &stored.obj;
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let plural = names
            .get("plural")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if group.is_empty() || kind.is_empty() || plural.is_empty() {
            return;
        }
        let singular = names
            .get("singular")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase());
        let namespaced = crd.pointer("/spec/scope").and_then(Value::as_str) != Some("Cluster");
        self.resources
            .retain(|r| !(r.group == group && r.plural == plural));
        for v in crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            if v.get("served").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            let Some(version) = v.get("name").and_then(Value::as_str) else {
                continue;
            };
            let mut rd =
                ResourceDef::new(&group, version, &kind, &plural, namespaced).with_generation();
            rd.singular = singular.clone();
            rd.short_names = names
                .get("shortNames")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if v.pointer("/subresources/status").is_some() {
                rd.status = true;
            }
            if let Some(s) = v.pointer("/subresources/scale") {
                rd.scale = Some(ScaleDef {
                    spec_replicas_path: s
                        .get("specReplicasPath")
                        .and_then(Value::as_str)
                        .unwrap_or(".spec.replicas")
                        .into(),
                    status_replicas_path: s
                        .get("statusReplicasPath")
                        .and_then(Value::as_str)
                        .unwrap_or(".status.replicas")
                        .into(),
                    label_selector_path: s
                        .get("labelSelectorPath")
                        .and_then(Value::as_str)
                        .map(Into::into),
                });
            }
            self.resources.push(rd);
        }
        // Established and NamesAccepted, as the apiextensions controller would set them.
        let now = now_rfc3339();
        let status = json!({
            "acceptedNames": names,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
            "storedVersions": crd.pointer("/spec/versions").and_then(Value::as_array).map(|a| a.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).filter_map(|v| v.get("name").cloned()).collect::<Vec<_>>()).unwrap_or_default(),
        });
        if crd.pointer("/status/conditions").is_none() {
            let mut obj = crd.clone();
            obj["status"] = status;
            let rd = self
                .find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
                .expect("builtin");
            self.commit(&rd, key.clone(), obj, stored.managers);
        }
    }

    fn crd_deleted(&mut self, crd: &Value) {
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let plural = crd
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let doomed: Vec<Key> = self
            .objects
            .keys()
            .filter(|k| k.0 == group && k.1 == plural)
            .cloned()
            .collect();
        if let Some(rd) = self
            .resources
            .iter()
            .find(|r| r.group == group && r.plural == plural)
            .cloned()
        {
            for k in doomed {
                self.remove_now(&rd, &k);
            }
        }
        self.resources
            .retain(|r| !(r.group == group && r.plural == plural));
    }

    /// List for the HTTP layer: filtered, sorted, paginated.
    #[allow(clippy::too_many_arguments)]
    pub fn list_page(
        &self,
        rd: &ResourceDef,
        ns: Option<&str>,
        labels: &Selector,
        fields_sel: &Selector,
        limit: Option<usize>,
        cont: Option<&str>,
    ) -> Result<(Vec<Value>, u64, Option<String>, usize), ApiError> {
        let (list_rv, start) = match cont {
            Some(c) if !c.is_empty() => {
                let decoded = decode_continue(c)
                    .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
                if decoded.0 < self.oldest_watchable {
                    return Err(ApiError::new(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (decoded.0, Some(decoded.1))
            }
            _ => (self.rv, None),
        };
        let mut items: Vec<(String, Value)> = self
            .list(rd, ns)
            .into_iter()
            .filter(|o| labels.matches_labels(o) && fields_sel.matches_fields(o))
            .map(|o| {
                let k = format!(
                    "{}/{}",
                    meta_str(&o, "namespace").unwrap_or_default(),
                    meta_str(&o, "name").unwrap_or_default()
                );
                (k, o)
            })
            .filter(|(k, _)| start.as_ref().is_none_or(|s| k > s))
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        let mut next = None;
        let mut remaining = 0;
        if let Some(limit) = limit.filter(|l| *l > 0)
            && items.len() > limit
        {
            remaining = items.len() - limit;
            items.truncate(limit);
            next = items.last().map(|(k, _)| encode_continue(list_rv, k));
        }
        Ok((
            items.into_iter().map(|(_, v)| v).collect(),
            list_rv,
            next,
            remaining,
        ))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    Json,
}

fn encode_continue(rv: u64, key: &str) -> String {
    let raw = format!("{rv}|{key}");
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(s: &str) -> Option<(u64, String)> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    let raw = String::from_utf8(bytes?).ok()?;
    let (rv, key) = raw.split_once('|')?;
    Some((rv.parse().ok()?, key.to_string()))
}
