//! The TrafficPolicy controllers with GlobalTrafficPolicies, against the real embedded store
//! and a runtime double that records each sandbox's egress policy: a GlobalTrafficPolicy
//! selects sandboxes of every namespace, merges with the namespace's TrafficPolicies in one
//! priority order, re-plans every sandbox when it changes, and gets its `Accepted` condition.
//! Every wait is a poll bounded by a deadline.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use oka_api::{GlobalTrafficPolicy, Sandbox, TrafficPolicy};
use oka_controller::trafficpolicy::{
    AppliedEgress, StoredGlobalPolicy, run_egress_controller, run_global_status_controller,
};
use oka_controller::{Clock, Config};
use oka_runtime_api::{
    EgressAction, EgressPolicy, Runtime, RuntimeError, SandboxId, SandboxSpec as InstanceSpec,
    SandboxStatus,
};
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{CLUSTER_NAMESPACE, Clustered, Preconditions, Store};
use serde_json::json;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

const DEADLINE: Duration = Duration::from_secs(20);

/// Records the last egress policy of each sandbox; nothing else is called here.
#[derive(Debug, Default)]
struct EgressRecorder {
    policies: Mutex<BTreeMap<String, EgressPolicy>>,
}

fn unused() -> RuntimeError {
    RuntimeError::backend(std::io::Error::other("not used by the egress controller"))
}

#[async_trait]
impl Runtime for EgressRecorder {
    async fn ensure(&self, _: &InstanceSpec) -> Result<SandboxStatus, RuntimeError> {
        Err(unused())
    }
    async fn inspect(&self, _: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        Err(unused())
    }
    async fn pause(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unused())
    }
    async fn resume(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unused())
    }
    async fn hibernate(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unused())
    }
    async fn restore(&self, _: &SandboxId) -> Result<SandboxStatus, RuntimeError> {
        Err(unused())
    }
    async fn stop(&self, _: &SandboxId, _: Duration) -> Result<(), RuntimeError> {
        Err(unused())
    }
    async fn delete(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Err(unused())
    }
    async fn list(&self) -> Result<Vec<SandboxStatus>, RuntimeError> {
        Ok(Vec::new())
    }
    async fn connect(&self, _: &SandboxId, _: u16) -> Result<TcpStream, RuntimeError> {
        Err(unused())
    }
    async fn set_egress(&self, id: &SandboxId, policy: &EgressPolicy) -> Result<(), RuntimeError> {
        self.policies.lock().unwrap().insert(id.as_str().to_owned(), policy.clone());
        Ok(())
    }
}

impl EgressRecorder {
    /// The actions of `sandbox`'s rules, in order, then its default; `None` before any policy.
    fn actions(&self, sandbox: &Sandbox) -> Option<Vec<EgressAction>> {
        let id = oka_controller::sandbox::runtime_id(sandbox).unwrap();
        let policies = self.policies.lock().unwrap();
        let policy = policies.get(id.as_str())?;
        let mut actions: Vec<EgressAction> = policy.rules.iter().map(|r| r.action).collect();
        actions.push(policy.default);
        Some(actions)
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running sandbox of `namespace` whose pod template carries `app: agent`.
async fn running_sandbox(store: &EmbeddedStore, namespace: &str) -> Sandbox {
    let sandbox: Sandbox = serde_json::from_value(json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "agent", "namespace": namespace},
        "spec": {"template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "main", "image": "base"}]},
        }},
    }))
    .unwrap();
    let mut created = store.create(namespace, &sandbox).await.unwrap();
    created.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    store.update_status(namespace, &created).await.unwrap()
}

fn global(priority: i32, action: &str) -> StoredGlobalPolicy {
    let policy: GlobalTrafficPolicy = serde_json::from_value(json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "GlobalTrafficPolicy",
        "metadata": {"name": "everyone"},
        "spec": {
            "priority": priority,
            "selector": {"matchLabels": {"app": "agent"}},
            "egress": {"rules": [{"action": action, "to": [{"cidr": "192.0.2.0/24"}]}]},
        },
    }))
    .unwrap();
    Clustered::new(policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_policies_select_every_namespace_in_one_priority_order() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        EmbeddedStore::open(&dir.path().join("s.redb"), EmbeddedOptions::default()).unwrap();
    let runtime = Arc::new(EgressRecorder::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopped.await;
    };
    let (stop_status, status_stopped) = oneshot::channel::<()>();
    let status_stopped = async move {
        let _ = status_stopped.await;
    };
    let egress = tokio::spawn(run_egress_controller(
        store.clone(),
        Arc::clone(&runtime) as Arc<dyn Runtime>,
        Arc::new(AppliedEgress::default()),
        Config::default().workers(2),
        stopped,
    ));
    let status = tokio::spawn(run_global_status_controller(
        store.clone(),
        Config::default(),
        Clock::system(),
        status_stopped,
    ));

    let a = running_sandbox(&store, "team-a").await;
    let b = running_sandbox(&store, "team-b").await;

    // One GlobalTrafficPolicy: both namespaces' sandboxes get its rule.
    store.create(CLUSTER_NAMESPACE, &global(1000, "reject")).await.unwrap();
    let deny = vec![EgressAction::Deny, EgressAction::Allow];
    eventually("the global rule on both sandboxes", || {
        runtime.actions(&a) == Some(deny.clone()) && runtime.actions(&b) == Some(deny.clone())
    })
    .await;

    // A TrafficPolicy of team-a at the same priority goes first; team-b is left as it was.
    let allow: TrafficPolicy = serde_json::from_value(json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "TrafficPolicy",
        "metadata": {"name": "allow-one", "namespace": "team-a"},
        "spec": {
            "priority": 1000,
            "selector": {},
            "egress": {"rules": [{"action": "allow", "to": [{"cidr": "192.0.2.1/32"}]}]},
        },
    }))
    .unwrap();
    store.create("team-a", &allow).await.unwrap();
    let namespaced_first = vec![EgressAction::Allow, EgressAction::Deny, EgressAction::Allow];
    eventually("the namespace's policy first at equal priority", || {
        runtime.actions(&a) == Some(namespaced_first.clone())
            && runtime.actions(&b) == Some(deny.clone())
    })
    .await;

    // Raising the global policy's priority re-plans: its rule goes first.
    let mut current: StoredGlobalPolicy = store.get(CLUSTER_NAMESPACE, "everyone").await.unwrap();
    current.0.spec.0.priority = 2000;
    store.update(CLUSTER_NAMESPACE, &current).await.unwrap();
    let global_first = vec![EgressAction::Deny, EgressAction::Allow, EgressAction::Allow];
    eventually("the higher priority first", || runtime.actions(&a) == Some(global_first.clone()))
        .await;

    // Its Accepted condition.
    let accepted = || async {
        let stored: StoredGlobalPolicy = store.get(CLUSTER_NAMESPACE, "everyone").await.unwrap();
        stored.0.status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Accepted")
                .map(|c| (c.status.clone(), c.reason.clone(), c.observed_generation))
        })
    };
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while accepted().await != Some(("True".into(), "Accepted".into(), Some(2))) {
        assert!(tokio::time::Instant::now() < deadline, "no Accepted: {:?}", accepted().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Deleting it: team-b's sandbox gets its network back, team-a's keeps its own policy.
    store
        .delete::<StoredGlobalPolicy>(CLUSTER_NAMESPACE, "everyone", &Preconditions::default())
        .await
        .unwrap();
    eventually("the global rule gone", || {
        runtime.actions(&a) == Some(vec![EgressAction::Allow, EgressAction::Allow])
            && runtime.actions(&b) == Some(vec![EgressAction::Allow])
    })
    .await;

    let _ = stop.send(());
    let _ = stop_status.send(());
    egress.await.unwrap();
    status.await.unwrap();
}
