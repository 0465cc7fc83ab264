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

/// Every flag of `lanekeeper gateway --help` (and its environment
/// variable) has a row in docs/gateway.md's table of flags.
#[test]
fn every_gateway_flag_is_documented() {
    let help = crate::cli::lanekeeper_ok(["gateway", "--help"]);
    let docs = read("docs/gateway.md");
    let mut flags = 0;
    for line in help.lines().map(str::trim_start) {
        // A flag's own line: `--name <VALUE>` or `-s, --name`.
        let def = line.strip_prefix("-h, ").unwrap_or(line);
        if let Some(name) = def
            .strip_prefix("--")
            .and_then(|d| d.split([' ', '=']).next())
            && name != "help"
        {
            flags += 1;
            assert!(
                docs.contains(&format!("`--{name}")),
                "docs/gateway.md has no row for --{name}"
            );
        }
        if let Some(var) = line
            .strip_prefix("[env: ")
            .and_then(|v| v.split('=').next())
        {
            assert!(docs.contains(var), "docs/gateway.md does not name {var}");
        }
    }
    assert!(flags >= 30, "read {flags} flags from --help:\n{help}");
}
