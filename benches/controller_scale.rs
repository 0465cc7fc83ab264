//! The real controller at scale against the in-process API double: 50
//! profiles (each with a Deployment and a DegradationPolicy) and 1,000 lanes.
//! Not a timed test: it prints figures for docs/performance.md.
//!
//! `cargo bench --bench controller_scale`
//!
//! Measures the time from starting the controller to all 50 gateway
//! ConfigMaps written (and to every profile and lane status written), the
//! writes and reads per resync tick at steady state from the double's request
//! log, and the controller's memory. The double runs in this process; the
//! controller runs in a child process (this same binary, started with
//! `LANEKEEPER_BENCH_CONTROLLER_URL`), so its resident set is its own.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lanekeeper::controller::{self, Metrics, Readiness, Settings};
use serde_json::{Value, json};
use support::apiserver::ApiServer;

const LK: &str = "lanekeeper.dev/v1alpha1";
const NAMESPACES: usize = 10;
const PROFILES_PER_NS: usize = 5;
const LANES_PER_PROFILE: usize = 20;
const RESYNC: Duration = Duration::from_secs(1);
const TICKS: u32 = 10;

/// Resident set of this process in KiB (Linux).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn ns_name(i: usize) -> String {
    format!("team-{i:02}")
}

fn objects(ns: &str, pool: &str) -> Vec<Value> {
    let mut out = vec![
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": pool, "namespace": ns},
            "spec": {
                "replicas": 8,
                "selector": {"matchLabels": {"app": pool}},
                "template": {"metadata": {"labels": {"app": pool}}, "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}
            },
            "status": {"replicas": 8, "readyReplicas": 8}
        }),
        json!({
            "apiVersion": LK, "kind": "CapacityProfile",
            "metadata": {"name": pool, "namespace": ns},
            "spec": {
                "pool": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": pool},
                    "podSelector": {"matchLabels": {"app": pool}}
                },
                "capacity": {"safeUnitsPerSecond": "560", "unitsPerReplica": "70", "warningUtilizationPercent": 85},
                "replicas": {"min": 4, "max": 16, "maxScaleUpStep": 4, "scaleDownStabilizationSeconds": 300},
                "inFlight": {"conserveAt": 1350, "stopAt": 1500, "resumeBelow": 1200}
            }
        }),
        json!({
            "apiVersion": LK, "kind": "DegradationPolicy",
            "metadata": {"name": format!("{pool}-ladder"), "namespace": ns},
            "spec": {
                "profile": pool,
                "hysteresis": {"stableForSeconds": 300},
                "onMissingTelemetry": "Hold",
                "levels": [
                    {"name": "conserve", "enterWhen": {"utilizationPercentAbove": 85},
                     "exitWhen": {"utilizationPercentBelow": 80}, "actions": {"rejectOptionalContext": true}},
                    {"name": "shed", "enterWhen": {"overCapacity": true},
                     "actions": {"pause": [{"priorityAtLeast": 4}]}},
                    {"name": "continuity", "enterWhen": {"overCapacity": true},
                     "approval": {"mode": "Confirm", "timeoutSeconds": 300}, "actions": {"readOnly": true}}
                ]
            }
        }),
    ];
    // 20 lanes, priorities 0..4, 20 units/s each: 400 units/s of 560 (71 %),
    // level 0.
    for i in 0..LANES_PER_PROFILE {
        let priority = (i % 5) as i64;
        let shedding = match priority {
            0 => json!({"mode": "Never"}),
            4 => json!({"mode": "Pause"}),
            _ => json!({"mode": "Throttle"}),
        };
        out.push(json!({
            "apiVersion": LK, "kind": "LaneContract",
            "metadata": {"name": format!("{pool}-lane-{i:02}"), "namespace": ns},
            "spec": {
                "profile": pool,
                "priority": priority,
                "workUnitsPerRequest": "0.5",
                "expectedRequestsPerSecond": "40",
                "floorUnitsPerSecond": if priority == 0 { json!("10") } else { Value::Null },
                "shedding": shedding,
                "deadlineSeconds": 30,
                "queue": {"maxDepth": 100, "ttlSeconds": 10},
                "retry": {"maxAttempts": 2, "budgetPercent": 5},
                "routes": {"primary": ["model-a"], "approvedFallbacks": ["model-b"]}
            }
        }));
    }
    out
}

fn configmaps_written(s: &ApiServer) -> usize {
    s.list_objects("v1", "configmaps", None)
        .iter()
        .filter(|c| {
            c["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-lanes"))
        })
        .count()
}

fn statuses_written(s: &ApiServer) -> usize {
    s.list_objects(LK, "capacityprofiles", None)
        .iter()
        .filter(|p| p["status"]["observedGeneration"].is_number())
        .count()
}

fn lane_statuses_written(s: &ApiServer) -> usize {
    s.list_objects(LK, "lanecontracts", None)
        .iter()
        .filter(|p| p["status"]["state"].is_string())
        .count()
}

/// `METHOD plural[/subresource]` of a request to a namespaced object or
/// collection.
fn kind_of(r: &support::apiserver::RecordedRequest) -> String {
    let parts: Vec<&str> = r.path.split('/').collect();
    // …/namespaces/<ns>/<plural>[/<name>[/<sub>]]
    match parts.iter().position(|p| *p == "namespaces") {
        Some(i) if parts.len() > i + 2 => {
            let plural = parts[i + 2];
            match (parts.get(i + 3), parts.get(i + 4)) {
                (_, Some(sub)) => format!("{} {plural}/{sub}", r.method),
                (Some(_), None) => format!("{} {plural}", r.method),
                (None, None) => format!("{} {plural} (list)", r.method),
            }
        }
        _ => format!("{} {}", r.method, r.path),
    }
}

fn count_by_kind(
    s: &ApiServer,
    keep: impl Fn(&support::apiserver::RecordedRequest) -> bool,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in s.requests().iter().filter(|r| keep(r)) {
        *out.entry(kind_of(r)).or_insert(0) += 1;
    }
    out
}

fn writes_by_kind(s: &ApiServer) -> BTreeMap<String, usize> {
    count_by_kind(s, |r| r.is_write())
}

/// Set in the child process that runs the controller against the double.
const CHILD_ENV: &str = "LANEKEEPER_BENCH_CONTROLLER_URL";

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match std::env::var(CHILD_ENV) {
        Ok(url) => rt.block_on(controller_child(&url)),
        Err(_) => rt.block_on(run()),
    }
}

/// The controller alone in its own process (so its memory can be measured
/// apart from the double's): runs until its stdin closes.
async fn controller_child(url: &str) {
    let config = kube::Config::new(url.parse().expect("double url"));
    let client = kube::Client::try_from(config).expect("client");
    let settings = Settings {
        namespaces: Vec::new(),
        resync: RESYNC,
        leader_election: false,
        identity: "bench".into(),
        ..Settings::default()
    };
    let shutdown = async {
        let _ = tokio::task::spawn_blocking(|| {
            use std::io::Read;
            let mut buf = [0u8; 1];
            let _ = std::io::stdin().read(&mut buf);
        })
        .await;
    };
    if let Err(e) = controller::run(
        client,
        settings,
        Metrics::new(),
        Readiness::default(),
        Vec::new(),
        shutdown,
    )
    .await
    {
        eprintln!("controller: {e}");
        std::process::exit(1);
    }
}

/// `VmRSS` and `VmHWM` of a process in KiB.
fn proc_mem(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn run() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .try_init();
    let rss_start = rss_kib();
    let s = ApiServer::start().await;
    s.install_lanekeeper_crds();
    let profiles = NAMESPACES * PROFILES_PER_NS;
    let mut n_objects = 0;
    for n in 0..NAMESPACES {
        let ns = ns_name(n);
        for p in 0..PROFILES_PER_NS {
            for o in objects(&ns, &format!("pool-{n:02}-{p}")) {
                s.put_direct(o).expect("object stored");
                n_objects += 1;
            }
        }
    }
    let lanes = s.list_objects(LK, "lanecontracts", None).len();
    let policies = s.list_objects(LK, "degradationpolicies", None).len();
    assert_eq!(lanes, profiles * LANES_PER_PROFILE);
    assert_eq!(policies, profiles);
    s.clear_requests();
    let rss_loaded = rss_kib();
    println!(
        "world: {profiles} profiles, {lanes} lanes, {policies} policies, {profiles} deployments ({n_objects} objects) in {NAMESPACES} namespaces"
    );
    println!(
        "rss: {:.1} MiB at start, {:.1} MiB with the double and the objects loaded",
        mib(rss_start),
        mib(rss_loaded)
    );

    let mut child = std::process::Command::new(std::env::current_exe().expect("own path"))
        .env(CHILD_ENV, s.url())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("controller process starts");
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let pid = child.id();

    let deadline = Duration::from_secs(300);
    let mut all_cms = None;
    let mut all_status = None;
    let mut all_lanes = None;
    while started.elapsed() < deadline
        && (all_cms.is_none() || all_status.is_none() || all_lanes.is_none())
    {
        if all_cms.is_none() && configmaps_written(&s) == profiles {
            all_cms = Some(started.elapsed());
        }
        if all_status.is_none() && statuses_written(&s) == profiles {
            all_status = Some(started.elapsed());
        }
        if all_lanes.is_none() && lane_statuses_written(&s) == lanes {
            all_lanes = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let show = |d: Option<Duration>| {
        d.map_or("not reached".to_owned(), |d| {
            format!("{:.2} s", d.as_secs_f64())
        })
    };
    println!(
        "start -> all {profiles} ConfigMaps written: {}",
        show(all_cms)
    );
    println!(
        "start -> all {profiles} profile statuses written: {}",
        show(all_status)
    );
    println!(
        "start -> all {lanes} lane statuses written: {}",
        show(all_lanes)
    );
    let converge_requests = s.requests();
    // When each kind of write happened, relative to the start.
    let mut spans: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for r in converge_requests.iter() {
        let t = r
            .time
            .duration_since(started_at)
            .map_or(0.0, |d| d.as_secs_f64());
        let kind = if r.is_write() {
            r.path
                .split('/')
                .nth(if r.path.starts_with("/api/") { 5 } else { 6 })
                .unwrap_or("?")
                .to_owned()
        } else if r.watch {
            format!("watch {}", r.path.rsplit('/').next().unwrap_or("?"))
        } else {
            continue;
        };
        let key = format!("{} {kind}", r.method);
        let e = spans.entry(key).or_insert((t, t));
        e.0 = e.0.min(t);
        e.1 = e.1.max(t);
    }
    let mut cm_times: Vec<f64> = converge_requests
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.contains("/configmaps/"))
        .map(|r| {
            r.time
                .duration_since(started_at)
                .map_or(0.0, |d| d.as_secs_f64())
        })
        .collect();
    cm_times.sort_by(f64::total_cmp);
    let pct = |q: f64| cm_times[((cm_times.len() - 1) as f64 * q).round() as usize];
    if !cm_times.is_empty() {
        println!(
            "ConfigMap writes after start: first {:.2} s, median {:.2} s, 90th {:.2} s, last {:.2} s",
            pct(0.0),
            pct(0.5),
            pct(0.9),
            pct(1.0)
        );
        let within_1s = cm_times.iter().filter(|t| **t < 1.0).count();
        println!("  {within_1s} of {} written within 1 s", cm_times.len());
    }
    for (k, (a, b)) in &spans {
        println!("  {k}: first at {a:.2} s, last at {b:.2} s");
    }
    let converge_writes = converge_requests.iter().filter(|r| r.is_write()).count();
    println!(
        "convergence: {} requests, {converge_writes} writes; writes by kind: {:?}",
        converge_requests.len(),
        writes_by_kind(&s)
    );
    let rss_converged = rss_kib();
    let (child_rss_converged, _) = proc_mem(pid);

    // Settle for a few ticks, then count over TICKS resync ticks.
    tokio::time::sleep(RESYNC * 3).await;
    s.clear_requests();
    let window = Instant::now();
    tokio::time::sleep(RESYNC * TICKS).await;
    let elapsed = window.elapsed().as_secs_f64();
    let reqs = s.requests();
    let writes = reqs.iter().filter(|r| r.is_write()).count();
    let reads = reqs.iter().filter(|r| !r.is_write() && !r.watch).count();
    let scale_reads = reqs
        .iter()
        .filter(|r| !r.is_write() && r.path.ends_with("/scale"))
        .count();
    let ticks = elapsed / RESYNC.as_secs_f64();
    println!(
        "steady state over {elapsed:.1} s (~{ticks:.0} ticks): {writes} writes ({:.2} per tick), {reads} reads ({:.0} per tick; {scale_reads} scale reads = {:.1} evaluations per profile per tick)",
        writes as f64 / ticks,
        reads as f64 / ticks,
        scale_reads as f64 / ticks / profiles as f64
    );
    if writes > 0 {
        println!("steady-state writes by kind: {:?}", writes_by_kind(&s));
    }
    let by_kind = count_by_kind(&s, |r| !r.is_write() && !r.watch);
    println!("steady-state reads by kind: {by_kind:?}");
    let rss_steady = rss_kib();
    println!(
        "double's process: VmRSS {:.1} MiB after convergence, {:.1} MiB at steady state; growth since the controller started: {:.1} MiB (request and write logs, watch events)",
        mib(rss_converged),
        mib(rss_steady),
        mib(rss_steady.saturating_sub(rss_loaded))
    );

    let (child_rss, child_hwm) = proc_mem(pid);
    println!(
        "controller process: VmRSS {:.1} MiB after convergence, {:.1} MiB at steady state (peak VmHWM {:.1} MiB)",
        mib(child_rss_converged),
        mib(child_rss),
        mib(child_hwm)
    );
    // Closing its stdin asks the controller to shut down gracefully.
    drop(child.stdin.take());
    let stop = Instant::now();
    let status = child.wait().expect("controller process exits");
    println!(
        "graceful stop in {:.2} s ({status})",
        stop.elapsed().as_secs_f64()
    );
}
