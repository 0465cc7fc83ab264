//! The docs follow the code: every schema field is in docs/reference.md, and
//! the README gives the two commands.

use std::path::PathBuf;

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn field_paths(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
    if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
        for (k, child) in props {
            let p = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if matches!(p.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            out.push(p.clone());
            field_paths(&p, child, out);
        }
    }
    if let Some(items) = v.get("items") {
        field_paths(&format!("{prefix}[]"), items, out);
    }
}

#[test]
fn reference_documents_every_schema_field() {
    let reference = read("docs/reference.md");
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
        let mut paths = Vec::new();
        field_paths("", &schema, &mut paths);
        assert!(paths.len() > 10);
        for p in paths {
            if !reference.contains(&format!("`{p}`")) {
                missing.push(format!("{}: {p}", crd.spec.names.kind));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "fields missing from docs/reference.md (write them as `path`): {missing:#?}"
    );
}
