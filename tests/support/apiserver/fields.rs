//! Field paths, merge patches and the server-side-apply field ownership model.
//!
//! A path is a list of elements in the `fieldsV1` spelling: `f:name` for an
//! object member, `k:{"type":"Ready"}` for an element of a list merged by key.

use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

pub type Path = Vec<String>;
pub type FieldSet = BTreeSet<Path>;

/// Lists that are merged by a key (strategic merge patch and apply); all other lists are atomic.
pub fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

/// Metadata members the server owns; they are never tracked as managed fields.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
];

/// The value with the members that are not tracked removed.
pub fn trackable(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in SERVER_METADATA {
                meta.remove(*k);
            }
        }
        if m.get("metadata")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            m.remove("metadata");
        }
    }
    v
}

fn key_elem(key: &str, val: &Value) -> String {
    let mut m = Map::new();
    m.insert(key.to_string(), val.clone());
    format!("k:{}", Value::Object(m))
}

/// Leaf paths of a value with the value at each leaf.
pub fn leaves(v: &Value) -> BTreeMap<Path, Value> {
    let mut out = BTreeMap::new();
    let mut prefix = Vec::new();
    walk(v, None, &mut prefix, &mut out);
    out
}

fn walk(v: &Value, field: Option<&str>, prefix: &mut Path, out: &mut BTreeMap<Path, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() || prefix.is_empty() => {
            for (k, child) in m {
                prefix.push(format!("f:{k}"));
                walk(child, Some(k), prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            let key = field.and_then(merge_key);
            match key {
                Some(key) if !items.is_empty() && items.iter().all(|i| i.get(key).is_some()) => {
                    for item in items {
                        prefix.push(key_elem(key, &item[key]));
                        if let Some(m) = item.as_object() {
                            for (k, child) in m {
                                prefix.push(format!("f:{k}"));
                                walk(child, Some(k), prefix, out);
                                prefix.pop();
                            }
                        }
                        prefix.pop();
                    }
                }
                _ => {
                    out.insert(prefix.clone(), v.clone());
                }
            }
        }
        _ => {
            out.insert(prefix.clone(), v.clone());
        }
    }
}

fn parse_key(elem: &str) -> Option<(String, Value)> {
    let json = elem.strip_prefix("k:")?;
    let m: Map<String, Value> = serde_json::from_str(json).ok()?;
    m.into_iter().next()
}

pub fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for elem in path {
        if let Some(f) = elem.strip_prefix("f:") {
            cur = cur.as_object()?.get(f)?;
        } else {
            let (k, kv) = parse_key(elem)?;
            cur = cur.as_array()?.iter().find(|i| i.get(&k) == Some(&kv))?;
        }
    }
    Some(cur)
}

fn get_path_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = v;
    for elem in path {
        if let Some(f) = elem.strip_prefix("f:") {
            cur = cur.as_object_mut()?.get_mut(f)?;
        } else {
            let (k, kv) = parse_key(elem)?;
            cur = cur
                .as_array_mut()?
                .iter_mut()
                .find(|i| i.get(&k) == Some(&kv))?;
        }
    }
    Some(cur)
}

fn is_empty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Removes the value at `path`, then prunes containers left empty (never a top-level member).
pub fn remove_path(v: &mut Value, path: &[String]) {
    if path.is_empty() {
        return;
    }
    let (last, parent_path) = path.split_last().expect("non-empty");
    let Some(parent) = get_path_mut(v, parent_path) else {
        return;
    };
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = parent.as_object_mut() {
            m.remove(f);
        }
    } else if let Some((k, kv)) = parse_key(last)
        && let Some(a) = parent.as_array_mut()
    {
        a.retain(|i| i.get(&k) != Some(&kv));
    }
    if parent_path.len() >= 2 && get_path(v, parent_path).is_some_and(is_empty_container) {
        remove_path(v, parent_path);
    }
}

/// Sets the value at a path of `f:` elements, creating objects on the way.
pub fn set_path(v: &mut Value, path: &[&str], value: Value) {
    let mut cur = v;
    for (i, f) in path.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let m = cur.as_object_mut().expect("object");
        if i + 1 == path.len() {
            m.insert(f.to_string(), value);
            return;
        }
        cur = m
            .entry(f.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

pub fn get_dotted<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    let mut cur = v;
    for f in dotted
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
    {
        cur = cur.as_object()?.get(f)?;
    }
    Some(cur)
}

pub fn dotted_to_path(dotted: &str) -> Vec<&str> {
    dotted
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect()
}

/// JSON merge patch (RFC 7386).
pub fn merge_patch(doc: &mut Value, patch: &Value) {
    match patch {
        Value::Object(pm) => {
            if !doc.is_object() {
                *doc = Value::Object(Map::new());
            }
            let dm = doc.as_object_mut().expect("object");
            for (k, pv) in pm {
                if pv.is_null() {
                    dm.remove(k);
                } else {
                    merge_patch(dm.entry(k.clone()).or_insert(Value::Null), pv);
                }
            }
        }
        _ => *doc = patch.clone(),
    }
}

/// Strategic merge patch, reduced: a merge patch whose lists with a known merge key are merged
/// by key (`$patch: delete` removes an element); `$`-directives are otherwise dropped.
pub fn strategic_patch(doc: &mut Value, patch: &Value, field: Option<&str>) {
    match patch {
        Value::Object(pm) => {
            if !doc.is_object() {
                *doc = Value::Object(Map::new());
            }
            let dm = doc.as_object_mut().expect("object");
            for (k, pv) in pm {
                if k.starts_with('$') {
                    continue;
                }
                if pv.is_null() {
                    dm.remove(k);
                } else {
                    strategic_patch(dm.entry(k.clone()).or_insert(Value::Null), pv, Some(k));
                }
            }
        }
        Value::Array(items) => match field.and_then(merge_key) {
            Some(key) if doc.is_array() && items.iter().all(|i| i.get(key).is_some()) => {
                let da = doc.as_array_mut().expect("array");
                for item in items {
                    let kv = &item[key];
                    let pos = da.iter().position(|d| d.get(key) == Some(kv));
                    let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                    match (pos, delete) {
                        (Some(p), true) => {
                            da.remove(p);
                        }
                        (None, true) => {}
                        (Some(p), false) => strategic_patch(&mut da[p], item, None),
                        (None, false) => {
                            let mut fresh = Value::Null;
                            strategic_patch(&mut fresh, item, None);
                            da.push(fresh);
                        }
                    }
                }
            }
            _ => *doc = strip_directives(patch),
        },
        _ => *doc = patch.clone(),
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// Merges an applied configuration into the live object (objects recursively, keyed lists by key,
/// everything else replaced). A null removes the member.
pub fn apply_merge(live: &mut Value, applied: &Value, field: Option<&str>) {
    match applied {
        Value::Object(am) => {
            if !live.is_object() {
                *live = Value::Object(Map::new());
            }
            let lm = live.as_object_mut().expect("object");
            for (k, av) in am {
                if av.is_null() {
                    lm.remove(k);
                } else {
                    apply_merge(lm.entry(k.clone()).or_insert(Value::Null), av, Some(k));
                }
            }
        }
        Value::Array(items) => match field.and_then(merge_key) {
            Some(key) if live.is_array() && items.iter().all(|i| i.get(key).is_some()) => {
                let la = live.as_array_mut().expect("array");
                for item in items {
                    match la.iter().position(|d| d.get(key) == item.get(key)) {
                        Some(p) => apply_merge(&mut la[p], item, None),
                        None => la.push(item.clone()),
                    }
                }
            }
            _ => *live = applied.clone(),
        },
        _ => *live = applied.clone(),
    }
}

/// True when `a` is a prefix of `b` or the other way round.
pub fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// Renders a field set in the `fieldsV1` shape.
pub fn fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for elem in path {
            let next = cur
                .entry(elem.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            cur = next.as_object_mut().expect("object");
        }
    }
    Value::Object(root)
}

/// Renders a path as `.spec.replicas` / `.status.conditions[type="Ready"].status`.
pub fn path_string(path: &[String]) -> String {
    let mut s = String::new();
    for elem in path {
        if let Some(f) = elem.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some((k, v)) = parse_key(elem) {
            s.push_str(&format!("[{k}={v}]"));
        }
    }
    s
}
