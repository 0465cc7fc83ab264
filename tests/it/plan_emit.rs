//! `lanekeeper plan --emit-gateway-config DIR`: each profile's `lanes.json`
//! as the controller would publish it at the last step (byte identity with
//! the controller's ConfigMap is shown in `src/plan/gateway_configs.rs`),
//! and a gateway that runs on the emitted file.

use serde_json::Value;

use crate::cli::lanekeeper_ok;
use crate::gateway::{client, gateway_to, model, ready, status_of};
use crate::scratch::Scratch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emitted_config_is_canonical_and_a_gateway_runs_on_it() {
    let scratch = Scratch::new("emit");
    let dir = scratch.join("out");
    let emit = |to: &std::path::Path, json: bool| {
        let mut args = vec![
            "plan",
            "-f",
            "examples/inc-47/inc-47.yaml",
            "--signals",
            "examples/inc-47/signals.yaml",
            "--emit-gateway-config",
            to.to_str().unwrap(),
        ];
        if json {
            args.extend(["-o", "json"]);
        }
        lanekeeper_ok(args)
    };
    let plan: Value = serde_json::from_str(&emit(&dir, true)).unwrap();
    let path = dir.join("ai-platform/agent-assist-lanes/lanes.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let cfg = lanes::GatewayConfig::from_json(text.as_bytes()).unwrap();
    // Canonical: what the controller writes is `to_json` of the config.
    assert_eq!(lanes::to_json(&cfg), text);
    let last = plan["steps"].as_array().unwrap().last().unwrap();
    assert_eq!(
        u64::from(cfg.level),
        last["profiles"][0]["level"].as_u64().unwrap()
    );
    assert_eq!(cfg.profile, "ai-platform/agent-assist");
    // The same plan emits the same bytes.
    emit(&dir.join("again"), false);
    assert_eq!(
        std::fs::read_to_string(dir.join("again/ai-platform/agent-assist-lanes/lanes.json"))
            .unwrap(),
        text
    );
    // A gateway starts on the file and admits on it.
    let m = model(&["--service-millis", "0"]);
    let gw = gateway_to(&path, &m.addr, &[]);
    let c = client();
    ready(&c, &gw).await;
    assert_eq!(status_of(&c, &gw, "p0-disruption-assist").await, 200);
}
