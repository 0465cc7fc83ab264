//! Loading lanekeeper objects from manifest files and directories.
//!
//! Multi-document YAML, and a `v1 List`'s items; objects of other kinds
//! and documents that are not Kubernetes objects are skipped with a note
//! (signals timelines and scenarios, lanekeeper's own offline inputs,
//! without one). An invalid lanekeeper object is an error naming the file,
//! the object and the field. Validation refuses
//! fields the CRD does not declare (the API server's strict field
//! validation, kubectl's default) and runs the CRDs' own CEL rules (the ones
//! the API server runs), so an object that `plan` accepts is one
//! `kubectl apply` accepts too.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kube::core::crd::CustomResourceExt;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{CapacityProfile, DegradationPolicy, GROUP, LaneContract};
use crate::policy::World;
use crate::scenario::Scenario;
use crate::snapshot::SignalsFile;

/// A problem with one object or file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A document is not valid YAML.
    #[error("{path}: document {doc}: not valid YAML: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// 1-based document index.
        doc: usize,
        /// Why.
        message: String,
    },
    /// A lanekeeper object is invalid.
    #[error("{path}: {object}: {field}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// `Kind namespace/name`.
        object: String,
        /// The field path, e.g. `spec.replicas.min`.
        field: String,
        /// Why.
        message: String,
    },
    /// Two documents define the same object (kind, namespace and name).
    #[error(
        "{second}: {object} is also defined in {first}: one document per kind, namespace and name (kubectl apply would keep only one of them; remove or rename one)"
    )]
    Duplicate {
        /// `Kind namespace/name`.
        object: String,
        /// `file: document N` of the first definition.
        first: String,
        /// `file: document N` of the second.
        second: String,
    },
}

/// What was loaded, plus notes about what was skipped.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The objects.
    pub world: World,
    /// Notes about skipped documents (for stderr).
    pub notes: Vec<String>,
    /// Where each object was read (`file: document N`), by `Kind
    /// namespace/name`: a second definition is an error.
    sources: BTreeMap<String, String>,
}

/// Collects YAML files under `paths` (directories are walked recursively,
/// files in name order). A file or directory reached twice (named twice,
/// named and inside a directory also named, or through a symlink) is
/// listed once, where it is first reached.
pub fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, LoadError> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for p in paths {
        walk(p, &mut seen, &mut out)?;
    }
    Ok(out)
}

fn walk(p: &Path, seen: &mut HashSet<PathBuf>, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let io = |source| LoadError::Io {
        path: p.to_owned(),
        source,
    };
    let meta = std::fs::metadata(p).map_err(io)?;
    if !seen.insert(std::fs::canonicalize(p).map_err(io)?) {
        return Ok(());
    }
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            let is_yaml = e.extension().is_some_and(|x| x == "yaml" || x == "yml");
            if e.is_dir() || is_yaml {
                walk(&e, seen, out)?;
            }
        }
    } else {
        out.push(p.to_owned());
    }
    Ok(())
}

/// Loads every lanekeeper object under `paths`.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, LoadError> {
    let mut loaded = Loaded::default();
    for file in collect_files(paths)? {
        let text = std::fs::read_to_string(&file).map_err(|source| LoadError::Io {
            path: file.clone(),
            source,
        })?;
        load_str(&file, &text, &mut loaded)?;
    }
    Ok(loaded)
}

/// Loads the documents of one file's text into `loaded`. A `v1 List`
/// (`kubectl get -o yaml`) stands for its items, each read as a document.
pub fn load_str(path: &Path, text: &str, loaded: &mut Loaded) -> Result<(), LoadError> {
    use serde::Deserialize;
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let n = i + 1;
        let yaml = |e: &dyn fmt::Display| LoadError::Yaml {
            path: path.to_owned(),
            doc: n,
            message: e.to_string(),
        };
        let value = serde_yaml::Value::deserialize(doc).map_err(|e| yaml(&e))?;
        if value.is_null() {
            continue; // empty document
        }
        let json: Value = serde_json::to_value(&value).map_err(|e| yaml(&e))?;
        if is_list(&json) {
            load_list(path, n, &json, loaded)?;
        } else {
            load_object(path, &format!("document {n}"), json, Some(&value), loaded)?;
        }
    }
    Ok(())
}

/// `apiVersion: v1, kind: List`: what `kubectl get -o yaml` prints.
fn is_list(json: &Value) -> bool {
    json.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && json.get("kind").and_then(Value::as_str) == Some("List")
}

/// The items of the List that is document `doc` of `path`, each read as a
/// document (`document N, items[I]`), as kubectl reads them. A List in a
/// List is refused: kubectl does not print one.
fn load_list(path: &Path, doc: usize, json: &Value, loaded: &mut Loaded) -> Result<(), LoadError> {
    let refuse = |field: String, message: &str| LoadError::Invalid {
        path: path.to_owned(),
        object: format!("document {doc}: List"),
        field,
        message: message.to_owned(),
    };
    let Some(items) = json.get("items").and_then(Value::as_array) else {
        return Err(refuse("items".into(), "is required: a List of objects"));
    };
    for (i, item) in items.iter().enumerate() {
        if is_list(item) {
            return Err(refuse(
                format!("items[{i}]"),
                "a List in a List is not read",
            ));
        }
        let at = format!("document {doc}, items[{i}]");
        load_object(path, &at, item.clone(), None, loaded)?;
    }
    Ok(())
}

/// Loads one object, `at` (`document N`) in `path`: lanekeeper's are
/// validated and added; others, and documents that are not Kubernetes
/// objects, are skipped with a note (without one for an offline input,
/// `yaml` being the document as read).
fn load_object(
    path: &Path,
    at: &str,
    json: Value,
    yaml: Option<&serde_yaml::Value>,
    loaded: &mut Loaded,
) -> Result<(), LoadError> {
    let field = |name: &str| json.get(name).and_then(Value::as_str).map(str::to_owned);
    let (Some(api_version), Some(kind)) = (field("apiVersion"), field("kind")) else {
        if !yaml.is_some_and(is_offline_input) {
            loaded.notes.push(format!(
                "{}: {at} is not a Kubernetes object (no apiVersion/kind): skipped",
                path.display()
            ));
        } // else a signals timeline or a scenario kept beside the manifests
        return Ok(());
    };
    let group = api_version.split('/').next().unwrap_or_default();
    if group != GROUP {
        loaded.notes.push(format!(
            "{}: {at}: {kind} ({api_version}) is not a lanekeeper kind: skipped",
            path.display()
        ));
        return Ok(());
    }
    if api_version != "lanekeeper.dev/v1alpha1" {
        return Err(invalid(
            path,
            &json,
            &kind,
            "apiVersion",
            format!("unsupported version {api_version:?} (expected lanekeeper.dev/v1alpha1)"),
        ));
    }
    add(path, at, json, &kind, loaded)
}

/// Adds `at` (`document N`) of `path`, a lanekeeper object of `kind`, to
/// `loaded`: valid, and the only one of its kind, namespace and name.
fn add(
    path: &Path,
    at: &str,
    json: Value,
    kind: &str,
    loaded: &mut Loaded,
) -> Result<(), LoadError> {
    let object = object_name(&json, kind);
    let here = format!("{}: {at}", path.display());
    if let Some(first) = loaded.sources.get(&object) {
        return Err(LoadError::Duplicate {
            object,
            first: first.clone(),
            second: here,
        });
    }
    let world = &mut loaded.world;
    match kind {
        "CapacityProfile" => world.profiles.push(parse(path, json, kind)?),
        "LaneContract" => world.lanes.push(parse(path, json, kind)?),
        "DegradationPolicy" => world.policies.push(parse(path, json, kind)?),
        other => {
            let message = format!("unknown lanekeeper kind {other:?}");
            return Err(invalid(path, &json, other, "kind", message));
        }
    }
    loaded.sources.insert(object, here);
    Ok(())
}

/// A signals timeline (`plan --signals`) or a scenario (`simulate
/// --scenario`): lanekeeper's own inputs, not manifests, so they are skipped
/// without a note.
fn is_offline_input(doc: &serde_yaml::Value) -> bool {
    serde_yaml::from_value::<SignalsFile>(doc.clone()).is_ok()
        || serde_yaml::from_value::<Scenario>(doc.clone()).is_ok()
}

fn object_name(json: &Value, kind: &str) -> String {
    let meta = json.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    format!("{kind} {ns}/{name}")
}

fn invalid(path: &Path, json: &Value, kind: &str, field: &str, message: String) -> LoadError {
    LoadError::Invalid {
        path: path.to_owned(),
        object: object_name(json, kind),
        field: field.to_owned(),
        message,
    }
}

/// The compiled CEL rules of each CRD (compiled once).
struct Schemas {
    validator: kube_cel::Validator,
    raw_profile: Value,
    raw_lane: Value,
    raw_policy: Value,
    profile: kube_cel::CompiledSchema,
    lane: kube_cel::CompiledSchema,
    policy: kube_cel::CompiledSchema,
}

fn openapi_schema<K: CustomResourceExt>() -> Value {
    let crd = K::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("CRD has a schema");
    serde_json::to_value(schema).expect("schema serializes")
}

fn schemas() -> &'static Schemas {
    static S: OnceLock<Schemas> = OnceLock::new();
    S.get_or_init(|| Schemas {
        validator: kube_cel::Validator::new(),
        raw_profile: openapi_schema::<CapacityProfile>(),
        raw_lane: openapi_schema::<LaneContract>(),
        raw_policy: openapi_schema::<DegradationPolicy>(),
        profile: kube_cel::compile_schema(&openapi_schema::<CapacityProfile>()),
        lane: kube_cel::compile_schema(&openapi_schema::<LaneContract>()),
        policy: kube_cel::compile_schema(&openapi_schema::<DegradationPolicy>()),
    })
}

/// Runs the CRD's CEL rules over `json` (as the API server would). Returns
/// `(field, message)` of every rule that fails.
pub fn cel_errors(kind: &str, json: &Value) -> Vec<(String, String)> {
    let s = schemas();
    let compiled = match kind {
        "CapacityProfile" => &s.profile,
        "LaneContract" => &s.lane,
        "DegradationPolicy" => &s.policy,
        _ => return Vec::new(),
    };
    match s.validator.validate_compiled(compiled, json, None) {
        Ok(()) => Vec::new(),
        Err(errs) => errs
            .into_vec()
            .into_iter()
            .map(|e| {
                let field = e.field_path.trim_start_matches('.').to_owned();
                (
                    if field.is_empty() {
                        "<root>".to_owned()
                    } else {
                        field
                    },
                    e.message,
                )
            })
            .collect(),
    }
}

fn parse<K: DeserializeOwned + kube::Resource>(
    path: &Path,
    mut json: Value,
    kind: &str,
) -> Result<K, LoadError> {
    // Objects without a namespace land in "default", as with kubectl.
    if let Some(meta) = json.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.entry("namespace")
            .or_insert_with(|| Value::String("default".into()));
        if !meta.get("name").is_some_and(Value::is_string) {
            return Err(invalid(
                path,
                &json,
                kind,
                "metadata.name",
                "is required".into(),
            ));
        }
    } else {
        return Err(invalid(path, &json, kind, "metadata", "is required".into()));
    }
    check::<K>(kind, &json)
        .and_then(|obj| names(kind, &json).map(|()| obj))
        .map_err(|(field, message)| invalid(path, &json, kind, &field, message))
}

/// The longest name the controller gives a profile's lanes ConfigMap:
/// `<profile>-lanes-observe` (`controller::lanes_configmap::configmap_name`).
const LANES_CONFIGMAP_SUFFIX: &str = "-lanes-observe";

/// The names `plan` turns into paths (`--emit-gateway-config`) and PromQL
/// label matchers, checked as the API server checks them: the namespace a
/// DNS label, the object's name a DNS subdomain (and, for a profile, the
/// name of its lanes ConfigMap too), the scale target's name a DNS
/// subdomain (a workload's name). The error is `(field path, message)`.
fn names(kind: &str, json: &Value) -> Result<(), (String, String)> {
    let at = |pointer: &str| json.pointer(pointer).and_then(Value::as_str);
    let bad = |field: &str, value: &str, why: String| {
        Err((field.to_owned(), format!("{value:?} is not valid: {why}")))
    };
    let ns = at("/metadata/namespace").unwrap_or("default");
    if let Some(why) = not_dns_label(ns) {
        return bad("metadata.namespace", ns, why);
    }
    let name = at("/metadata/name").unwrap_or_default();
    if let Some(why) = not_dns_subdomain(name) {
        return bad("metadata.name", name, why);
    }
    if kind != "CapacityProfile" {
        return Ok(());
    }
    let cm = format!("{name}{LANES_CONFIGMAP_SUFFIX}");
    if cm.len() > DNS_SUBDOMAIN_MAX {
        let why = format!(
            "its lanes ConfigMap {cm:?} would be longer than {DNS_SUBDOMAIN_MAX} characters (a profile's name may have at most {})",
            DNS_SUBDOMAIN_MAX - LANES_CONFIGMAP_SUFFIX.len()
        );
        return bad("metadata.name", name, why);
    }
    match at("/spec/pool/scaleTargetRef/name") {
        Some(target) => match not_dns_subdomain(target) {
            Some(why) => bad("spec.pool.scaleTargetRef.name", target, why),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

/// The longest DNS label (RFC 1123): a namespace.
const DNS_LABEL_MAX: usize = 63;
/// The longest DNS subdomain (RFC 1123): the name of most objects.
const DNS_SUBDOMAIN_MAX: usize = 253;

/// Why `s` is not an RFC 1123 DNS label (as Kubernetes requires of a
/// namespace), or None.
fn not_dns_label(s: &str) -> Option<String> {
    (s.len() > DNS_LABEL_MAX || !is_dns_label(s)).then(|| {
        format!(
            "a namespace is a lowercase RFC 1123 label of at most {DNS_LABEL_MAX} characters: a-z, 0-9 and '-', starting and ending with a letter or digit"
        )
    })
}

/// Why `s` is not an RFC 1123 DNS subdomain (as Kubernetes requires of an
/// object's name), or None.
fn not_dns_subdomain(s: &str) -> Option<String> {
    (s.len() > DNS_SUBDOMAIN_MAX || !s.split('.').all(is_dns_label)).then(|| {
        format!(
            "a name is a lowercase RFC 1123 subdomain of at most {DNS_SUBDOMAIN_MAX} characters: a-z, 0-9, '-' and '.', each part between dots starting and ending with a letter or digit"
        )
    })
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_dns_label(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && b.iter().all(|&c| alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// The fields of ObjectMeta a manifest may carry (the API server's strict
/// field validation knows these; the CRD schema leaves `metadata` open).
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// The first field of `json` that the CRD's schema of `kind` does not
/// declare, as the API server's strict field validation (kubectl's default)
/// finds it: `spec.flooorUnitsPerSecond`. None when every field is declared
/// (or the kind is not lanekeeper's).
pub fn unknown_field(kind: &str, json: &Value) -> Option<String> {
    let s = schemas();
    let schema = match kind {
        "CapacityProfile" => &s.raw_profile,
        "LaneContract" => &s.raw_lane,
        "DegradationPolicy" => &s.raw_policy,
        _ => return None,
    };
    let obj = json.as_object()?;
    for (k, v) in obj {
        let path = k.clone();
        if k == "metadata" {
            if let Some(m) = v.as_object()
                && let Some(bad) = m.keys().find(|f| !OBJECT_META_FIELDS.contains(&f.as_str()))
            {
                return Some(format!("metadata.{bad}"));
            }
            continue;
        }
        if k == "apiVersion" || k == "kind" {
            continue; // checked by the loader; the CRD schema leaves them out
        }
        match schema["properties"].get(k) {
            Some(sub) => {
                if let Some(bad) = undeclared(sub, v, &path) {
                    return Some(bad);
                }
            }
            None => return Some(path),
        }
    }
    None
}

/// Walks `value` against a structural schema: object properties,
/// additionalProperties and array items; a node marked
/// `x-kubernetes-preserve-unknown-fields` keeps whatever it holds.
fn undeclared(schema: &Value, value: &Value, path: &str) -> Option<String> {
    if schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) {
        return None;
    }
    match value {
        Value::Object(obj) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in obj {
                let sub = format!("{path}.{k}");
                match (props.and_then(|p| p.get(k)), additional) {
                    (Some(s), _) | (None, Some(s)) => {
                        if let Some(bad) = undeclared(s, v, &sub) {
                            return Some(bad);
                        }
                    }
                    (None, None) if props.is_some() => return Some(sub),
                    (None, None) => {}
                }
            }
            None
        }
        Value::Array(items) => {
            let item = schema.get("items")?;
            items
                .iter()
                .enumerate()
                .find_map(|(i, v)| undeclared(item, v, &format!("{path}[{i}]")))
        }
        _ => None,
    }
}

/// Reads an object as the API server and the controller would: every field
/// declared by the CRD (strict field validation, kubectl's default), its
/// shape (types, required fields, quantities) and then the CRD's CEL rules.
/// The error is `(field path, message)`.
pub fn check<K: DeserializeOwned>(kind: &str, json: &Value) -> Result<K, (String, String)> {
    if let Some(field) = unknown_field(kind, json) {
        return Err((
            field,
            "unknown field: the CRD does not declare it (the API server refuses it; check the spelling)"
                .into(),
        ));
    }
    let obj: K = serde_path_to_error::deserialize(json)
        .map_err(|e| (e.path().to_string(), e.inner().to_string()))?;
    if let Some(err) = cel_errors(kind, json).into_iter().next() {
        return Err(err);
    }
    Ok(obj)
}

/// The first problem of a lanekeeper object of `kind`, as `(field, message)`
/// (None when it is valid or of another kind).
pub fn explain(kind: &str, json: &Value) -> Option<(String, String)> {
    match kind {
        "CapacityProfile" => check::<CapacityProfile>(kind, json).err(),
        "LaneContract" => check::<LaneContract>(kind, json).err(),
        "DegradationPolicy" => check::<DegradationPolicy>(kind, json).err(),
        _ => None,
    }
}

impl fmt::Display for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} profiles, {} lanes, {} policies",
            self.world.profiles.len(),
            self.world.lanes.len(),
            self.world.policies.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_the_api_server_checks_them() {
        for ok in ["a", "ai-platform", "0", &"a".repeat(63)] {
            assert_eq!(not_dns_label(ok), None, "{ok}");
            assert_eq!(not_dns_subdomain(ok), None, "{ok}");
        }
        for ok in ["vllm.agent-assist", "a.b.c", &"a".repeat(253)] {
            assert_eq!(not_dns_subdomain(ok), None, "{ok}");
            assert!(not_dns_label(ok).is_some(), "{ok}");
        }
        for bad in [
            "",
            "../evil",
            "/abs",
            "Agent_Assist",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a\"}",
            "é",
        ] {
            assert!(not_dns_label(bad).is_some(), "{bad:?}");
            assert!(not_dns_subdomain(bad).is_some(), "{bad:?}");
        }
        assert!(not_dns_label(&"a".repeat(64)).is_some());
        assert!(not_dns_subdomain(&"a".repeat(254)).is_some());
    }

    #[test]
    fn the_configmap_suffix_is_the_controllers_longest() {
        use crate::controller::lanes_configmap::configmap_name;
        assert_eq!(
            configmap_name("p", true),
            format!("p{LANES_CONFIGMAP_SUFFIX}")
        );
        assert!(configmap_name("p", false).len() < configmap_name("p", true).len());
    }
}
