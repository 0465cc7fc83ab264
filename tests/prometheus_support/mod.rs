//! A real Prometheus for tests: started on a free loopback port with a
//! temporary config and data dir, series backfilled with
//! `promtool tsdb create-blocks-from openmetrics`. Without the binaries the
//! tests print a loud SKIPPED line, unless LANEKEEPER_REQUIRE_PROMETHEUS=1
//! makes that a failure.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::scratch::Scratch;
use lanekeeper::policy::World;
use lanekeeper::snapshot::SignalsFile;

fn on_path(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|f| f.is_file())
    })
}

/// The prometheus and promtool binaries, or None after a loud SKIPPED line
/// (a panic when LANEKEEPER_REQUIRE_PROMETHEUS=1).
pub fn binaries(test: &str) -> Option<(PathBuf, PathBuf)> {
    match (on_path("prometheus"), on_path("promtool")) {
        (Some(p), Some(t)) => Some((p, t)),
        _ => {
            if std::env::var("LANEKEEPER_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
                panic!(
                    "{test}: prometheus/promtool not on PATH and LANEKEEPER_REQUIRE_PROMETHEUS=1 (apt-get install -y prometheus)"
                );
            }
            eprintln!(
                "\n!!!!!!!! SKIPPED {test}: no prometheus/promtool on PATH (apt-get install -y prometheus) !!!!!!!!\n"
            );
            None
        }
    }
}

/// The promtool binary alone, or None after a loud SKIPPED line (a panic
/// when LANEKEEPER_REQUIRE_PROMETHEUS=1).
pub fn promtool(test: &str) -> Option<PathBuf> {
    match on_path("promtool") {
        Some(t) => Some(t),
        None => {
            if std::env::var("LANEKEEPER_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
                panic!(
                    "{test}: promtool not on PATH and LANEKEEPER_REQUIRE_PROMETHEUS=1 (apt-get install -y prometheus)"
                );
            }
            eprintln!(
                "\n!!!!!!!! SKIPPED {test}: no promtool on PATH (apt-get install -y prometheus) !!!!!!!!\n"
            );
            None
        }
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running Prometheus.
pub struct Prom {
    child: Child,
    pub port: u16,
    _dir: Scratch,
}

impl Prom {
    /// The base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Backfills `openmetrics` (must end with `# EOF`) and starts a server on
    /// it. None (after SKIPPED) without the binaries.
    pub fn start(test: &str, openmetrics: &str) -> Option<Prom> {
        let (prometheus, promtool) = binaries(test)?;
        let dir = Scratch::new("prom");
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let series = dir.join("series.om");
        std::fs::write(&series, openmetrics).unwrap();
        backfill(&promtool, &series, &data);
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, "global:\n  scrape_interval: 1m\n").unwrap();
        let port = free_port();
        let child = Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg("--storage.tsdb.retention.time=100y")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts prometheus");
        let p = Prom {
            child,
            port,
            _dir: dir,
        };
        p.wait_ready();
        Some(p)
    }

    /// Starts a server that scrapes `target` (`host:port`) every second.
    pub fn start_scraping(test: &str, target: &str) -> Option<Prom> {
        Self::start_scraping_all(test, &[target])
    }

    /// Starts a server that scrapes every one of `targets` every second.
    pub fn start_scraping_all(test: &str, targets: &[&str]) -> Option<Prom> {
        let (prometheus, _) = binaries(test)?;
        let targets = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let dir = Scratch::new("prom");
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n- job_name: exporter\n  static_configs:\n  - targets: [{targets}]\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts prometheus");
        let p = Prom {
            child,
            port,
            _dir: dir,
        };
        p.wait_ready();
        Some(p)
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = format!("127.0.0.1:{}", self.port);
        while Instant::now() < deadline {
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = write!(s, "GET /-/ready HTTP/1.0\r\nHost: x\r\n\r\n");
                let mut buf = String::new();
                let _ = s.read_to_string(&mut buf);
                if buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("prometheus did not become ready on {addr}");
    }

    /// Stops the server (a later query finds it down).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Prom {
    fn drop(&mut self) {
        self.stop();
    }
}

fn backfill(promtool: &Path, series: &Path, data: &Path) {
    let out = Command::new(promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(series)
        .arg(data)
        .output()
        .expect("runs promtool");
    assert!(
        out.status.success(),
        "promtool failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Now, in Unix seconds, rounded down to the minute.
pub fn minute_now() -> i64 {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    s - s % 60
}

/// An OpenMetrics exposition: family name → (labels, [(t, v)]). Values are
/// written as Prometheus reads them (NaN, +Inf).
#[derive(Default)]
pub struct Series(pub BTreeMap<String, BTreeMap<String, Vec<(i64, f64)>>>);

impl Series {
    pub fn add(&mut self, family: &str, labels: &str, t: i64, v: f64) {
        self.0
            .entry(family.to_owned())
            .or_default()
            .entry(labels.to_owned())
            .or_default()
            .push((t, v));
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for (fam, series) in &self.0 {
            let _ = writeln!(out, "# TYPE {fam} gauge");
            for (labels, points) in series {
                for (t, v) in points {
                    let v = if v.is_nan() {
                        "NaN".to_owned()
                    } else if v.is_infinite() {
                        if *v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
                    } else {
                        format!("{v}")
                    };
                    let l = if labels.is_empty() {
                        String::new()
                    } else {
                        format!("{{{labels}}}")
                    };
                    let _ = writeln!(out, "{fam}{l} {v} {t}");
                }
            }
        }
        out.push_str("# EOF\n");
        out
    }
}

/// The recording-rule style series of a signals timeline, starting at
/// `base` (Unix seconds): pool signals, per-lane request rates (every lane:
/// the step's rate of originals, else its expectedRequestsPerSecond; the
/// step's retries, else 0) and per-pod error ratios, labelled the way
/// examples/inc-47-live's queries select them.
pub fn series_of(signals: &SignalsFile, world: &World, base: i64) -> Series {
    use kube::ResourceExt;
    let mut s = Series::default();
    for step in &signals.steps {
        let t = base + step.at;
        for (k, p) in &step.profiles {
            let (ns, name) = k.split_once('/').unwrap();
            let l = format!("namespace=\"{ns}\",profile=\"{name}\"");
            for (fam, v) in [
                (
                    "pool:available_units_per_second",
                    p.available_units_per_second,
                ),
                ("pool:in_flight", p.in_flight),
                ("pool:queue_depth", p.queue_depth),
                ("pool:p95_latency_seconds", p.p95_latency_seconds),
                ("pool:error_ratio", p.error_ratio),
            ] {
                if let Some(v) = v {
                    s.add(fam, &l, t, v);
                }
            }
            for (pod, ps) in &p.pods {
                if let Some(e) = ps.error_ratio {
                    s.add(
                        "pod:error_ratio",
                        &format!("namespace=\"{ns}\",pod=\"{pod}\""),
                        t,
                        e,
                    );
                }
            }
        }
        for lane in &world.lanes {
            let ns = lane.namespace().unwrap_or_default();
            let k = format!("{ns}/{}", lane.name_any());
            let rps = step
                .lanes
                .get(&k)
                .and_then(|l| l.requests_per_second)
                .unwrap_or_else(|| lane.spec.expected_requests_per_second.value());
            let labels = format!("lane=\"{}\",namespace=\"{ns}\"", lane.name_any());
            s.add("lane:requests_per_second", &labels, t, rps);
            // Retries: the step's, else none.
            let retries = step
                .lanes
                .get(&k)
                .and_then(|l| l.retry_requests_per_second)
                .unwrap_or(0.0);
            s.add("lane:retry_requests_per_second", &labels, t, retries);
        }
    }
    s
}
