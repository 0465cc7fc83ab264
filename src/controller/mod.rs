//! The operator: `lanekeeper run`.
//!
//! Data flows one way: watch → index → signals → decide → actuate → report.
//! Reflector stores are the index; the unit of reconciliation is a
//! CapacityProfile (lanes and policies that name it map to it); the pure
//! engine decides; server-side apply with field manager `lanekeeper` writes,
//! each write skipped when nothing changed. Everything the hysteresis needs is
//! kept in status, so a restarted or newly elected controller continues where
//! the last one stopped.

pub mod context;
pub mod drain;
pub mod error;
pub mod http;
pub mod index;
pub mod lanes_configmap;
pub mod pods;
pub mod rebind;
mod reconcile;
pub mod scale;
pub mod status;
pub mod watch;
pub mod workload_peers;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};

use crate::api::{CapacityProfile, DegradationPolicy, LaneContract, LaneFreeze};
use crate::signals::{ClusterSource, SignalSource};

pub use crate::metrics::Metrics;
pub use context::{APPROVE_ANNOTATION, Context, FIELD_MANAGER, Readiness, Settings};
pub use error::{Error, transient};
use reconcile::writes::Writes;

/// How long in-flight reconciles may take to finish on shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Checks that the four CRDs are installed; the error says how to install
/// them. Transient API errors (5xx, 429, transport) are retried with backoff
/// for about a minute before giving up.
pub async fn check_crds(client: &Client) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut missing = Vec::new();
    for crd in crate::api::crds() {
        let name = crd.metadata.name.unwrap_or_default();
        let mut delay = Duration::from_millis(250);
        loop {
            match api.get_opt(&name).await {
                Ok(Some(_)) => break,
                Ok(None) => {
                    missing.push(name.clone());
                    break;
                }
                Err(e) if transient(&e) && delay < Duration::from_secs(30) => {
                    tracing::warn!(error = %e, crd = %name, retry_in = ?delay, "checking the CRDs failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => return Err(Error::kube("check CRDs", e)),
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::CrdsMissing(format!(
            "the lanekeeper CRDs are not installed ({}): install them first with `kubectl apply -f crds/` (or `lanekeeper crdgen | kubectl apply -f -`, or the Helm chart)",
            missing.join(", ")
        )))
    }
}

/// An API for one namespace, or all of them.
fn scoped_api<K>(client: &Client, ns: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(n) => Api::namespaced(client.clone(), n),
        None => Api::all(client.clone()),
    }
}

fn watch_config() -> watcher::Config {
    watcher::Config::default().any_semantic()
}

/// What the operator runs with: [`Operator::run`] takes it, and the
/// controllers of each watched namespace get a copy while it leads.
#[derive(Clone)]
pub struct Operator {
    /// The API client.
    pub client: Client,
    /// The flags of `lanekeeper run`.
    pub settings: Settings,
    /// The exported metrics.
    pub metrics: Metrics,
    /// What `/readyz` answers.
    pub readiness: Readiness,
    /// Signal sources besides the cluster (Prometheus, pod scrapes).
    pub extra_sources: Vec<Arc<dyn SignalSource>>,
}

impl Operator {
    /// Runs the controllers for every watched namespace until `shutdown`
    /// resolves; in-flight reconciles finish first.
    pub async fn run_controllers(
        self,
        shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
        let namespaces: Vec<Option<String>> = if self.settings.namespaces.is_empty() {
            vec![None]
        } else {
            self.settings.namespaces.iter().cloned().map(Some).collect()
        };
        let runs = namespaces
            .into_iter()
            .map(|ns| run_namespace(ns, self.clone(), shutdown.clone()));
        futures::future::join_all(runs).await;
        Ok(())
    }
}

/// A watch into a store (managed fields dropped: nothing reads them), and
/// the stream of the objects it touches, to trigger reconciles with.
fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = kube::runtime::reflector::store();
    let stream = kube::runtime::reflector(
        writer,
        watcher(api, config)
            .default_backoff()
            .modify(|o: &mut K| o.meta_mut().managed_fields = None),
    )
    .touched_objects();
    (store, stream)
}

/// The controller of one namespace (or all): the profile controller with the
/// lane, policy, ConfigMap and pod triggers, the resync ticker, the sweep and
/// the readiness flag, until `shutdown` resolves.
async fn run_namespace(
    ns: Option<String>,
    operator: Operator,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let Operator {
        client,
        settings,
        metrics,
        readiness,
        extra_sources,
    } = operator;
    let (profiles, lanes, policies) = (
        scoped_api(&client, &ns),
        scoped_api(&client, &ns),
        scoped_api(&client, &ns),
    );
    let (trigger_tx, trigger_rx) = futures::channel::mpsc::unbounded();
    let controller = Controller::new(profiles, watch_config());
    let profile_store = controller.store();
    let (lane_store, lane_stream) = reflected(lanes, watch_config());
    let (policy_store, policy_stream) = reflected(policies, watch_config());
    // A lane or policy whose `spec.profile` was edited concerns the profile
    // it named before too.
    let lane_map = rebind::profiles_touched(lane_store.clone(), |l: &LaneContract| {
        l.spec.profile.as_str()
    });
    let policy_map = rebind::profiles_touched(policy_store.clone(), |p: &DegradationPolicy| {
        p.spec.profile.as_str()
    });
    // A profile deleted or pointed elsewhere concerns the others on the
    // workload it named (one of them takes over). Which profile acts on a
    // shared workload is read from the same store.
    let (peer_store, peer_stream) = reflected(scoped_api(&client, &ns), watch_config());
    let peer_map = workload_peers::peers_of(peer_store.clone());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(settings.identity.clone()),
        },
    );
    let mut sources: Vec<Arc<dyn SignalSource>> = vec![Arc::new(ClusterSource)];
    sources.extend(extra_sources.iter().cloned());
    // The owned ConfigMaps and the HPAs, into caches that reconciles read
    // and whose changes trigger the profiles they concern.
    let (cm_store, cm_stream) = reflected(
        scoped_api::<ConfigMap>(&client, &ns),
        watcher::Config::default()
            .labels("app.kubernetes.io/managed-by=lanekeeper")
            .any_semantic(),
    );
    let (hpa_store, hpa_stream) = reflected(
        scoped_api::<HorizontalPodAutoscaler>(&client, &ns),
        watch_config(),
    );
    // The freeze parameters (owned by their profiles).
    let (freeze_store, freeze_stream) =
        reflected(scoped_api::<LaneFreeze>(&client, &ns), watch_config());
    for source in &sources {
        source.attach(&ns, trigger_tx.clone());
    }
    let ctx = Arc::new(Context {
        client: client.clone(),
        settings: settings.clone(),
        metrics: metrics.clone(),
        recorder,
        sources,
        profiles: profile_store.clone(),
        peer_profiles: peer_store,
        lanes: lane_store.clone(),
        policies: policy_store.clone(),
        pods: pods::PodIndex::new(client.clone(), trigger_tx.clone()),
        index: index::Index::new(
            client.clone(),
            trigger_tx,
            cm_store,
            freeze_store,
            hpa_store,
        ),
        resolver: scale::Resolver::default(),
        writes: Writes::new(client.clone(), metrics.clone()),
        seen: context::SweepMemory::default(),
        failures: Mutex::new(HashMap::new()),
        refusals: Default::default(),
    });
    let hpa_profiles = profile_store.clone();
    let resync = settings.resync;
    let ticker = futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(resync).await;
        Some(((), ()))
    });
    let ready_task = tokio::spawn(set_ready_when_synced(
        readiness,
        profile_store.clone(),
        lane_store.clone(),
        policy_store.clone(),
    ));
    let pod_trigger = trigger_rx.map(|r: ObjectRef<CapacityProfile>| {
        let mut o = ObjectRef::<DeserializeGuard<CapacityProfile>>::new(&r.name);
        o.namespace = r.namespace;
        o
    });
    let reporter = tokio::spawn(sweep_every(
        resync,
        ctx.clone(),
        (
            profile_store.clone(),
            lane_store.clone(),
            policy_store.clone(),
        ),
        shutdown.clone(),
    ));
    let ctx_for_stop = ctx.clone();
    let run = controller
        .owns_stream(cm_stream)
        .owns_stream(freeze_stream)
        .watches_stream(hpa_stream, move |h: HorizontalPodAutoscaler| {
            index::profiles_of_hpa(&h, &hpa_profiles.state())
        })
        .watches_stream(lane_stream, lane_map)
        .watches_stream(policy_stream, policy_map)
        .watches_stream(peer_stream, peer_map)
        .reconcile_on(pod_trigger)
        .reconcile_all_on(ticker)
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile stream");
            }
        });
    let deadline = shutdown.clone();
    // In-flight reconciles get a grace period to finish their writes;
    // a controller still waiting for its first list when asked to stop
    // is not waited for forever.
    tokio::select! {
        _ = run => {},
        _ = async {
            deadline.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::warn!("controller did not stop within the grace period; stopping it"),
    }
    reporter.abort();
    ready_task.abort();
    stop_watching(&ctx_for_stop, &ns);
}

/// The pod and object indexes stopped, and the signal sources detached
/// from the namespace.
fn stop_watching(ctx: &Context, ns: &Option<String>) {
    ctx.pods.shutdown();
    ctx.index.shutdown();
    for source in &ctx.sources {
        source.detach(ns);
    }
}

type Stores = (
    Store<DeserializeGuard<CapacityProfile>>,
    Store<DeserializeGuard<LaneContract>>,
    Store<DeserializeGuard<DegradationPolicy>>,
);

/// Marks the controller ready once the three stores have synced. Polled:
/// reconciles poll the same stores' readiness, and `wait_until_ready` wakes
/// only the last task that polled it.
async fn set_ready_when_synced(
    readiness: Readiness,
    profiles: Store<DeserializeGuard<CapacityProfile>>,
    lanes: Store<DeserializeGuard<LaneContract>>,
    policies: Store<DeserializeGuard<DegradationPolicy>>,
) {
    while !(context::stores_ready(&lanes, &policies)
        && futures::FutureExt::now_or_never(profiles.wait_until_ready()).is_some())
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    readiness.set(true);
}

/// The sweep, once per resync interval, until `shutdown` resolves.
async fn sweep_every(
    every: Duration,
    ctx: Arc<Context>,
    stores: Stores,
    shutdown: impl Future<Output = ()>,
) {
    let tick = async {
        loop {
            reconcile::sweep::sweep(&ctx, &stores.0, &stores.1, &stores.2).await;
            tokio::time::sleep(every).await;
        }
    };
    tokio::select! {
        _ = tick => {},
        _ = shutdown => {},
    }
}

/// [`Operator::run`] with the operator's fields as arguments (the form
/// `benches/controller_scale.rs` calls).
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    readiness: Readiness,
    extra_sources: Vec<Arc<dyn SignalSource>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let operator = Operator {
        client,
        settings,
        metrics,
        readiness,
        extra_sources,
    };
    operator.run(shutdown).await
}

impl Operator {
    /// Runs with leader election (when enabled) until `shutdown` resolves: waits
    /// for the lease, runs the controllers while leading, stops them if the lease
    /// is lost, and releases the lease on shutdown.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        let Operator {
            client,
            settings,
            metrics,
            readiness,
            ..
        } = &self;
        check_crds(client).await?;
        if !settings.leader_election {
            metrics.leader.set(1);
            return self.run_controllers(shutdown).await;
        }
        let manager =
            kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &settings.lease_name)
                .with_namespace(&settings.lease_namespace)
                .with_identity(&settings.identity)
                .with_field_manager(format!("{FIELD_MANAGER}-lease"))
                .with_duration(settings.lease_duration_seconds)
                .with_grace((settings.lease_duration_seconds / 3).max(1))
                .build()
                .await
                .map_err(|e| Error::Lease(e.to_string()))?;
        let (mut leader, task) = manager.watch().await;
        // A standby is ready (it serves metrics and waits for the lease).
        readiness.set(true);
        let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
        loop {
            tracing::info!(identity = %settings.identity, "waiting for the leader lease");
            // Wait until we lead, or shut down.
            loop {
                if *leader.borrow_and_update() {
                    break;
                }
                tokio::select! {
                    changed = leader.changed() => if changed.is_err() {
                        return Err(Error::Lease("the lease manager stopped".into()));
                    },
                    _ = shutdown.clone() => {
                        drop(leader);
                        let _ = task.await;
                        return Ok(());
                    }
                }
            }
            tracing::info!(identity = %settings.identity, "acquired the leader lease");
            metrics.leader.set(1);
            let mut lost = leader.clone();
            let stop = {
                let shutdown = shutdown.clone();
                async move {
                    tokio::select! {
                        _ = shutdown => {},
                        _ = async { while lost.changed().await.is_ok() { if !*lost.borrow() { break; } } } => {},
                    }
                }
            };
            self.clone().run_controllers(stop).await?;
            metrics.leader.set(0);
            if futures::FutureExt::now_or_never(shutdown.clone()).is_some() {
                tracing::info!("shutting down: releasing the leader lease");
                drop(leader);
                let _ = task.await;
                return Ok(());
            }
            tracing::warn!("lost the leader lease: stopped acting");
        }
    }
}
