//! The Helm chart's files that must stay in step with the code: its `crds/`
//! are byte-for-byte the top-level `crds/` (which a test keeps equal to what
//! `lanekeeper crdgen` generates), and `manifests/install.yaml` carries them.
//! Rendering, linting and validating the chart is `.ci/chart-check.py`.
//! Re-sync with: `python3 .ci/chart-check.py --write`.

use std::collections::BTreeMap;
use std::path::Path;

fn yaml_files(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn chart_crds_equal_top_level_crds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let top = yaml_files(&root.join("crds"));
    let chart = yaml_files(&root.join("charts/lanekeeper/crds"));
    assert_eq!(
        top.keys().collect::<Vec<_>>(),
        chart.keys().collect::<Vec<_>>(),
        "charts/lanekeeper/crds/ holds other files than crds/; run `python3 .ci/chart-check.py --write`"
    );
    for (name, text) in &top {
        assert!(
            chart[name] == *text,
            "charts/lanekeeper/crds/{name} differs from crds/{name}; run `python3 .ci/chart-check.py --write`"
        );
    }
}

#[test]
fn install_manifest_carries_the_crds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let install = std::fs::read_to_string(root.join("manifests/install.yaml")).unwrap();
    for (name, text) in yaml_files(&root.join("crds")) {
        let body = text.trim_start_matches("---\n");
        assert!(
            install.contains(body),
            "manifests/install.yaml does not carry the current crds/{name}; run `python3 .ci/chart-check.py --write`"
        );
    }
}

#[test]
fn example_manifests_carry_the_inc47_objects() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("examples/inc-47/inc-47.yaml")).unwrap();
    let shipped = std::fs::read_to_string(root.join("manifests/examples/inc-47.yaml")).unwrap();
    assert!(
        shipped.contains(example.trim_start_matches("---\n")),
        "manifests/examples/inc-47.yaml differs from examples/inc-47/inc-47.yaml: copy the objects over"
    );
}

/// The example's calibration describes the Deployment shipped beside it: a
/// first install is `Calibrated=True` until the measurement's 90 days pass.
#[test]
fn the_example_calibration_hashes_the_shipped_deployment() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let hash = crate::cli::lanekeeper_ok([
        "calibration-hash",
        "-f",
        "manifests/examples/vllm-agent-assist.yaml",
    ]);
    let hash = hash.trim();
    assert!(hash.starts_with("sha256:") && hash.len() == 71, "{hash}");
    let example = std::fs::read_to_string(root.join("examples/inc-47/inc-47.yaml")).unwrap();
    assert!(
        example.contains(&format!("configHash: \"{hash}\"")),
        "examples/inc-47/inc-47.yaml: set capacity.calibration.configHash to {hash} (and measuredAt to the day of the load test)"
    );
}
