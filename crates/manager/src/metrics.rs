//! The manager's Prometheus series, named, typed, labelled and bucketed as the reference's
//! sandbox-manager's (`source="e2b"`, E20 buckets unless noted).
//!
//! The operations (pause, resume, delete, clone, snapshot, the create's responses) are recorded
//! by one middleware over the API's routes ([`record`]), from the matched route and the answer's
//! status, under the namespace of the sandbox the path names (so that the `e2b` and `k8s` series
//! of one sandbox share it), else the caller's; the claim's own figures (attempts, how the sandbox was got, the wait for the
//! gateway's route) are recorded by the create, which alone knows them.
//!
//! The quota families (`QuotaMetrics`, `crate::quota`) register beside these: see
//! [`ManagerMetrics::register`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use oka_metrics::{Registry, Shared, Source, buckets};

pub use oka_metrics::labels::{NamespaceLabels, ResultLabels};

/// `namespace`, `result`, `lock_type`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    /// The pool's namespace.
    pub namespace: String,
    /// `success` or `failure`.
    pub result: &'static str,
    /// How the sandbox was got: `update` (a pool member, one compare-and-swap), `create` (made
    /// for the claim: no stock, or a snapshot), `unknown` (none was got).
    pub lock_type: &'static str,
}

/// `namespace`, `type`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The sandbox's namespace.
    pub namespace: String,
    /// Always `sync_with_peers` (the reference's; here: the wait for the gateway's route).
    pub r#type: &'static str,
}

/// `namespace`, `type`, `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteResultLabels {
    /// The sandbox's namespace.
    pub namespace: String,
    /// `sync_with_peers`.
    pub r#type: &'static str,
    /// `success`, or `failure` when the route did not appear in time.
    pub result: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn e20() -> Histogram {
    Histogram::new(buckets::e20())
}

fn l11() -> Histogram {
    Histogram::new(buckets::l11())
}

/// The manager's series.
#[derive(Debug)]
pub struct ManagerMetrics {
    shared: Shared,
    pause_responses: Family<ResultLabels, Counter>,
    resume_responses: Family<ResultLabels, Counter>,
    delete_duration: Histograms<NamespaceLabels>,
    delete_responses: Family<ResultLabels, Counter>,
    recycle_responses: Family<ResultLabels, Counter>,
    claim_creation_responses: Family<ResultLabels, Counter>,
    claim_total: Family<ClaimLabels, Counter>,
    claim_retries: Histograms<NamespaceLabels>,
    clone_duration: Histograms<NamespaceLabels>,
    clone_total: Family<ResultLabels, Counter>,
    route_sync_duration: Histograms<RouteLabels>,
    route_sync_total: Family<RouteResultLabels, Counter>,
    get_claimed_fallback: Family<ReasonLabels, Counter>,
    snapshot_duration: Histograms<NamespaceLabels>,
    snapshot_total: Family<ResultLabels, Counter>,
    peers: Gauge,
}

/// `namespace`, `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The sandbox's namespace.
    pub namespace: String,
    /// Why.
    pub reason: &'static str,
}

/// An operation the middleware times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Create,
    Pause,
    Resume,
    Delete,
    Clone,
    Snapshot,
}

impl Default for ManagerMetrics {
    fn default() -> Self {
        Self::new(Shared::default())
    }
}

impl ManagerMetrics {
    /// The manager's series, recording the shared families into `shared`.
    pub fn new(shared: Shared) -> Self {
        Self {
            shared,
            pause_responses: Family::default(),
            resume_responses: Family::default(),
            delete_duration: Family::new_with_constructor(e20),
            delete_responses: Family::default(),
            recycle_responses: Family::default(),
            claim_creation_responses: Family::default(),
            claim_total: Family::default(),
            claim_retries: Family::new_with_constructor(l11),
            clone_duration: Family::new_with_constructor(e20),
            clone_total: Family::default(),
            route_sync_duration: Family::new_with_constructor(e20),
            route_sync_total: Family::default(),
            get_claimed_fallback: Family::default(),
            snapshot_duration: Family::new_with_constructor(e20),
            snapshot_total: Family::default(),
            peers: Gauge::default(),
        }
    }

    /// Registers the manager's families into `registry` (the shared ones are registered by
    /// whoever made them). The quota families register next to these, into the same registry:
    /// `QuotaMetrics::register(registry)` from `crate::quota`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "sandbox_snapshot_duration_seconds",
            "Time to take an E2B snapshot",
            self.snapshot_duration.clone(),
        );
        registry.register(
            "sandbox_snapshot",
            "E2B snapshots, by result",
            self.snapshot_total.clone(),
        );
        registry.register(
            "sandbox_peers",
            "Peers the route table is synchronised with (0: one machine)",
            self.peers.clone(),
        );
        let e2b = registry.sub_registry_with_label(("source".into(), Source::E2b.as_str().into()));
        e2b.register(
            "sandbox_pause_responses",
            "Pause calls, by result",
            self.pause_responses.clone(),
        );
        e2b.register(
            "sandbox_resume_responses",
            "Resume calls, by result",
            self.resume_responses.clone(),
        );
        e2b.register(
            "sandbox_delete_duration_seconds",
            "Time to kill a sandbox",
            self.delete_duration.clone(),
        );
        e2b.register(
            "sandbox_delete_responses",
            "Kill calls, by result",
            self.delete_responses.clone(),
        );
        e2b.register(
            "sandbox_recycle_responses",
            "Recycle triggers, by result (oka kills; none today)",
            self.recycle_responses.clone(),
        );
        e2b.register(
            "sandbox_claim_creation_responses",
            "Claim-based creates, by result",
            self.claim_creation_responses.clone(),
        );
        e2b.register("sandbox_claim", "Claims, by result and lock type", self.claim_total.clone());
        e2b.register(
            "sandbox_claim_retries",
            "Retries (lost races) of a successful claim",
            self.claim_retries.clone(),
        );
        e2b.register(
            "sandbox_clone_duration_seconds",
            "Time to fork a sandbox",
            self.clone_duration.clone(),
        );
        e2b.register("sandbox_clone", "Forks, by result", self.clone_total.clone());
        e2b.register(
            "sandbox_route_sync_duration_seconds",
            "Time until the gateway routes a new sandbox",
            self.route_sync_duration.clone(),
        );
        e2b.register(
            "sandbox_route_sync",
            "Waits for the gateway's route, by result",
            self.route_sync_total.clone(),
        );
        e2b.register(
            "sandbox_get_claimed_fallback",
            "Lookups of a claimed sandbox that fell back to the store",
            self.get_claimed_fallback.clone(),
        );
    }

    /// A claim-based create got its sandbox (`created`: made for it) after `attempts` tries in
    /// `took`, or (`None`) got none.
    pub fn claimed(&self, namespace: &str, outcome: Option<(bool, u32)>, took: Duration) {
        let namespace = namespace.to_owned();
        let (result, lock_type) = match outcome {
            Some((true, _)) => ("success", "create"),
            Some((false, _)) => ("success", "update"),
            None => ("failure", "unknown"),
        };
        if let Some((_, attempts)) = outcome {
            self.shared.claim_duration.observe(Source::E2b, &namespace, took.as_secs_f64());
            let labels = NamespaceLabels { namespace: namespace.clone() };
            self.claim_retries
                .get_or_create(&labels)
                .observe(f64::from(attempts.saturating_sub(1)));
        }
        self.claim_total.get_or_create(&ClaimLabels { namespace, result, lock_type }).inc();
    }

    /// A create waited `took` for the gateway's route; `routed` says whether it came.
    pub fn route_synced(&self, namespace: &str, routed: bool, took: Duration) {
        let kind = "sync_with_peers";
        let labels = RouteLabels { namespace: namespace.to_owned(), r#type: kind };
        self.route_sync_duration.get_or_create(&labels).observe(took.as_secs_f64());
        let result = if routed { "success" } else { "failure" };
        let labels = RouteResultLabels { namespace: namespace.to_owned(), r#type: kind, result };
        self.route_sync_total.get_or_create(&labels).inc();
    }

    fn finished(&self, operation: Operation, namespace: String, ok: bool, took: Duration) {
        let result = if ok { "success" } else { "failure" };
        let seconds = took.as_secs_f64();
        let labels = ResultLabels { namespace: namespace.clone(), result };
        match operation {
            Operation::Create => {
                self.claim_creation_responses.get_or_create(&labels).inc();
            }
            Operation::Pause => {
                if ok {
                    self.shared.pause_duration.observe(Source::E2b, &namespace, seconds);
                }
                self.pause_responses.get_or_create(&labels).inc();
            }
            Operation::Resume => {
                if ok {
                    self.shared.resume_duration.observe(Source::E2b, &namespace, seconds);
                }
                self.resume_responses.get_or_create(&labels).inc();
            }
            Operation::Delete => {
                if ok {
                    self.delete_duration
                        .get_or_create(&NamespaceLabels { namespace })
                        .observe(seconds);
                }
                self.delete_responses.get_or_create(&labels).inc();
            }
            Operation::Clone => {
                if ok {
                    self.clone_duration
                        .get_or_create(&NamespaceLabels { namespace })
                        .observe(seconds);
                }
                self.clone_total.get_or_create(&labels).inc();
            }
            Operation::Snapshot => {
                if ok {
                    self.snapshot_duration
                        .get_or_create(&NamespaceLabels { namespace })
                        .observe(seconds);
                }
                self.snapshot_total.get_or_create(&labels).inc();
            }
        }
    }
}

/// The operation a request is, from its method and matched route (with or without the
/// `/kruise` prefix).
fn operation(method: &http::Method, route: &str) -> Option<Operation> {
    let route = route.strip_prefix(crate::api::KRUISE_PREFIX).unwrap_or(route);
    match (method.as_str(), route) {
        ("POST", "/sandboxes" | "/v2/sandboxes") => Some(Operation::Create),
        ("POST", "/sandboxes/{id}/pause") => Some(Operation::Pause),
        ("POST", "/sandboxes/{id}/resume") => Some(Operation::Resume),
        ("DELETE", "/sandboxes/{id}") => Some(Operation::Delete),
        ("POST", "/sandboxes/{id}/fork") => Some(Operation::Clone),
        ("POST", "/sandboxes/{id}/snapshots") => Some(Operation::Snapshot),
        _ => None,
    }
}

/// What [`record`] needs: the series, where the API's sandboxes are looked up, and the
/// namespace of callers that have none (the admin team's).
#[derive(Debug, Clone)]
pub struct Recording {
    /// The manager's series.
    pub metrics: Arc<ManagerMetrics>,
    /// The claimed sandboxes, by public ID.
    pub index: Arc<crate::index::Index>,
    /// The namespace of callers without one.
    pub fallback: Arc<str>,
}

/// The segment of `path` where `route` has `{id}`.
fn path_id<'a>(route: &str, path: &'a str) -> Option<&'a str> {
    let at = route.split('/').position(|segment| segment == "{id}")?;
    path.split('/').nth(at)
}

/// The middleware that times the operations; other requests pass untouched. The namespace is
/// that of the sandbox the path names, looked up before the call (a kill removes it), else the
/// caller's, else [`Recording::fallback`].
pub async fn record(State(recording): State<Recording>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let Some((operation, route)) = route.and_then(|r| Some((operation(request.method(), &r)?, r)))
    else {
        return next.run(request).await;
    };
    let sandbox_namespace = path_id(&route, request.uri().path())
        .and_then(|id| recording.index.by_id(id))
        .and_then(|sandbox| sandbox.metadata.namespace.clone());
    let namespace = sandbox_namespace
        .or_else(|| {
            request.extensions().get::<crate::api::User>().and_then(|user| user.namespace.clone())
        })
        .unwrap_or_else(|| recording.fallback.to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    let ok = response.status().is_success();
    recording.metrics.finished(operation, namespace, ok, started.elapsed());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_id_is_found_where_the_route_names_it() {
        let route = "/sandboxes/{id}/pause";
        assert_eq!(path_id(route, "/sandboxes/i123/pause"), Some("i123"));
        let kruise = "/kruise/api/sandboxes/{id}";
        assert_eq!(path_id(kruise, "/kruise/api/sandboxes/i9"), Some("i9"));
        assert_eq!(path_id("/sandboxes", "/sandboxes"), None);
    }
}
