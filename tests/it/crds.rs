//! The committed CRDs in `crds/` are exactly what the code generates.
//! Regenerate with: `cargo run -q -- crdgen --out-dir crds`.

use std::path::Path;

#[test]
fn committed_crds_match_generated() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let mut expected: Vec<String> = Vec::new();
    for (name, yaml) in lanekeeper::api::crd_files() {
        let path = dir.join(&name);
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; regenerate with `cargo run -q -- crdgen --out-dir crds`",
                path.display()
            )
        });
        assert!(
            committed == yaml,
            "crds/{name} is out of date; regenerate with `cargo run -q -- crdgen --out-dir crds`"
        );
        expected.push(name);
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    expected.sort();
    assert_eq!(
        present, expected,
        "crds/ holds files the code does not generate"
    );
}

#[test]
fn crds_have_the_promised_shape() {
    for crd in lanekeeper::api::crds() {
        let spec = &crd.spec;
        assert_eq!(spec.group, "lanekeeper.dev");
        assert_eq!(spec.scope, "Namespaced");
        assert_eq!(
            spec.names.categories.as_deref(),
            Some(&["lanekeeper".to_owned()][..])
        );
        let short = spec.names.short_names.clone().unwrap_or_default();
        let want = match spec.names.kind.as_str() {
            "CapacityProfile" => "capprof",
            "LaneContract" => "lane",
            "DegradationPolicy" => "degpol",
            "LaneFreeze" => "freeze",
            k => panic!("unexpected kind {k}"),
        };
        assert_eq!(short, vec![want.to_owned()]);
        let v = &spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        // A LaneFreeze is all spec, written by the controller: no status.
        let status = v
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some();
        assert_eq!(
            status,
            spec.names.kind != "LaneFreeze",
            "status subresource of {}",
            spec.names.kind
        );
        assert!(
            v.additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 4),
            "printer columns"
        );
    }
}

/// Every property in every schema has a description (so `kubectl explain`
/// is useful).
#[test]
fn every_schema_field_has_a_description() {
    fn walk(path: &str, v: &serde_json::Value, missing: &mut Vec<String>) {
        if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
            for (k, child) in props {
                let p = format!("{path}.{k}");
                let skip = p == ".apiVersion" || p == ".kind" || p == ".metadata";
                if !skip
                    && child
                        .get("description")
                        .and_then(|d| d.as_str())
                        .is_none_or(str::is_empty)
                {
                    missing.push(p.clone());
                }
                walk(&p, child, missing);
            }
        }
        if let Some(items) = v.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    let mut missing = Vec::new();
    for crd in lanekeeper::api::crds() {
        let schema = serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap();
        walk(&crd.spec.names.kind, &schema, &mut missing);
    }
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:#?}"
    );
}
