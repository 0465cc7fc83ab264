//! An in-process Kubernetes API server double for controller tests.
//!
//! `ApiServer::start().await` serves plain HTTP on 127.0.0.1; `server.client()` is a real
//! `kube::Client` for it, so kube's `Api`, `watcher`, `reflector`, `Recorder` and
//! `kube-lease-manager` talk to it unchanged. See `tests/it/apiserver_double.rs` for usage.
//!
//! Faithful where a controller depends on it: list/watch with resourceVersions, label and field
//! selectors, pagination, 410 on expired history, create/replace/patch (merge, strategic, JSON,
//! server-side apply with field ownership and conflicts), delete with ownerReference cascade and
//! finalizers, the status and scale subresources, generation, CRDs that become served, discovery;
//! ServiceAccount tokens it issues (`service_account_token`), their key set at `/openid/v1/jwks`
//! and TokenReviews of them (`tokens.rs`).

mod fields;
mod http;
mod select;
mod store;
mod tokens;

#[allow(unused_imports)]
pub use select::Selector;
#[allow(unused_imports)]
pub use store::{ApiError, ResourceDef, ScaleDef, WriteRecord};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use store::{Limits, State, Sub};

/// One HTTP request as the double answered it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    pub field_manager: Option<String>,
    /// HTTP status of the answer (200 for a watch that started streaming;
    /// 0 while it is being answered: a request is in the log before what
    /// it changes can be read, so a test that saw the change sees it).
    pub status: u16,
    /// Its place in the log (for the answer's status).
    pub seq: u64,
    pub time: SystemTime,
    pub watch: bool,
    /// The request body parsed as JSON (or YAML), if any.
    pub body: Option<Value>,
    /// The injected fault that shaped the answer, if any.
    pub fault: Option<String>,
}

impl RecordedRequest {
    /// True for requests that can change state (not GET).
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

/// What an injected fault does to a matching request.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultAction {
    /// Answer with this HTTP status and a `Status` body (e.g. 500 InternalError, 503, 429, 504).
    Status(u16),
    /// Answer 409 Conflict, reason "Conflict".
    Conflict,
    /// Wait, then serve the request normally.
    Delay(Duration),
    /// For watch requests: close the stream after sending this many events.
    DropWatch { after_events: usize },
}

/// A fault: requests whose method and path match get `action`, `times` times.
#[derive(Clone, Debug)]
pub struct Fault {
    /// HTTP method to match ("GET", "PATCH", ...); `None` matches any.
    pub method: Option<String>,
    /// Substring the request path must contain ("" matches any).
    pub path_contains: String,
    /// Substring the request path must not contain (`None`: no exclusion).
    pub path_excludes: Option<String>,
    /// `Some(true)`: only watch requests; `Some(false)`: only non-watch requests.
    pub watch: Option<bool>,
    pub action: FaultAction,
    pub times: usize,
}

impl Fault {
    pub fn new(action: FaultAction) -> Self {
        let watch = matches!(action, FaultAction::DropWatch { .. }).then_some(true);
        Fault {
            method: None,
            path_contains: String::new(),
            path_excludes: None,
            watch,
            action,
            times: 1,
        }
    }
    pub fn status(code: u16) -> Self {
        Self::new(FaultAction::Status(code))
    }
    pub fn conflict() -> Self {
        Self::new(FaultAction::Conflict)
    }
    pub fn delay(d: Duration) -> Self {
        Self::new(FaultAction::Delay(d))
    }
    pub fn drop_watch(after_events: usize) -> Self {
        Self::new(FaultAction::DropWatch { after_events })
    }
    pub fn method(mut self, m: &str) -> Self {
        self.method = Some(m.to_ascii_uppercase());
        self
    }
    pub fn path(mut self, contains: &str) -> Self {
        self.path_contains = contains.to_string();
        self
    }
    /// Matches only paths without `excludes` (an object but not its
    /// `/status`, say).
    pub fn not_path(mut self, excludes: &str) -> Self {
        self.path_excludes = Some(excludes.to_string());
        self
    }
    pub fn times(mut self, n: usize) -> Self {
        self.times = n;
        self
    }
    pub fn watch_only(mut self, only: bool) -> Self {
        self.watch = Some(only);
        self
    }
}

/// Tuning for a server instance.
#[derive(Clone, Debug)]
pub struct Options {
    /// Watch events retained; a watch from an older resourceVersion gets 410 Expired.
    pub event_history: usize,
    /// Entries kept in the write log (`history`, `write_log`).
    pub write_log: usize,
    /// Requests kept in the request log.
    pub request_log: usize,
    /// Interval between BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            event_history: 20_000,
            write_log: 200_000,
            request_log: 200_000,
            bookmark_interval: Duration::from_secs(5),
        }
    }
}

pub(crate) struct Inner {
    state: Mutex<State>,
    pub(crate) changes: tokio::sync::watch::Sender<u64>,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    requests: Mutex<VecDeque<RecordedRequest>>,
    next_seq: std::sync::atomic::AtomicU64,
    request_limit: usize,
    faults: Mutex<Vec<Fault>>,
    pub(crate) addr: SocketAddr,
    pub(crate) bookmark_interval: Duration,
    /// The key ServiceAccount tokens are signed with.
    pub(crate) signer: tokens::Signer,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn notify(&self) {
        let rv = self.state().rv;
        self.changes.send_replace(rv);
    }

    /// Logs a request; its number, for [`Inner::answered`].
    pub(crate) fn record(&self, mut r: RecordedRequest) -> u64 {
        r.seq = self
            .next_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seq = r.seq;
        let mut q = lock(&self.requests);
        q.push_back(r);
        while q.len() > self.request_limit {
            q.pop_front();
        }
        seq
    }

    /// The status a logged request was answered with.
    pub(crate) fn answered(&self, seq: u64, status: u16) {
        let mut q = lock(&self.requests);
        if let Some(r) = q.iter_mut().rev().find(|r| r.seq == seq) {
            r.status = status;
        }
    }

    pub(crate) fn take_faults(&self, method: &str, path: &str, is_watch: bool) -> Vec<FaultAction> {
        let mut faults = lock(&self.faults);
        let mut out = Vec::new();
        for f in faults.iter_mut() {
            let matches = f.times > 0
                && f.method.as_deref().is_none_or(|m| m == method)
                && path.contains(&f.path_contains)
                && f.path_excludes.as_deref().is_none_or(|x| !path.contains(x))
                && f.watch.is_none_or(|w| w == is_watch)
                && (is_watch || !matches!(f.action, FaultAction::DropWatch { .. }));
            if matches {
                f.times -= 1;
                out.push(f.action.clone());
            }
        }
        faults.retain(|f| f.times > 0);
        out
    }

    pub(crate) fn api_groups(&self) -> Value {
        let st = self.state();
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for r in st.resources.iter().filter(|r| !r.group.is_empty()) {
            match groups.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, vs)) => {
                    if !vs.contains(&r.version) {
                        vs.push(r.version.clone());
                    }
                }
                None => groups.push((r.group.clone(), vec![r.version.clone()])),
            }
        }
        let groups: Vec<Value> = groups
            .into_iter()
            .map(|(g, vs)| {
                let versions: Vec<Value> = vs
                    .iter()
                    .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                    .collect();
                json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
            })
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    pub(crate) fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let st = self.state();
        let rds: Vec<&ResourceDef> = st
            .resources
            .iter()
            .filter(|r| r.group == group && r.version == version)
            .collect();
        if rds.is_empty() {
            return None;
        }
        let mut resources = Vec::new();
        for r in rds {
            let mut main = json!({
                "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            });
            if !r.short_names.is_empty() {
                main["shortNames"] = json!(r.short_names);
            }
            resources.push(main);
            if r.status {
                resources.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
            }
            if r.scale.is_some() {
                resources.push(json!({"name": format!("{}/scale", r.plural), "singularName": "", "namespaced": r.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
            }
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
        )
    }
}

/// The running double. Dropping it stops the server and ends open watches.
pub struct ApiServer {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.inner.shutdown.send_replace(true);
        self.task.abort();
    }
}

fn api_version_of(obj: &Value) -> (&str, &str) {
    (
        obj.get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        obj.get("kind").and_then(Value::as_str).unwrap_or_default(),
    )
}

fn name_ns_of(obj: &Value) -> (String, String) {
    let meta = obj.get("metadata");
    (
        meta.and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        meta.and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    )
}

impl ApiServer {
    /// Binds 127.0.0.1 on a free port and serves until dropped.
    pub async fn start() -> ApiServer {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(opts: Options) -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let inner = Arc::new(Inner {
            state: Mutex::new(State::new(Limits {
                event_history: opts.event_history.max(1),
                write_log: opts.write_log,
            })),
            changes: tokio::sync::watch::channel(0).0,
            shutdown: tokio::sync::watch::channel(false).0,
            requests: Mutex::new(VecDeque::new()),
            next_seq: std::sync::atomic::AtomicU64::new(0),
            request_limit: opts.request_log,
            faults: Mutex::new(Vec::new()),
            addr,
            bookmark_interval: opts.bookmark_interval,
            signer: tokens::Signer::new(),
        });
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ApiServer { inner, task }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// A kube client for this server (default namespace "default").
    pub fn client(&self) -> kube::Client {
        let uri: axum::http::Uri = self.url().parse().expect("server url");
        let config = kube::Config::new(uri);
        kube::Client::try_from(config).expect("kube client for the double")
    }

    /// A kubeconfig for this server, as a file's text (no credentials).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {}\n\
             users:\n- name: anyone\n  user: {{}}\ncontexts:\n- name: double\n  context:\n    \
             cluster: double\n    user: anyone\n    namespace: default\ncurrent-context: double\n",
            self.url()
        )
    }

    /// A ServiceAccount token of `namespace/name` for `audiences`, valid for
    /// `ttl`, signed with the key the server serves at `/openid/v1/jwks`
    /// and accepts in TokenReviews.
    pub fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        audiences: &[&str],
        ttl: Duration,
    ) -> String {
        self.inner.signer.issue(namespace, name, audiences, ttl)
    }

    /// The key id of the server's ServiceAccount token key.
    pub fn service_account_key_id(&self) -> String {
        self.inner.signer.kid.clone()
    }

    // ----- requests and faults -----

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner.requests).iter().cloned().collect()
    }

    pub fn clear_requests(&self) {
        lock(&self.inner.requests).clear();
    }

    /// Requests whose method matches (`None`: any) and whose path contains `path_contains`.
    pub fn requests_matching(
        &self,
        method: Option<&str>,
        path_contains: &str,
    ) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| {
                method.is_none_or(|m| r.method.eq_ignore_ascii_case(m))
                    && r.path.contains(path_contains)
            })
            .collect()
    }

    pub fn inject(&self, fault: Fault) {
        lock(&self.inner.faults).push(fault);
    }

    pub fn clear_faults(&self) {
        lock(&self.inner.faults).clear();
    }

    /// Faults not yet used up.
    pub fn pending_faults(&self) -> Vec<Fault> {
        lock(&self.inner.faults).clone()
    }

    // ----- direct state access (no HTTP; writes still produce watch events and history) -----

    fn rd(&self, api_version: &str, kind_or_plural: &str) -> Result<ResourceDef, ApiError> {
        self.inner
            .state()
            .find_by(api_version, kind_or_plural)
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "NotFound",
                    format!("no resource {kind_or_plural} in {api_version}"),
                )
            })
    }

    /// Serves another resource type (beyond the built-in ones and CRDs).
    pub fn register(&self, rd: ResourceDef) {
        let mut st = self.inner.state();
        st.resources
            .retain(|r| !(r.group == rd.group && r.version == rd.version && r.plural == rd.plural));
        st.resources.push(rd);
    }

    pub fn get_object(
        &self,
        api_version: &str,
        kind_or_plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let rd = self.rd(api_version, kind_or_plural).ok()?;
        self.inner.state().get(&rd, ns.unwrap_or_default(), name)
    }

    /// All objects of a kind, in one namespace or (`None`) all.
    pub fn list_objects(
        &self,
        api_version: &str,
        kind_or_plural: &str,
        ns: Option<&str>,
    ) -> Vec<Value> {
        let Ok(rd) = self.rd(api_version, kind_or_plural) else {
            return vec![];
        };
        self.inner.state().list(&rd, ns)
    }

    /// Creates or replaces an object as given (status included), ignoring subresource rules.
    /// A `metadata.resourceVersion` in `obj` is checked (409 when stale).
    pub fn put_direct(&self, obj: Value) -> Result<Value, ApiError> {
        let (av, kind) = api_version_of(&obj);
        let rd = self.rd(av, kind)?;
        let (name, ns) = name_ns_of(&obj);
        let out = {
            let mut st = self.inner.state();
            if st.get(&rd, &ns, &name).is_some() {
                st.replace(&rd, &ns, &name, Sub::Main, obj, Some("test-direct"), true)
            } else {
                st.create(&rd, &ns, obj, Some("test-direct"), true)
            }
        };
        self.inner.notify();
        out
    }

    /// Server-side apply of `obj` (main resource) by `manager`.
    pub fn apply_direct(&self, manager: &str, obj: Value, force: bool) -> Result<Value, ApiError> {
        self.apply_direct_sub(manager, obj, force, None)
    }

    /// Server-side apply to a subresource (`Some("status")`, `Some("scale")`) or the main resource.
    pub fn apply_direct_sub(
        &self,
        manager: &str,
        obj: Value,
        force: bool,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError> {
        let (av, kind) = api_version_of(&obj);
        let rd = self.rd(av, kind)?;
        let (name, ns) = name_ns_of(&obj);
        let sub = match subresource {
            Some("status") => Sub::Status,
            Some("scale") => Sub::Scale,
            _ => Sub::Main,
        };
        let out = self
            .inner
            .state()
            .apply(&rd, &ns, &name, sub, &obj, Some(manager), force)
            .map(|(v, _)| v);
        self.inner.notify();
        out
    }

    /// JSON merge patch, to the main resource or a subresource.
    pub fn merge_patch_direct(
        &self,
        api_version: &str,
        kind_or_plural: &str,
        ns: Option<&str>,
        name: &str,
        patch: Value,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError> {
        let rd = self.rd(api_version, kind_or_plural)?;
        let sub = match subresource {
            Some("status") => Sub::Status,
            Some("scale") => Sub::Scale,
            _ => Sub::Main,
        };
        let out = self.inner.state().patch(
            &rd,
            ns.unwrap_or_default(),
            name,
            sub,
            store::PatchType::Merge,
            &patch,
            Some("test-direct"),
        );
        self.inner.notify();
        out
    }

    pub fn delete_direct(
        &self,
        api_version: &str,
        kind_or_plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let rd = self.rd(api_version, kind_or_plural).ok()?;
        let out = self
            .inner
            .state()
            .delete(&rd, ns.unwrap_or_default(), name, &json!({}))
            .ok();
        self.inner.notify();
        out
    }

    // ----- history -----

    /// The global resourceVersion counter (the last committed write).
    pub fn resource_version(&self) -> u64 {
        self.inner.state().rv
    }

    /// Every committed write, oldest first, with the full object after it.
    pub fn write_log(&self) -> Vec<WriteRecord> {
        self.inner.state().writes.iter().cloned().collect()
    }

    /// Writes committed after resourceVersion `rv`.
    pub fn writes_since(&self, rv: u64) -> Vec<WriteRecord> {
        self.inner
            .state()
            .writes
            .iter()
            .filter(|w| w.resource_version > rv)
            .cloned()
            .collect()
    }

    /// Writes dropped from the front of the write log because of its bound.
    pub fn writes_dropped(&self) -> u64 {
        self.inner.state().writes_dropped
    }

    /// Every state one object had, oldest first (a DELETED record carries the last state).
    pub fn history(
        &self,
        api_version: &str,
        kind_or_plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Vec<WriteRecord> {
        let Ok(rd) = self.rd(api_version, kind_or_plural) else {
            return vec![];
        };
        self.inner
            .state()
            .writes
            .iter()
            .filter(|w| {
                w.plural == rd.plural
                    && w.api_version.split('/').rev().nth(1).unwrap_or_default() == rd.group
                    && w.name == name
                    && (!rd.namespaced || w.namespace.as_deref() == ns)
            })
            .cloned()
            .collect()
    }

    /// Forgets the watch event history: watches resuming from an older resourceVersion get 410.
    pub fn compact(&self) {
        self.inner.state().compact();
    }

    // ----- CRDs -----

    /// Creates (or replaces) CRDs directly; each becomes served at once.
    pub fn install_crds(&self, crds: &[CustomResourceDefinition]) -> Result<(), ApiError> {
        for crd in crds {
            let v = serde_json::to_value(crd).map_err(|e| ApiError::bad_request(e.to_string()))?;
            let mut v = v;
            v["apiVersion"] = json!("apiextensions.k8s.io/v1");
            v["kind"] = json!("CustomResourceDefinition");
            self.put_direct(v)?;
        }
        Ok(())
    }

    /// Installs `lanekeeper::api::crds()`.
    pub fn install_lanekeeper_crds(&self) {
        self.install_crds(&lanekeeper::api::crds())
            .expect("lanekeeper CRDs install");
    }

    /// Polls `cond` every 10 ms until it holds or `timeout` passes; returns whether it held.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        mut cond: impl FnMut(&ApiServer) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
