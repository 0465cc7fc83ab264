//! A real cluster for the e2e tests: whatever `KUBECONFIG` names, with
//! `LANEKEEPER_E2E=1` — the local control plane of `e2e/cluster.sh` in CI,
//! kind on a user's machine (`e2e/run.sh`).
//!
//! Without `LANEKEEPER_E2E=1` a test prints a loud SKIPPED line and passes,
//! unless `LANEKEEPER_REQUIRE_CLUSTER=1` (set by `e2e/with-cluster.sh`, so by
//! `.ci/run`, and by `e2e/run.sh`) makes that a failure. The same variable
//! makes a test that needs the local control plane's processes (restarts,
//! the audit log) fail on another cluster instead of returning early.
//!
//! Each test works in a namespace of its own, so the tests of a file run in
//! parallel. The controller under test runs out of cluster, as a child
//! process of the real binary, with a kubeconfig holding a token of the
//! chart's ServiceAccount (TokenRequest API): the real server enforces the
//! chart's RBAC on every call it makes.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

/// The chart's release the controller's identity comes from.
pub const RELEASE: &str = "lanekeeper";
/// Its namespace (the ServiceAccount's and the leader Lease's).
pub const RELEASE_NS: &str = "lanekeeper-system";
/// lanekeeper's apiVersion.
pub const LK: &str = "lanekeeper.dev/v1alpha1";

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A connected cluster.
pub struct Cluster {
    /// An admin client.
    pub client: Client,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The state directory of `e2e/cluster.sh` when the cluster is that one
    /// (restarts, audit log); None on any other cluster.
    pub local: Option<PathBuf>,
    bin: Option<PathBuf>,
}

/// `LANEKEEPER_REQUIRE_CLUSTER=1`: no e2e test may skip.
pub fn cluster_required() -> bool {
    std::env::var("LANEKEEPER_REQUIRE_CLUSTER").as_deref() == Ok("1")
}

/// Connects to the e2e cluster, or prints a loud SKIPPED line and returns
/// None (a panic with `LANEKEEPER_REQUIRE_CLUSTER=1`).
pub async fn connect(test: &str) -> Option<Cluster> {
    let enabled = std::env::var("LANEKEEPER_E2E").as_deref() == Ok("1");
    let kubeconfig = std::env::var_os("KUBECONFIG").map(PathBuf::from);
    let (true, Some(kubeconfig)) = (enabled, kubeconfig) else {
        if cluster_required() {
            panic!(
                "{test}: LANEKEEPER_REQUIRE_CLUSTER=1 but no cluster: start one with \
                 `bash e2e/cluster.sh up` and set LANEKEEPER_E2E=1 KUBECONFIG=e2e/.cluster/kubeconfig"
            );
        }
        // Straight to stderr: libtest does not capture it, so the skip shows.
        let _ = writeln!(
            std::io::stderr(),
            "\n==== SKIPPED {test}: needs a cluster. `bash e2e/cluster.sh up`, then \
             LANEKEEPER_E2E=1 KUBECONFIG=e2e/.cluster/kubeconfig cargo test (or bash e2e/run.sh for kind) ====\n"
        );
        return None;
    };
    let local = kubeconfig
        .parent()
        .filter(|d| d.join("run/kube-apiserver.cmd").is_file())
        .map(Path::to_path_buf);
    let bin = std::env::var_os("LANEKEEPER_CLUSTER_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let d = local.as_ref()?;
            Some(PathBuf::from(
                std::fs::read_to_string(d.join("bin")).ok()?.trim(),
            ))
        });
    let client = Client::try_default()
        .await
        .unwrap_or_else(|e| panic!("{test}: a client for KUBECONFIG: {e}"));
    Some(Cluster {
        client,
        kubeconfig,
        local,
        bin,
    })
}

/// Polls `f` every 200 ms until it returns Some, or panics after `timeout`
/// with `what` and the last value `f` saw (through `last`).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A name unique to this run.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1_000_000;
    format!(
        "{prefix}-{t}-{}-{}",
        std::process::id() % 1000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The output of a finished command.
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Cluster {
    /// A tool of the cluster's build (kubectl, helm), or from PATH.
    pub fn tool(&self, name: &str) -> PathBuf {
        match &self.bin {
            Some(b) if b.join(name).is_file() => b.join(name),
            _ => PathBuf::from(name),
        }
    }

    /// Runs kubectl with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.run("kubectl", args, None)
    }

    /// Runs kubectl with `stdin` on its standard input.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        self.run("kubectl", args, Some(stdin))
    }

    /// Runs helm with the admin kubeconfig.
    pub fn helm(&self, args: &[&str]) -> Output {
        self.run("helm", args, None)
    }

    fn run(&self, tool: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(self.tool(tool));
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env(
                "HELM_CACHE_HOME",
                std::env::temp_dir().join("lanekeeper-e2e-helm/cache"),
            )
            .env(
                "HELM_CONFIG_HOME",
                std::env::temp_dir().join("lanekeeper-e2e-helm/config"),
            )
            .env(
                "HELM_DATA_HOME",
                std::env::temp_dir().join("lanekeeper-e2e-helm/data"),
            )
            .current_dir(repo())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{tool} {args:?}: {e}"));
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        Output {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Like `kubectl`, but panics with its stderr when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let o = self.kubectl(args);
        assert!(o.ok, "kubectl {args:?} failed: {}{}", o.stdout, o.stderr);
        o.stdout
    }

    /// Like `helm`, but panics with its stderr when it fails.
    pub fn helm_ok(&self, args: &[&str]) -> String {
        let o = self.helm(args);
        assert!(o.ok, "helm {args:?} failed: {}{}", o.stdout, o.stderr);
        o.stdout
    }

    /// Creates a namespace of its own for a test (deleted when the guard
    /// drops).
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        let name = unique(prefix);
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))
        .unwrap();
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        // The ServiceAccount controller adds `default` shortly after; pods
        // need it.
        let sa: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &name);
        eventually(
            "the default ServiceAccount",
            Duration::from_secs(90),
            || {
                let sa = sa.clone();
                async move { sa.get_opt("default").await.ok().flatten() }
            },
        )
        .await;
        TestNamespace {
            name,
            kubeconfig: self.kubeconfig.clone(),
            kubectl: self.tool("kubectl"),
        }
    }

    /// Server-side applies an object (any kind, namespaced or not).
    pub async fn apply(&self, v: &Value) -> Result<Value, kube::Error> {
        let name = v["metadata"]["name"].as_str().unwrap().to_owned();
        let obj = dynamic(&self.client, v)
            .patch(
                &name,
                &PatchParams::apply("lanekeeper-e2e").force(),
                &Patch::Apply(v),
            )
            .await?;
        Ok(serde_json::to_value(obj).unwrap())
    }

    /// Installs (or keeps) the chart release whose ServiceAccount and RBAC
    /// the controller under test runs with: `lanekeeper` in
    /// `lanekeeper-system`, CRDs included, with no controller replicas of its
    /// own (the tests run theirs).
    pub fn operator_release(&self) {
        static DONE: OnceLock<()> = OnceLock::new();
        DONE.get_or_init(|| {
            let chart = repo().join("charts/lanekeeper");
            self.helm_ok(&[
                "upgrade",
                "--install",
                RELEASE,
                chart.to_str().unwrap(),
                "--namespace",
                RELEASE_NS,
                "--create-namespace",
                "--set",
                "replicaCount=0",
                "--set",
                "podDisruptionBudget.enabled=false",
                "--wait",
                "--timeout",
                "120s",
            ]);
            for crd in [
                "capacityprofiles.lanekeeper.dev",
                "lanecontracts.lanekeeper.dev",
                "degradationpolicies.lanekeeper.dev",
                "lanefreezes.lanekeeper.dev",
            ] {
                self.kubectl_ok(&[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    &format!("crd/{crd}"),
                ]);
            }
        });
    }

    /// A kubeconfig for `namespace/service_account`, with a token from the
    /// TokenRequest API (one hour), written next to the test's logs.
    pub async fn service_account_kubeconfig(&self, namespace: &str, sa: &str) -> PathBuf {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = api
            .create_token_request(sa, &PostParams::default(), &req)
            .await
            .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{sa}: {e}"))
            .status
            .expect("a token")
            .token;
        let view: Value = serde_json::from_str(&self.kubectl_ok(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "-o",
            "json",
        ]))
        .unwrap();
        let cluster = &view["clusters"][0]["cluster"];
        let kc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": cluster}],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": sa}}],
            "current-context": "e2e"
        });
        let path = scratch().join(format!("{}.kubeconfig", unique(sa)));
        std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
        path
    }

    /// `e2e/cluster.sh COMMAND COMPONENT` on the local control plane.
    pub fn cluster_sh(&self, command: &str, component: &str) {
        let state = self
            .local
            .as_ref()
            .expect("the local control plane of e2e/cluster.sh");
        let out = Command::new("bash")
            .arg(repo().join("e2e/cluster.sh"))
            .args([command, component])
            .env("LANEKEEPER_CLUSTER_STATE", state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "e2e/cluster.sh {command} {component}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// For a test that needs the local control plane's processes: true on
    /// it. On another cluster a note and false (the caller returns), or a
    /// panic with `LANEKEEPER_REQUIRE_CLUSTER=1` (then no test may skip;
    /// `e2e/run.sh` leaves these tests out on kind by name).
    pub fn has_local_processes(&self, test: &str, needs: &str) -> bool {
        if self.local.is_some() {
            return true;
        }
        assert!(
            !cluster_required(),
            "{test}: {needs}, and KUBECONFIG is not the local control plane of e2e/cluster.sh \
             (LANEKEEPER_REQUIRE_CLUSTER=1: no test may skip)"
        );
        let _ = writeln!(
            std::io::stderr(),
            "\n==== {test}: {needs}; not run on this cluster ====\n"
        );
        false
    }

    /// The audit log entries of one user (local control plane only). A
    /// missing or unreadable log is a failure, not an empty log.
    pub fn audit(&self, user: &str) -> Vec<Value> {
        let state = self.local.as_ref().expect("the local control plane");
        let path = state.join("audit.log");
        let f = std::fs::File::open(&path)
            .unwrap_or_else(|e| panic!("the audit log {}: {e}", path.display()));
        std::io::BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .filter(|e| e["user"]["username"] == user)
            .collect()
    }
}

/// A namespace deleted on drop.
pub struct TestNamespace {
    pub name: String,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var("LANEKEEPER_E2E_KEEP").as_deref() == Ok("1") {
            return;
        }
        let _ = Command::new(&self.kubectl)
            .args(["delete", "namespace", &self.name, "--wait=false"])
            .env("KUBECONFIG", &self.kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The dynamic API of an object's kind (plural: lowercase + "s", policies).
pub fn dynamic(client: &Client, v: &Value) -> Api<DynamicObject> {
    let api_version = v["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = v["kind"].as_str().unwrap();
    let plural = format!("{}s", kind.to_lowercase()).replace("policys", "policies");
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural);
    match v["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Where tests write logs and kubeconfigs: target/e2e.
pub fn scratch() -> PathBuf {
    let d = repo().join("target/e2e");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The real controller binary, running out of cluster.
pub struct Controller {
    child: Option<Child>,
    /// Its /metrics address.
    pub metrics_addr: String,
    /// Its log file.
    pub log: PathBuf,
}

impl Controller {
    /// Starts `lanekeeper run` with `kubeconfig`, watching `namespace`, with
    /// a 1 s resync (unless `extra` gives one) and `extra` arguments.
    pub fn start(kubeconfig: &Path, namespace: &str, identity: &str, extra: &[&str]) -> Self {
        let resync: &[&str] = if extra.contains(&"--resync-seconds") {
            &[]
        } else {
            &["--resync-seconds", "1"]
        };
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let health_addr = format!("127.0.0.1:{}", free_port());
        let log = scratch().join(format!("{}.log", unique(identity)));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_lanekeeper"))
            .args([
                "run",
                "--namespace",
                namespace,
                "--metrics-addr",
                &metrics_addr,
                "--health-addr",
                &health_addr,
                "--identity",
                identity,
                "--lease-namespace",
                RELEASE_NS,
            ])
            .args(resync)
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("the lanekeeper binary");
        Controller {
            child: Some(child),
            metrics_addr,
            log,
        }
    }

    /// Its /metrics page (empty while it is not serving).
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.metrics_addr);
        match reqwest::get(&url).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The sum of a counter or gauge family on its /metrics page.
    pub async fn metric_sum(&self, family: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills it at once (SIGKILL: no Lease release, no goodbye).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}
