//! The pool's configuration hash: what `capacity.calibration.configHash`
//! holds, what `status.observedConfigHash` shows and what `lanekeeper
//! calibration-hash -f <workload.yaml>` prints. One function, so the three
//! always agree.
//!
//! The hash covers what decides how much one replica serves: per container
//! its image, command, args, environment and resources, and the pod's
//! `nodeSelector` (where the GPU type is chosen). Its **canonical form** is a
//! JSON document, written with no whitespace and every object's keys in
//! byte order:
//!
//! ```text
//! {"containers":[C...],"nodeSelector":{...}}
//! C = {"args":[...],"command":[...],"env":[E...],"envFrom":[...],"image":"...","name":"...",
//!      "resources":{"limits":{...},"requests":{...}}}
//! E = {"name":"...","value":"..."}  or  {"name":"...","valueFrom":{...}}
//! ```
//!
//! - `containers` are the pod template's `spec.containers` (not init or
//!   ephemeral containers), sorted by name, so their order does not matter;
//! - `env` and `envFrom` keep their written order (a later variable may refer
//!   to an earlier one, and a repeated name overrides);
//! - an `env` entry without a value has `value: ""` (as Kubernetes reads it);
//!   `valueFrom` and `envFrom` entries are kept as written, with
//!   `fieldRef.apiVersion` defaulted to `v1` as the API server stores it;
//! - resource quantities are written as exact decimal numbers, so `"0.5"`,
//!   `"500m"` and the API server's re-spelling of either hash alike
//!   (`1Gi` → `1073741824`); `resources.claims` is left out;
//! - a key whose value is absent, empty or null is left out, so `args: []`
//!   and no `args` hash alike;
//! - everything else in the template (labels, annotations, probes,
//!   affinity, tolerations, volumes, ...) is not part of it.
//!
//! The hash is `sha256:` followed by the SHA-256 of the canonical form in
//! lower-case hex.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::common::{parse_rfc3339, rfc3339};
use super::profile::{CalibrationSpec, StaleCalibrationMode};
use crate::snapshot::CalibrationStale;

/// Why a workload gives no hash. Never a wrong hash instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigHashError {
    /// The object has no `spec.template` (a kind whose pods come from
    /// somewhere else, such as a LeaderWorkerSet's two templates).
    #[error("{kind} has no pod template at spec.template")]
    NoTemplate {
        /// The object's kind.
        kind: String,
    },
    /// `spec.template.spec.containers` is missing or not a list of named
    /// containers.
    #[error("spec.template.spec.containers: {0}")]
    Containers(String),
}

/// What a profile's calibration says about the pool now: the `Calibrated`
/// condition, and the engine's `calibrationStale` signal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CalibrationCheck {
    /// No `capacity.calibration`, or nothing in it that can be checked (no
    /// `configHash` and no `measuredAt` with `validForSeconds`).
    #[default]
    NoCalibration,
    /// The measurement still describes the pool.
    Valid {
        /// The pod template hash matched `configHash` (false: no `configHash`
        /// given, so pool changes are not checked).
        hash_checked: bool,
        /// When the measurement expires (Unix seconds), if it does.
        until: Option<i64>,
    },
    /// The pod template changed since the measurement.
    PoolChanged {
        /// `capacity.calibration.configHash`.
        measured: String,
        /// The pod template's hash now.
        observed: String,
    },
    /// The measurement is past `measuredAt + validForSeconds`.
    Expired {
        /// When it expired (Unix seconds).
        at: i64,
    },
    /// A `configHash` is given but the pool has no hash to compare it with
    /// (a kind without a pod template, or the scale target can't be read);
    /// not expired.
    NotHashed {
        /// Why there is no hash.
        why: String,
    },
}

impl CalibrationCheck {
    /// Checks a calibration against the pool's hash (`None`: the scale
    /// target could not be read) at `now`. A changed pool outranks an
    /// expired measurement: both mean "measure again", and the change says
    /// more about what.
    pub fn new(
        calibration: Option<&CalibrationSpec>,
        observed: Option<&Result<String, ConfigHashError>>,
        now: i64,
    ) -> Self {
        let Some(cal) = calibration else {
            return CalibrationCheck::NoCalibration;
        };
        let until = cal
            .measured_at
            .as_deref()
            .and_then(parse_rfc3339)
            .zip(cal.valid_for_seconds)
            .map(|(at, valid)| at.saturating_add(valid));
        let measured = cal
            .config_hash
            .as_deref()
            .map(str::trim)
            .filter(|h| !h.is_empty());
        if let (Some(m), Some(Ok(o))) = (measured, observed)
            && m != o
        {
            return CalibrationCheck::PoolChanged {
                measured: m.to_owned(),
                observed: o.clone(),
            };
        }
        if let Some(at) = until.filter(|u| now > *u) {
            return CalibrationCheck::Expired { at };
        }
        match (measured, observed) {
            (None, _) if until.is_none() => CalibrationCheck::NoCalibration,
            (None, _) => CalibrationCheck::Valid {
                hash_checked: false,
                until,
            },
            (Some(_), Some(Ok(_))) => CalibrationCheck::Valid {
                hash_checked: true,
                until,
            },
            (Some(_), Some(Err(e))) => CalibrationCheck::NotHashed { why: e.to_string() },
            (Some(_), None) => CalibrationCheck::NotHashed {
                why: "the scale target could not be read".into(),
            },
        }
    }

    /// The engine's signal: why the calibration is stale, if it is.
    pub fn stale(&self) -> Option<CalibrationStale> {
        match self {
            CalibrationCheck::PoolChanged { .. } => Some(CalibrationStale::PoolChanged),
            CalibrationCheck::Expired { .. } => Some(CalibrationStale::Expired),
            _ => None,
        }
    }

    /// The `Calibrated` condition: status, reason and message.
    pub fn condition(&self, mode: StaleCalibrationMode) -> (&'static str, &'static str, String) {
        let hold = match mode {
            StaleCalibrationMode::Hold => {
                " onStaleCalibration is Hold: capacity from readyReplicas or ready pods × unitsPerReplica, and safeUnitsPerSecond, is Unknown until then."
            }
            StaleCalibrationMode::Warn => "",
        };
        match self {
            CalibrationCheck::NoCalibration => (
                "Unknown",
                "NoCalibration",
                "no capacity.calibration configHash, or measuredAt with validForSeconds, to check"
                    .into(),
            ),
            CalibrationCheck::Valid {
                hash_checked,
                until,
            } => {
                let hash = if *hash_checked {
                    "the pod template matches configHash"
                } else {
                    "no configHash given (pool changes are not checked)"
                };
                let until = until.map_or_else(
                    || "; no expiry given".to_owned(),
                    |u| format!("; valid until {}", rfc3339(u)),
                );
                ("True", "Valid", format!("{hash}{until}"))
            }
            CalibrationCheck::PoolChanged { measured, observed } => (
                "False",
                "PoolChanged",
                format!(
                    "the pool's pod template hashes to {observed} (status.observedConfigHash), not {measured} (capacity.calibration.configHash): measure safeUnitsPerSecond and unitsPerReplica again with a step-load test of the new configuration, then set configHash to {observed} and measuredAt.{hold}"
                ),
            ),
            CalibrationCheck::Expired { at } => (
                "False",
                "Expired",
                format!(
                    "the capacity measurement expired at {} (measuredAt + validForSeconds): measure safeUnitsPerSecond and unitsPerReplica again with a step-load test, then update measuredAt.{hold}",
                    rfc3339(*at)
                ),
            ),
            CalibrationCheck::NotHashed { why } => (
                "Unknown",
                "PoolNotHashed",
                format!("configHash cannot be checked: {why}"),
            ),
        }
    }
}

/// The canonical form of a workload's pod template (`spec.template`).
pub fn canonical_workload(workload: &Value) -> Result<String, ConfigHashError> {
    let template = workload.pointer("/spec/template").filter(|t| t.is_object());
    let Some(template) = template else {
        let kind = workload
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("the object")
            .to_owned();
        return Err(ConfigHashError::NoTemplate { kind });
    };
    canonical_template(template)
}

/// The hash of a workload's pod template (`spec.template`).
pub fn workload_config_hash(workload: &Value) -> Result<String, ConfigHashError> {
    canonical_workload(workload).map(|c| hash(&c))
}

/// A workload found in a manifest: `Kind/name`, and its canonical form or
/// why it has none.
pub type Workload = (String, Result<String, ConfigHashError>);

/// The workloads of a multi-document YAML stream (a `kind: List`'s items
/// included), each as `Kind/name` with its canonical form or why it has
/// none. Documents that are not objects (empty ones) are skipped.
pub fn workloads_in_yaml(text: &str) -> Result<Vec<Workload>, serde_yaml::Error> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(doc)?;
        let items = match v.get("items").and_then(Value::as_array) {
            Some(items) if v.get("kind").and_then(Value::as_str) == Some("List") => items.clone(),
            _ => vec![v],
        };
        for item in items.into_iter().filter(Value::is_object) {
            let kind = item.get("kind").and_then(Value::as_str).unwrap_or("?");
            let name = item
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("?");
            out.push((format!("{kind}/{name}"), canonical_workload(&item)));
        }
    }
    Ok(out)
}

/// The hash of a canonical form.
pub fn hash(canonical: &str) -> String {
    let digest = Sha256::digest(canonical.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The canonical form of a pod template (`{metadata, spec}`).
pub fn canonical_template(template: &Value) -> Result<String, ConfigHashError> {
    let spec = template.get("spec");
    let containers = spec
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array)
        .ok_or_else(|| ConfigHashError::Containers("missing or not a list".into()))?;
    if containers.is_empty() {
        return Err(ConfigHashError::Containers("empty".into()));
    }
    let mut out: Vec<(String, Value)> = Vec::with_capacity(containers.len());
    for (i, c) in containers.iter().enumerate() {
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ConfigHashError::Containers(format!("[{i}] has no name")))?;
        out.push((name.to_owned(), container(c)));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let mut doc = Map::new();
    doc.insert(
        "containers".into(),
        Value::Array(out.into_iter().map(|(_, c)| c).collect()),
    );
    if let Some(ns) = spec.and_then(|s| s.get("nodeSelector")) {
        put(&mut doc, "nodeSelector", ns.clone());
    }
    let mut text = String::new();
    write_canonical(&Value::Object(doc), &mut text);
    Ok(text)
}

/// Inserts a value unless it is null, an empty list or an empty object.
fn put(m: &mut Map<String, Value>, k: &str, v: Value) {
    let empty = match &v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    if !empty {
        m.insert(k.to_owned(), v);
    }
}

fn container(c: &Value) -> Value {
    let mut m = Map::new();
    for k in ["name", "image", "command", "args", "envFrom"] {
        if let Some(v) = c.get(k) {
            put(&mut m, k, v.clone());
        }
    }
    if let Some(env) = c.get("env").and_then(Value::as_array) {
        let env: Vec<Value> = env.iter().map(env_var).collect();
        put(&mut m, "env", Value::Array(env));
    }
    if let Some(r) = c.get("resources") {
        let mut res = Map::new();
        for k in ["limits", "requests"] {
            if let Some(q) = r.get(k).and_then(Value::as_object) {
                let q: Map<String, Value> = q
                    .iter()
                    .map(|(name, v)| (name.clone(), Value::String(quantity(v))))
                    .collect();
                put(&mut res, k, Value::Object(q));
            }
        }
        put(&mut m, "resources", Value::Object(res));
    }
    Value::Object(m)
}

fn env_var(e: &Value) -> Value {
    let mut m = Map::new();
    m.insert(
        "name".into(),
        e.get("name")
            .cloned()
            .unwrap_or(Value::String(String::new())),
    );
    match e.get("valueFrom").filter(|v| !v.is_null()) {
        Some(from) => {
            let mut from = from.clone();
            if let Some(f) = from.get_mut("fieldRef").and_then(Value::as_object_mut) {
                f.entry("apiVersion")
                    .or_insert_with(|| Value::String("v1".into()));
            }
            m.insert("valueFrom".into(), from);
        }
        None => {
            m.insert(
                "value".into(),
                e.get("value")
                    .filter(|v| !v.is_null())
                    .cloned()
                    .unwrap_or(Value::String(String::new())),
            );
        }
    }
    Value::Object(m)
}

/// A quantity as an exact decimal number (`500m` → `0.5`, `1Gi` →
/// `1073741824`). Kept as written (trimmed) when it is not a quantity or too
/// large to write exactly.
pub fn quantity(v: &Value) -> String {
    let raw = match v {
        Value::String(s) => s.trim().to_owned(),
        other => other.to_string(),
    };
    parse_quantity(&raw).unwrap_or(raw)
}

fn parse_quantity(s: &str) -> Option<String> {
    let (negative, s) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mut mantissa: u128 = digits.parse().ok()?;
    let mut exp10: i64 = -(frac.len() as i64);
    let binary = |k: u32| 1024u128.checked_pow(k);
    let mut times: u128 = 1;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => times = binary(1)?,
        "Mi" => times = binary(2)?,
        "Gi" => times = binary(3)?,
        "Ti" => times = binary(4)?,
        "Pi" => times = binary(5)?,
        "Ei" => times = binary(6)?,
        other => {
            let e = other.strip_prefix(['e', 'E'])?;
            let digits_only = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits_only.is_empty() || !digits_only.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            exp10 += e.parse::<i64>().ok()?;
        }
    }
    mantissa = mantissa.checked_mul(times)?;
    if mantissa == 0 {
        return Some("0".into());
    }
    while mantissa.is_multiple_of(10) {
        mantissa /= 10;
        exp10 += 1;
    }
    if exp10.abs() > 60 {
        return None;
    }
    let m = mantissa.to_string();
    let text = if exp10 >= 0 {
        format!("{m}{}", "0".repeat(exp10 as usize))
    } else {
        let point = m.len() as i64 + exp10;
        if point > 0 {
            format!("{}.{}", &m[..point as usize], &m[point as usize..])
        } else {
            format!("0.{}{m}", "0".repeat((-point) as usize))
        }
    };
    Some(if negative { format!("-{text}") } else { text })
}

/// JSON with object keys in byte order and no whitespace, whatever order
/// the map keeps.
fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(containers: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "vllm"},
            "spec": {"template": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {"containers": containers, "nodeSelector": {"nvidia.com/gpu.product": "H100"}}
            }}
        })
    }

    fn vllm() -> Value {
        json!({
            "name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
            "args": ["--model", "llama-3.1-8b", "--max-num-seqs", "256"],
            "env": [{"name": "HF_HOME", "value": "/cache"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "64Gi"},
                          "requests": {"cpu": "0.5", "nvidia.com/gpu": 1}},
            "ports": [{"containerPort": 8000}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}}
        })
    }

    fn sidecar() -> Value {
        json!({"name": "metrics", "image": "exporter:1", "imagePullPolicy": "IfNotPresent"})
    }

    fn h(v: &Value) -> String {
        workload_config_hash(v).unwrap()
    }

    #[test]
    fn the_canonical_form_is_exactly_as_documented() {
        let c = canonical_workload(&deployment(json!([vllm(), sidecar()]))).unwrap();
        assert_eq!(
            c,
            concat!(
                r#"{"containers":["#,
                r#"{"image":"exporter:1","name":"metrics"},"#,
                r#"{"args":["--model","llama-3.1-8b","--max-num-seqs","256"],"#,
                r#""env":[{"name":"HF_HOME","value":"/cache"},"#,
                r#"{"name":"POD_IP","valueFrom":{"fieldRef":{"apiVersion":"v1","fieldPath":"status.podIP"}}}],"#,
                r#""image":"vllm/vllm-openai:v0.11.0","name":"vllm","#,
                r#""resources":{"limits":{"memory":"68719476736","nvidia.com/gpu":"1"},"#,
                r#""requests":{"cpu":"0.5","nvidia.com/gpu":"1"}}}],"#,
                r#""nodeSelector":{"nvidia.com/gpu.product":"H100"}}"#
            )
        );
        assert_eq!(h(&deployment(json!([vllm(), sidecar()]))), hash(&c));
        assert!(hash(&c).starts_with("sha256:") && hash(&c).len() == 7 + 64);
    }

    #[test]
    fn container_and_key_order_do_not_matter() {
        let a = deployment(json!([vllm(), sidecar()]));
        let b = deployment(json!([sidecar(), vllm()]));
        assert_eq!(h(&a), h(&b));
        // The same container written with its keys in another order, and
        // with what the hash leaves out changed.
        let mut c = vllm();
        let obj = c.as_object_mut().unwrap();
        let reversed: Map<String, Value> = obj
            .iter()
            .rev()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        *obj = reversed;
        obj.insert(
            "readinessProbe".into(),
            json!({"tcpSocket": {"port": 8000}}),
        );
        let mut d = deployment(json!([sidecar(), c]));
        d["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/restartedAt": "now"});
        d["spec"]["template"]["metadata"]["labels"]["extra"] = json!("x");
        assert_eq!(h(&a), h(&d));
    }

    #[test]
    fn what_the_api_server_fills_in_or_respells_hashes_alike() {
        let written = deployment(json!([vllm()]));
        let mut stored = written.clone();
        let c = &mut stored["spec"]["template"]["spec"]["containers"][0];
        c["resources"]["requests"]["cpu"] = json!("500m");
        c["resources"]["limits"]["memory"] = json!("65536Mi");
        c["env"][1]["valueFrom"]["fieldRef"]["apiVersion"] = json!("v1");
        c["imagePullPolicy"] = json!("IfNotPresent");
        c["terminationMessagePath"] = json!("/dev/termination-log");
        c["command"] = json!([]);
        stored["spec"]["template"]["spec"]["dnsPolicy"] = json!("ClusterFirst");
        assert_eq!(h(&written), h(&stored));
    }

    #[test]
    fn a_change_of_image_args_env_or_resources_changes_the_hash() {
        let base = h(&deployment(json!([vllm()])));
        let changed = |f: &dyn Fn(&mut Value)| {
            let mut c = vllm();
            f(&mut c);
            h(&deployment(json!([c])))
        };
        let variants = [
            changed(&|c| c["image"] = json!("vllm/vllm-openai:v0.12.0")),
            changed(&|c| c["args"][3] = json!("512")),
            changed(&|c| c["command"] = json!(["python3", "-m", "vllm"])),
            changed(&|c| c["env"][0]["value"] = json!("/other")),
            changed(&|c| {
                c["env"][1]["valueFrom"]["fieldRef"]["fieldPath"] = json!("status.hostIP")
            }),
            changed(&|c| {
                c["env"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "VLLM_FLAG", "value": "1"}))
            }),
            changed(&|c| c["env"].as_array_mut().unwrap().reverse()),
            changed(&|c| c["envFrom"] = json!([{"configMapRef": {"name": "tuning"}}])),
            changed(&|c| c["resources"]["limits"]["nvidia.com/gpu"] = json!("2")),
            changed(&|c| c["resources"]["requests"]["cpu"] = json!("1")),
            changed(&|c| c["name"] = json!("server")),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(v, &base, "variant {i} changes the hash");
        }
        let mut other_gpu = deployment(json!([vllm()]));
        other_gpu["spec"]["template"]["spec"]["nodeSelector"] =
            json!({"nvidia.com/gpu.product": "A100"});
        assert_ne!(h(&other_gpu), base);
        let mut two = deployment(json!([vllm(), sidecar()]));
        assert_ne!(h(&two), base);
        two["spec"]["template"]["spec"]["containers"][1]["image"] = json!("exporter:2");
        assert_ne!(h(&two), h(&deployment(json!([vllm(), sidecar()]))));
    }

    #[test]
    fn empty_absent_and_null_hash_alike() {
        let mut a = vllm();
        a["args"] = json!(null);
        let mut b = vllm();
        b.as_object_mut().unwrap().remove("args");
        let mut c = vllm();
        c["args"] = json!([]);
        assert_eq!(
            h(&deployment(json!([a]))),
            h(&deployment(json!([b.clone()])))
        );
        assert_eq!(h(&deployment(json!([c]))), h(&deployment(json!([b]))));
        let no_value = json!({"name": "X"});
        let empty_value = json!({"name": "X", "value": ""});
        assert_eq!(env_var(&no_value), env_var(&empty_value));
    }

    #[test]
    fn a_kind_without_a_template_gives_no_hash() {
        let lws = json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "spec": {"leaderWorkerTemplate": {"workerTemplate": {"spec": {"containers": [vllm()]}}}}});
        assert_eq!(
            workload_config_hash(&lws),
            Err(ConfigHashError::NoTemplate {
                kind: "LeaderWorkerSet".into()
            })
        );
        let no_containers = json!({"kind": "Deployment", "spec": {"template": {"spec": {}}}});
        assert!(matches!(
            workload_config_hash(&no_containers),
            Err(ConfigHashError::Containers(_))
        ));
        let unnamed = deployment(json!([{"image": "x"}]));
        assert!(matches!(
            workload_config_hash(&unnamed),
            Err(ConfigHashError::Containers(_))
        ));
    }

    fn cal(hash: Option<&str>, measured_at: Option<&str>, valid: Option<i64>) -> CalibrationSpec {
        CalibrationSpec {
            config_hash: hash.map(str::to_owned),
            measured_at: measured_at.map(str::to_owned),
            valid_for_seconds: valid,
        }
    }

    #[test]
    fn a_calibration_is_checked_against_the_pool_and_the_clock() {
        let at = parse_rfc3339("2026-07-21T00:00:00Z").unwrap();
        let ok: Result<String, ConfigHashError> = Ok("sha256:aa".into());
        let full = cal(Some("sha256:aa"), Some("2026-07-21T00:00:00Z"), Some(100));
        let check = |c: Option<&CalibrationSpec>, o, now| CalibrationCheck::new(c, o, now);
        assert_eq!(check(None, Some(&ok), at), CalibrationCheck::NoCalibration);
        assert_eq!(
            check(Some(&cal(None, None, None)), Some(&ok), at),
            CalibrationCheck::NoCalibration
        );
        // The edge of validity: at measuredAt + validForSeconds still valid.
        assert_eq!(
            check(Some(&full), Some(&ok), at + 100),
            CalibrationCheck::Valid {
                hash_checked: true,
                until: Some(at + 100)
            }
        );
        assert_eq!(
            check(Some(&full), Some(&ok), at + 101),
            CalibrationCheck::Expired { at: at + 100 }
        );
        // A changed pool outranks expiry.
        let other: Result<String, ConfigHashError> = Ok("sha256:bb".into());
        let changed = CalibrationCheck::PoolChanged {
            measured: "sha256:aa".into(),
            observed: "sha256:bb".into(),
        };
        assert_eq!(check(Some(&full), Some(&other), at), changed);
        assert_eq!(check(Some(&full), Some(&other), at + 101), changed);
        assert_eq!(changed.stale(), Some(CalibrationStale::PoolChanged));
        assert_eq!(
            CalibrationCheck::Expired { at }.stale(),
            Some(CalibrationStale::Expired)
        );
        // No hash to compare with: never a wrong verdict.
        let none: Result<String, ConfigHashError> = Err(ConfigHashError::NoTemplate {
            kind: "LeaderWorkerSet".into(),
        });
        let nh = check(Some(&full), Some(&none), at);
        assert!(matches!(nh, CalibrationCheck::NotHashed { .. }), "{nh:?}");
        assert_eq!(nh.stale(), None);
        assert_eq!(nh.condition(StaleCalibrationMode::Hold).1, "PoolNotHashed");
        assert!(matches!(
            check(Some(&full), None, at),
            CalibrationCheck::NotHashed { .. }
        ));
        // Expiry alone, without a configHash.
        let dated = cal(None, Some("2026-07-21T00:00:00Z"), Some(100));
        assert_eq!(
            check(Some(&dated), Some(&none), at),
            CalibrationCheck::Valid {
                hash_checked: false,
                until: Some(at + 100)
            }
        );
        // The condition says what to re-measure, and what Hold does.
        let (status, reason, msg) = changed.condition(StaleCalibrationMode::Hold);
        assert_eq!((status, reason), ("False", "PoolChanged"));
        assert!(msg.contains("set configHash to sha256:bb"), "{msg}");
        assert!(msg.contains("Hold"), "{msg}");
        assert!(
            !changed
                .condition(StaleCalibrationMode::Warn)
                .2
                .contains("Hold")
        );
        assert_eq!(
            CalibrationCheck::NoCalibration
                .condition(StaleCalibrationMode::Warn)
                .1,
            "NoCalibration"
        );
    }

    #[test]
    fn quantities_are_exact_numbers() {
        for (q, want) in [
            ("1", "1"),
            ("0.5", "0.5"),
            ("500m", "0.5"),
            ("1500m", "1.5"),
            ("1Gi", "1073741824"),
            ("1024Mi", "1073741824"),
            ("64Gi", "68719476736"),
            ("1k", "1000"),
            ("1e3", "1000"),
            ("1E3", "1000"),
            ("1E", "1000000000000000000"),
            ("100n", "0.0000001"),
            ("0", "0"),
            ("0m", "0"),
            ("-2", "-2"),
            (".5", "0.5"),
            ("2.50", "2.5"),
        ] {
            assert_eq!(quantity(&json!(q)), want, "{q}");
        }
        assert_eq!(quantity(&json!(2)), "2");
        assert_eq!(quantity(&json!("lots")), "lots");
        assert_eq!(quantity(&json!("1Qi")), "1Qi");
    }
}
