//! The sandbox planner: a table of lifecycle cases, the details of what each transition
//! writes, the template conversion, and properties over random sandboxes and runtime states
//! (fixed point, timer deadlines, convergence against a model runtime).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{
    Container, EnvVar as KubeEnvVar, EnvVarSource, ObjectFieldSelector, PodSpec,
    ResourceRequirements, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use oka_api::common::{PauseStrategy, SandboxTemplateRef};
use oka_api::conditions::find;
use oka_runtime_api::{RootFs, SpecError};
use proptest::prelude::*;

use super::*;

static NO_INPUTS: inputs::PodInputs = inputs::PodInputs {
    config_maps: std::collections::BTreeMap::new(),
    secrets: std::collections::BTreeMap::new(),
    node_name: None,
};

/// 2026-03-01T12:00:00Z, a whole second.
fn t0() -> Timestamp {
    Timestamp::from_second(1_772_366_400).unwrap()
}

fn at(secs: i64) -> Timestamp {
    t0().checked_add(SignedDuration::from_secs(secs)).unwrap()
}

const NODE: &str = "node-1";

fn pod_template(command: &[&str]) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
    }
}

/// A sandbox fixture: `sbx().phase(..).paused().strategy(..)`. Built with the finalizer,
/// generation 1, and a status whose `observedGeneration` and `updateRevision` are current, so
/// a case shows only what its own rule changes.
#[derive(Clone, Debug)]
struct Fx {
    sandbox: Sandbox,
    keep_revision: bool,
}

fn sbx() -> Fx {
    let mut sandbox = Sandbox::test().name("sbx").build();
    sandbox.metadata.generation = Some(1);
    sandbox.metadata.resource_version = Some("10".into());
    sandbox.metadata.finalizers = Some(vec![finalizers::SANDBOX.into()]);
    sandbox.spec.template = Some(pod_template(&["sleep", "infinity"]));
    sandbox.status = None;
    Fx { sandbox, keep_revision: false }
}

impl Fx {
    fn status(&mut self) -> &mut SandboxStatus {
        self.sandbox.status.get_or_insert_with(Default::default)
    }
    fn phase(mut self, phase: SandboxPhase) -> Self {
        self.status().phase = Some(phase);
        self
    }
    fn cond(self, type_: &str, status: &str, reason: &str) -> Self {
        self.cond_with(type_, status, reason, "")
    }
    fn cond_with(mut self, type_: &str, status: &str, reason: &str, message: &str) -> Self {
        let list = self.status().conditions.get_or_insert_with(Vec::new);
        list.retain(|c| c.type_ != type_);
        list.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(at(-100)),
            observed_generation: None,
        });
        self
    }
    fn ready(self) -> Self {
        self.cond(READY, TRUE, ready_reason::POD_READY)
    }
    fn running(self) -> Self {
        self.phase(SandboxPhase::Running).ready().node()
    }
    fn node(mut self) -> Self {
        let id = runtime_id(&self.sandbox).unwrap().to_string();
        let status = self.status();
        status.node_name = Some(NODE.into());
        status.pod_info =
            Some(PodInfo { node_name: Some(NODE.into()), pod_uid: Some(id), ..PodInfo::default() });
        self
    }
    fn pausing(self) -> Self {
        self.phase(SandboxPhase::Paused)
            .cond_with(READY, FALSE, ready_reason::POD_READY, "Sandbox is paused")
            .cond(PAUSED, FALSE, paused_reason::PENDING)
    }
    fn paused_done(self, reason: &str) -> Self {
        self.phase(SandboxPhase::Paused)
            .cond_with(READY, FALSE, ready_reason::POD_READY, "Sandbox is paused")
            .cond(PAUSED, TRUE, reason)
    }
    fn paused(mut self) -> Self {
        self.sandbox.spec.paused = Some(true);
        self
    }
    fn unpaused(mut self) -> Self {
        self.sandbox.spec.paused = Some(false);
        self
    }
    fn strategy(mut self, mode: PauseMode) -> Self {
        self.sandbox.spec.pause_strategy = match mode {
            PauseMode::Freeze => None,
            PauseMode::Hibernate => Some(PauseStrategy {
                type_: Some(PauseStrategyType::Hibernate),
                ..Default::default()
            }),
            PauseMode::Stop => {
                Some(PauseStrategy { type_: Some(PauseStrategyType::Stop), ..Default::default() })
            }
        };
        self
    }
    fn no_finalizer(mut self) -> Self {
        self.sandbox.metadata.finalizers = None;
        self
    }
    fn deleting(mut self) -> Self {
        self.sandbox.metadata.deletion_timestamp = Some(Time(at(-1)));
        self
    }
    fn shutdown_at(mut self, at: Timestamp) -> Self {
        self.sandbox.spec.shutdown_time = Some(Time(at));
        self
    }
    fn pause_at(mut self, at: Timestamp) -> Self {
        self.sandbox.spec.pause_time = Some(Time(at));
        self
    }
    fn annotation(mut self, key: &str, value: &str) -> Self {
        self.sandbox
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }
    fn template(mut self, template: Option<PodTemplateSpec>) -> Self {
        self.sandbox.spec.template = template;
        self
    }
    fn template_ref(mut self, name: &str) -> Self {
        self.sandbox.spec.template = None;
        self.sandbox.spec.template_ref =
            Some(SandboxTemplateRef { name: name.into(), ..Default::default() });
        self
    }
    fn old_revision(mut self) -> Self {
        self.status().update_revision = Some("old".into());
        self.keep_revision = true;
        self
    }
    fn build(self) -> Sandbox {
        let mut sandbox = self.sandbox;
        let revision = sandbox_revision(&sandbox.spec);
        if let Some(status) = sandbox.status.as_mut() {
            status.observed_generation = Some(1);
            if !self.keep_revision {
                status.update_revision = Some(revision);
            }
        }
        sandbox
    }
}

fn instance(sandbox: &Sandbox, state: SandboxState, last_exit: Option<ExitInfo>) -> InstanceStatus {
    InstanceStatus {
        id: runtime_id(sandbox).unwrap(),
        state,
        pid: matches!(state, SandboxState::Running | SandboxState::Paused).then_some(42),
        started_at: None,
        last_exit,
        usage: None,
        address: None,
    }
}

fn observe<'a>(sandbox: &'a Sandbox, rt: Option<&'a InstanceStatus>) -> SandboxObservation<'a> {
    SandboxObservation {
        runtime: rt,
        template: TemplateSource::of(sandbox, None),
        image: &ImageState::NotNeeded,
        node_name: NODE,
        auto_pause: sandbox.spec.auto_pause_policy.as_ref(),
        probes: sandbox.spec.probes.as_deref().unwrap_or_default(),
        auto_pause_budget: autopause::Budget::default(),
        inputs: &NO_INPUTS,
    }
}

fn plan_at(sandbox: &Sandbox, rt: Option<&InstanceStatus>, now: Timestamp) -> Plan<SandboxAction> {
    plan_sandbox(sandbox, &observe(sandbox, rt), now).expect("plannable")
}

/// What a plan does, in short: `+finalizer status:Running rt:pause`.
fn summary(plan: &Plan<SandboxAction>) -> String {
    plan.actions
        .iter()
        .map(|action| match action {
            SandboxAction::AddFinalizer => "+finalizer".to_owned(),
            SandboxAction::RemoveFinalizer => "-finalizer".to_owned(),
            SandboxAction::SetPaused { until: None, .. } => "set-paused".to_owned(),
            SandboxAction::SetPaused { until: Some(_), .. } => "set-paused-until".to_owned(),
            SandboxAction::AutoResume => "auto-resume".to_owned(),
            SandboxAction::ClearPausedBy => "clear-paused-by".to_owned(),
            SandboxAction::Delete => "delete".to_owned(),
            SandboxAction::SetShutdown(_) => "set-shutdown".to_owned(),
            SandboxAction::ReturnToPool => "return-to-pool".to_owned(),
            SandboxAction::UpdateStatus(status) => {
                format!("status:{}", status.phase.as_ref().map_or("-", SandboxPhase::as_str))
            }
            SandboxAction::MarkRestarted(_) => "mark-restarted".to_owned(),
            SandboxAction::Initialize => "initialize".to_owned(),
            SandboxAction::CheckpointRestore(_) => "checkpoint-restore".to_owned(),
            SandboxAction::RunHook { pre: true } => "hook:pre".to_owned(),
            SandboxAction::RunHook { pre: false } => "hook:post".to_owned(),
            SandboxAction::UpdateInPlace { .. } => "update-in-place".to_owned(),
            SandboxAction::PullImage { .. } => "pull".to_owned(),
            SandboxAction::Runtime(RuntimeAction::Restart { .. }) => "rt:restart".to_owned(),
            SandboxAction::Runtime(verb) => format!("rt:{}", verb.operation()),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

use PauseMode::{Freeze, Hibernate, Stop};
use SandboxPhase as P;
use SandboxState as S;

#[test]
fn lifecycle_table() {
    let exit = |code| Some(ExitInfo::Code(code));
    // (name, sandbox, runtime state and exit (None: not inspected), now, expected)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Fx, Option<(S, Option<ExitInfo>)>, Timestamp, &str)> = vec![
        (
            "a new sandbox gets the finalizer first, then Pending, then its instance",
            sbx().no_finalizer(),
            Some((S::Gone, None)),
            t0(),
            "+finalizer status:Pending rt:ensure",
        ),
        (
            "a pending sandbox without an instance ensures it",
            sbx().phase(P::Pending),
            Some((S::Gone, None)),
            t0(),
            "rt:ensure",
        ),
        (
            "a pending sandbox whose instance runs becomes Running",
            sbx().phase(P::Pending),
            Some((S::Running, None)),
            t0(),
            "status:Running",
        ),
        (
            "a pending sandbox asked to pause runs first, then pauses",
            sbx().phase(P::Pending).paused(),
            Some((S::Running, None)),
            t0(),
            "status:Paused rt:pause",
        ),
        (
            "a pending sandbox whose command exited 0 succeeded",
            sbx().phase(P::Pending),
            Some((S::Stopped, exit(0))),
            t0(),
            "status:Succeeded",
        ),
        (
            "a pending sandbox whose command exited 1 failed",
            sbx().phase(P::Pending),
            Some((S::Stopped, exit(1))),
            t0(),
            "status:Failed",
        ),
        (
            "a pending sandbox whose instance never started is started",
            sbx().phase(P::Pending),
            Some((S::Stopped, None)),
            t0(),
            "rt:ensure",
        ),
        (
            "a pending sandbox with a frozen instance thaws it",
            sbx().phase(P::Pending),
            Some((S::Paused, None)),
            t0(),
            "rt:resume",
        ),
        (
            "a pending sandbox with a hibernated instance restores it",
            sbx().phase(P::Pending),
            Some((S::Hibernated, None)),
            t0(),
            "rt:restore",
        ),
        (
            "a pending sandbox not inspected only records Pending",
            sbx(),
            None,
            t0(),
            "status:Pending",
        ),
        (
            "a sandbox with neither template nor templateRef is ignored",
            sbx().no_finalizer().template(None),
            Some((S::Gone, None)),
            t0(),
            "",
        ),
        (
            "a missing SandboxTemplate is reported, nothing is run",
            sbx().phase(P::Pending).template_ref("gone"),
            Some((S::Gone, None)),
            t0(),
            "status:Pending",
        ),
        (
            "a running sandbox whose instance runs is left alone",
            sbx().running(),
            Some((S::Running, None)),
            t0(),
            "",
        ),
        (
            "a running sandbox whose instance vanished failed",
            sbx().running(),
            Some((S::Gone, None)),
            t0(),
            "status:Failed",
        ),
        (
            "a running sandbox whose command was killed failed",
            sbx().running(),
            Some((S::Stopped, Some(ExitInfo::Signal(9)))),
            t0(),
            "status:Failed",
        ),
        (
            "a running sandbox whose instance was frozen behind our back is thawed",
            sbx().running(),
            Some((S::Paused, None)),
            t0(),
            "status:Running rt:resume",
        ),
        (
            "a running sandbox whose instance hibernated is restored",
            sbx().running(),
            Some((S::Hibernated, None)),
            t0(),
            "status:Running rt:restore",
        ),
        (
            "a running sandbox whose instance stopped is started again",
            sbx().running(),
            Some((S::Stopped, None)),
            t0(),
            "status:Running rt:ensure",
        ),
        (
            "paused without a strategy freezes",
            sbx().running().paused(),
            Some((S::Running, None)),
            t0(),
            "status:Paused rt:pause",
        ),
        (
            "paused with Hibernate hibernates",
            sbx().running().paused().strategy(Hibernate),
            Some((S::Running, None)),
            t0(),
            "status:Paused rt:hibernate",
        ),
        (
            "paused with Stop stops",
            sbx().running().paused().strategy(Stop),
            Some((S::Running, None)),
            t0(),
            "status:Paused rt:stop",
        ),
        (
            "a freeze completes when the runtime reports the instance frozen",
            sbx().pausing().paused(),
            Some((S::Paused, None)),
            t0(),
            "status:Paused",
        ),
        (
            "a freeze not done yet is asked again",
            sbx().pausing().paused(),
            Some((S::Running, None)),
            t0(),
            "rt:pause",
        ),
        (
            "a hibernation completes when the runtime reports it",
            sbx().pausing().paused().strategy(Hibernate),
            Some((S::Hibernated, None)),
            t0(),
            "status:Paused",
        ),
        (
            "a hibernation of a frozen instance goes on",
            sbx().pausing().paused().strategy(Hibernate),
            Some((S::Paused, None)),
            t0(),
            "rt:hibernate",
        ),
        (
            "a stop completes when the runtime reports the instance stopped",
            sbx().pausing().paused().strategy(Stop),
            Some((S::Stopped, Some(ExitInfo::Signal(15)))),
            t0(),
            "status:Paused",
        ),
        (
            "a pausing sandbox whose instance vanished failed",
            sbx().pausing().paused(),
            Some((S::Gone, None)),
            t0(),
            "status:Failed",
        ),
        (
            "a paused sandbox stays paused",
            sbx().paused_done(FREEZE_PAUSE_SUCCEED).paused(),
            Some((S::Paused, None)),
            t0(),
            "",
        ),
        (
            "a paused sandbox running again behind our back is paused again",
            sbx().paused_done(FREEZE_PAUSE_SUCCEED).paused(),
            Some((S::Running, None)),
            t0(),
            "status:Paused rt:pause",
        ),
        (
            "a paused sandbox whose strategy became Stop is stopped",
            sbx().paused_done(FREEZE_PAUSE_SUCCEED).paused().strategy(Stop),
            Some((S::Paused, None)),
            t0(),
            "status:Paused rt:stop",
        ),
        (
            "unpausing a frozen sandbox thaws it",
            sbx().paused_done(FREEZE_PAUSE_SUCCEED).unpaused(),
            Some((S::Paused, None)),
            t0(),
            "status:Resuming rt:resume",
        ),
        (
            "unpausing a hibernated sandbox restores it",
            sbx().paused_done(paused_reason::SNAPSHOT_PAUSE_SUCCEED).unpaused().strategy(Hibernate),
            Some((S::Hibernated, None)),
            t0(),
            "status:Resuming rt:restore",
        ),
        (
            "unpausing a stopped sandbox starts it again",
            sbx().paused_done(paused_reason::STOP_PAUSE_SUCCEED).unpaused().strategy(Stop),
            Some((S::Stopped, Some(ExitInfo::Signal(15)))),
            t0(),
            "status:Resuming rt:ensure",
        ),
        (
            "unpausing before the pause completed finishes the pause first",
            sbx().pausing().unpaused(),
            Some((S::Running, None)),
            t0(),
            "rt:pause",
        ),
        (
            "a resuming sandbox whose instance runs is Running",
            sbx().phase(P::Resuming).cond(RESUMED, FALSE, resumed_reason::CREATE_POD).cond(
                PAUSED,
                TRUE,
                FREEZE_PAUSE_SUCCEED,
            ),
            Some((S::Running, None)),
            t0(),
            "status:Running",
        ),
        (
            "a resuming sandbox whose instance vanished failed",
            sbx().phase(P::Resuming),
            Some((S::Gone, None)),
            t0(),
            "status:Failed",
        ),
        (
            "a deleting sandbox deletes its instance, then its finalizer",
            sbx().running().deleting(),
            None,
            t0(),
            "rt:delete -finalizer",
        ),
        (
            "a deleting sandbox without the finalizer is not ours to finish",
            sbx().running().deleting().no_finalizer(),
            None,
            t0(),
            "",
        ),
        (
            "a reached shutdownTime deletes the sandbox",
            sbx().running().shutdown_at(at(-1)),
            Some((S::Running, None)),
            t0(),
            "delete",
        ),
        (
            "a shutdownTime reached right now deletes the sandbox",
            sbx().running().shutdown_at(t0()),
            Some((S::Running, None)),
            t0(),
            "delete",
        ),
        (
            "a reached pauseTime pauses the sandbox",
            sbx().running().pause_at(at(-1)),
            Some((S::Running, None)),
            t0(),
            "set-paused",
        ),
        (
            "pauseTime with retention moves the deadlines",
            sbx()
                .running()
                .pause_at(at(-1))
                .shutdown_at(at(60))
                .annotation(annotations::RESERVE_PAUSED_SANDBOX_DURATION, "1h"),
            Some((S::Running, None)),
            t0(),
            "set-paused-until",
        ),
        (
            "retention defers a reached shutdown until the sandbox is paused",
            sbx()
                .running()
                .pause_at(at(-10))
                .shutdown_at(at(-1))
                .annotation(annotations::RESERVE_PAUSED_SANDBOX_DURATION, "forever"),
            Some((S::Running, None)),
            t0(),
            "set-paused-until",
        ),
        (
            "a pauseTime of a paused sandbox does nothing",
            sbx().paused_done(FREEZE_PAUSE_SUCCEED).paused().pause_at(at(-1)),
            Some((S::Paused, None)),
            t0(),
            "",
        ),
        ("a failed sandbox is terminal", sbx().phase(P::Failed), None, t0(), ""),
        (
            "a failed sandbox is still deleted at its shutdownTime",
            sbx().phase(P::Failed).shutdown_at(at(-1)),
            None,
            t0(),
            "delete",
        ),
        (
            "an upgrading sandbox without a step starts at PreUpgrade and replaces its instance",
            sbx().phase(P::Upgrading),
            Some((S::Running, None)),
            t0(),
            "status:Upgrading rt:delete",
        ),
    ];
    for (name, fixture, rt, now, expected) in cases {
        let sandbox = fixture.build();
        let rt = rt.map(|(state, exit)| instance(&sandbox, state, exit));
        assert_eq!(summary(&plan_at(&sandbox, rt.as_ref(), now)), expected, "{name}");
    }
}

fn written_status(plan: &Plan<SandboxAction>) -> &SandboxStatus {
    plan.actions
        .iter()
        .find_map(|a| if let SandboxAction::UpdateStatus(s) = a { Some(s.as_ref()) } else { None })
        .unwrap_or_else(|| panic!("no status in {plan:?}"))
}

fn condition<'a>(status: &'a SandboxStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
    let c = find(status.conditions.as_deref().unwrap_or_default(), type_)
        .unwrap_or_else(|| panic!("no {type_} in {status:?}"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

#[test]
fn running_records_ready_the_node_and_the_instance() {
    let sandbox = sbx().phase(P::Pending).build();
    let rt = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&rt), at(0));
    let status = written_status(&plan);
    assert_eq!(status.phase, Some(P::Running));
    assert_eq!(condition(status, READY), (TRUE, ready_reason::POD_READY, ""));
    assert_eq!(status.node_name.as_deref(), Some(NODE));
    let info = status.pod_info.as_ref().unwrap();
    assert_eq!(info.node_name.as_deref(), Some(NODE));
    assert_eq!(info.pod_uid.as_deref(), Some(rt.id.as_str()));
    assert_eq!(status.sandbox_ip, None);
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.update_revision, Some(sandbox_revision(&sandbox.spec)));
    let ready = find(status.conditions.as_deref().unwrap(), READY).unwrap();
    assert_eq!(ready.last_transition_time, Time(t0()));
}

#[test]
fn a_restart_request_restarts_a_running_sandbox_once() {
    let mut sandbox = sbx().phase(P::Running).cond(READY, TRUE, ready_reason::POD_READY).build();
    let ready = plan_at(&sandbox, Some(&instance(&sandbox, S::Running, None)), at(0));
    let running = summary(&ready);
    let requested = "2026-12-05T10:00:00Z";
    let annotations = sandbox.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(annotations::RESTART_REQUESTED_AT.into(), requested.into());
    assert_eq!(restart_requested(&sandbox), Some(requested));
    let plan = plan_at(&sandbox, Some(&instance(&sandbox, S::Running, None)), at(0));
    let marked =
        plan.actions.iter().position(|a| *a == SandboxAction::MarkRestarted(requested.into()));
    let restart = plan
        .actions
        .iter()
        .position(|a| matches!(a, SandboxAction::Runtime(RuntimeAction::Restart { .. })));
    // Recorded first: a crash between the two loses the restart rather than repeating it.
    assert!(marked.unwrap() < restart.unwrap(), "{}", summary(&plan));
    // Once recorded, the same request does nothing more.
    let annotations = sandbox.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(annotations::RESTARTED_AT.into(), requested.into());
    assert_eq!(restart_requested(&sandbox), None);
    let plan = plan_at(&sandbox, Some(&instance(&sandbox, S::Running, None)), at(0));
    assert_eq!(summary(&plan), running);
    // A paused sandbox is not restarted; its request waits for it to run again.
    let annotations = sandbox.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(annotations::RESTART_REQUESTED_AT.into(), "2026-12-05T11:00:00Z".into());
    sandbox.spec.paused = Some(true);
    let plan = plan_at(&sandbox, Some(&instance(&sandbox, S::Running, None)), at(0));
    assert!(!summary(&plan).contains("restart"), "{}", summary(&plan));
}

#[test]
fn new_processes_of_an_initialised_sandbox_get_its_init_again() {
    let mut sandbox = sbx().phase(P::Running).cond(READY, TRUE, ready_reason::POD_READY).build();
    let annotations = sandbox.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(
        annotations::INIT_RUNTIME_REQUEST.into(),
        r#"{"envVars":{"A":"b"},"accessToken":"t"}"#.into(),
    );
    annotations.insert(annotations::RESTART_REQUESTED_AT.into(), "2026-12-05T10:00:00Z".into());
    // The restart marks the replay pending before it ends the processes.
    let plan = plan_at(&sandbox, Some(&instance(&sandbox, S::Running, None)), at(0));
    assert_eq!(summary(&plan), "status:Running mark-restarted rt:restart");
    let status = written_status(&plan);
    assert_eq!(
        condition(status, RUNTIME_INITIALIZED),
        (FALSE, runtime_initialized_reason::PENDING, "Waiting for pod ready before initialization")
    );
    // Once the new processes run: the replay, and nothing else.
    let restarted = apply_writes(&sandbox, &plan).unwrap();
    let plan = plan_at(&restarted, Some(&instance(&restarted, S::Running, None)), at(1));
    assert_eq!(summary(&plan), "initialize");
    // A sandbox never initialised (a pool member) has nothing to replay.
    let mut member =
        sbx().phase(P::Paused).cond(PAUSED, TRUE, paused_reason::STOP_PAUSE_SUCCEED).build();
    member.spec.pause_strategy = Some(PauseStrategy {
        type_: Some(oka_api::common::PauseStrategyType::Stop),
        ..Default::default()
    });
    let plan = plan_at(&member, Some(&instance(&member, S::Stopped, None)), at(0));
    assert!(!summary(&plan).contains("initialize"), "{}", summary(&plan));
    let resumed = apply_writes(&member, &plan).unwrap();
    let status = resumed.status.as_ref().unwrap();
    assert!(find(status.conditions.as_deref().unwrap_or_default(), RUNTIME_INITIALIZED).is_none());
}

#[test]
fn a_recreate_upgrade_replaces_the_instance_with_the_new_template() {
    let mut sandbox = sbx().phase(P::Pending).build();
    let rt = instance(&sandbox, S::Running, None);
    sandbox = apply_writes(&sandbox, &plan_at(&sandbox, Some(&rt), at(0))).unwrap();
    assert_eq!(sandbox.phase(), Some(&P::Running));
    // The template changes, with a Recreate policy (what a SandboxUpdateOps writes).
    sandbox.spec.template = Some(pod_template(&["sleep", "1000"]));
    sandbox.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
        type_: Some(oka_api::common::UpgradePolicyType::Recreate),
    });
    let plan = plan_at(&sandbox, Some(&rt), at(10));
    assert_eq!(summary(&plan), "status:Upgrading rt:delete");
    let status = written_status(&plan);
    assert_eq!(condition(status, UPGRADING).1, upgrading_reason::UPGRADE_POD);
    assert_eq!(condition(status, READY), (FALSE, ready_reason::UPGRADING, "sandbox is upgrading"));
    sandbox = apply_writes(&sandbox, &plan).unwrap();
    // The old instance is gone: the new one is made from the new template.
    let gone = instance(&sandbox, S::Gone, None);
    let plan = plan_at(&sandbox, Some(&gone), at(11));
    let Some(SandboxAction::Runtime(RuntimeAction::Ensure(spec))) = plan.actions.last() else {
        panic!("{}", summary(&plan));
    };
    assert_eq!(spec.process.command, ["sleep", "1000"]);
    sandbox = apply_writes(&sandbox, &plan).unwrap_or(sandbox);
    // The new instance runs: the upgrade succeeds, Running again at the new revision.
    let new = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&new), at(12));
    let status = written_status(&plan);
    assert_eq!(status.phase, Some(P::Running));
    assert_eq!(condition(status, UPGRADING), (TRUE, upgrading_reason::SUCCEEDED, ""));
    assert_eq!(condition(status, READY).0, TRUE);
    assert_eq!(status.update_revision, Some(sandbox_revision(&sandbox.spec)));
    // And nothing more after it.
    let done = apply_writes(&sandbox, &plan).unwrap();
    assert_eq!(summary(&plan_at(&done, Some(&new), at(13))), "");
}

#[test]
fn a_template_change_without_a_policy_is_made_in_place() {
    let mut sandbox = sbx().phase(P::Pending).build();
    let rt = instance(&sandbox, S::Running, None);
    sandbox = apply_writes(&sandbox, &plan_at(&sandbox, Some(&rt), at(0))).unwrap();
    let mut template = pod_template(&["sleep", "infinity"]);
    let container = &mut template.spec.as_mut().unwrap().containers[0];
    container.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        limits: Some(BTreeMap::from([("memory".to_owned(), Quantity("256Mi".into()))])),
        ..Default::default()
    });
    sandbox.spec.template = Some(template);
    let plan = plan_at(&sandbox, Some(&rt), at(1));
    assert_eq!(summary(&plan), "update-in-place");
    let Some(SandboxAction::UpdateInPlace { spec, revision }) = plan.actions.last() else {
        unreachable!()
    };
    assert_eq!(spec.resources.memory_bytes, Some(256 << 20));
    assert_eq!(*revision, sandbox_revision(&sandbox.spec));
    let updated = apply_writes(&sandbox, &plan).unwrap();
    assert_eq!(summary(&plan_at(&updated, Some(&rt), at(2))), "");
}

#[test]
fn the_generation_of_an_in_place_change_is_observed_once_the_change_is_made() {
    let mut sandbox = sbx().running().build();
    let rt = instance(&sandbox, S::Running, None);
    let mut template = pod_template(&["sleep", "infinity"]);
    template.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([("cpu".to_owned(), Quantity("2".into()))])),
        ..Default::default()
    });
    sandbox.spec.template = Some(template);
    sandbox.metadata.generation = Some(2);
    let plan = plan_at(&sandbox, Some(&rt), at(1));
    // No status write says generation 2 before the update: a claim waiting for it would take
    // the old limits for the new.
    assert_eq!(summary(&plan), "update-in-place");
    let updated = apply_writes(&sandbox, &plan).unwrap();
    assert_eq!(updated.status.as_ref().unwrap().observed_generation, Some(2));
    assert_eq!(summary(&plan_at(&updated, Some(&rt), at(2))), "");
}

#[test]
fn a_new_root_without_a_policy_restarts_the_sandbox_in_place() {
    let mut sandbox = sbx()
        .running()
        .annotation(annotations::INIT_RUNTIME_REQUEST, r#"{"accessToken":"t"}"#)
        .cond(RUNTIME_INITIALIZED, TRUE, runtime_initialized_reason::SUCCEEDED)
        .build();
    let old = instance(&sandbox, S::Running, None);
    // A claim writes the first container's image: a root directory.
    let mut template = pod_template(&["sleep", "infinity"]);
    template.spec.as_mut().unwrap().containers[0].image = Some("/srv/roots/python".into());
    sandbox.spec.template = Some(template);
    sandbox.metadata.generation = Some(2);
    assert_eq!(summary(&plan_at(&sandbox, Some(&old), at(1))), "update-in-place");
    // The runtime answers that a new root needs a restart: the executor records it.
    let mut restarting = sandbox.clone();
    let status = restarting.status.as_mut().unwrap();
    status.observed_generation = Some(2);
    let conditions = status.conditions.get_or_insert_default();
    let updating = |type_: &str, reason: &str, message: &str| Condition {
        type_: type_.into(),
        status: FALSE.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(at(1)),
        observed_generation: None,
    };
    conditions.retain(|c| c.type_ != READY);
    conditions.push(updating(READY, ready_reason::INPLACE_UPDATING, "incompleted"));
    conditions.push(updating(INPLACE_UPDATE, inplace_update_reason::INPLACE_UPDATING, "root"));
    // The old instance goes (its processes and writable layer with it) ...
    assert_eq!(summary(&plan_at(&restarting, Some(&old), at(2))), "status:Running rt:delete");
    // ... and the new one starts on the new root, same runtime id.
    let gone = instance(&restarting, S::Gone, None);
    let plan = plan_at(&restarting, Some(&gone), at(3));
    assert_eq!(summary(&plan), "status:Running rt:ensure");
    let Some(SandboxAction::Runtime(RuntimeAction::Ensure(spec))) = plan.actions.last() else {
        unreachable!()
    };
    assert_eq!(spec.root, RootFs::Directory("/srv/roots/python".into()));
    assert_eq!(spec.id, old.id);
    let status = written_status(&plan);
    let (_, reason, message) = condition(status, INPLACE_UPDATE);
    assert_eq!((reason, message), ("InplaceUpdating", RESTARTED_ON_NEW_ROOT));
    assert_eq!(condition(status, READY).1, ready_reason::INPLACE_UPDATING);
    restarting = apply_writes(&restarting, &plan).unwrap();
    // A crash in between: the sandbox still knows its old instance is gone.
    assert_eq!(summary(&plan_at(&restarting, Some(&gone), at(4))), "rt:ensure");
    // It runs: the update succeeded, the revision moves, Ready again, `/init` replayed.
    let new = instance(&restarting, S::Running, None);
    let plan = plan_at(&restarting, Some(&new), at(5));
    assert_eq!(summary(&plan), "status:Running initialize");
    let status = written_status(&plan);
    assert_eq!(condition(status, INPLACE_UPDATE).1, inplace_update_reason::SUCCEEDED);
    assert_eq!(condition(status, READY).0, TRUE);
    assert_eq!(condition(status, RUNTIME_INITIALIZED).1, runtime_initialized_reason::PENDING);
    assert_eq!(status.update_revision, Some(sandbox_revision(&sandbox.spec)));
    let done = apply_writes(&restarting, &plan).unwrap();
    assert_eq!(summary(&plan_at(&done, Some(&new), at(6))), "initialize");
    // Its Events: InplaceUpdating, then InplaceUpdateSucceeded.
    let events = condition_events(&sandbox, &restarting);
    assert_eq!(events[0].1, "InplaceUpdating");
    let events = condition_events(&restarting, &done);
    assert_eq!(events[0].1, "InplaceUpdateSucceeded");
}

#[test]
fn a_paused_sandbox_resumes_for_its_upgrade_then_waits_for_the_new_template() {
    let mut sandbox = sbx().phase(P::Paused).cond(PAUSED, TRUE, FREEZE_PAUSE_SUCCEED).build();
    sandbox.spec.paused = Some(true);
    sandbox.status.as_mut().unwrap().update_revision = Some(sandbox_revision(&sandbox.spec));
    sandbox.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
        type_: Some(oka_api::common::UpgradePolicyType::Recreate),
    });
    sandbox
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(annotations::UPGRADE_RESUME_TRIGGER.into(), "true".into());
    // Phase one: resume (thaw) it.
    let frozen = instance(&sandbox, S::Paused, None);
    let plan = plan_at(&sandbox, Some(&frozen), at(0));
    assert_eq!(summary(&plan), "status:Upgrading rt:resume");
    assert_eq!(condition(written_status(&plan), UPGRADING).1, upgrading_reason::RESUMING);
    let resuming = apply_writes(&sandbox, &plan).unwrap();
    let running = instance(&resuming, S::Running, None);
    let plan = plan_at(&resuming, Some(&running), at(1));
    let status = written_status(&plan);
    assert_eq!(condition(status, UPGRADING).1, upgrading_reason::RESUME_SUCCEED);
    assert!(status.condition(PAUSED).is_none());
    let waiting = apply_writes(&resuming, &plan).unwrap();
    assert_eq!(summary(&plan_at(&waiting, Some(&running), at(2))), "");
    // Phase two: the SandboxUpdateOps patches the template; the upgrade goes on.
    let mut patched = waiting.clone();
    patched.spec.template = Some(pod_template(&["sleep", "1000"]));
    let plan = plan_at(&patched, Some(&running), at(3));
    assert_eq!(summary(&plan), "status:Upgrading rt:delete");
}

#[test]
fn a_checkpoint_restore_upgrade_moves_the_processes_and_a_failure_waits_for_a_change() {
    let mut sandbox = sbx().phase(P::Running).cond(READY, TRUE, ready_reason::POD_READY).build();
    sandbox.status.as_mut().unwrap().update_revision = Some("old".into());
    sandbox.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
        type_: Some(oka_api::common::UpgradePolicyType::CheckpointRestore),
    });
    let rt = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&rt), at(0));
    assert_eq!(summary(&plan), "status:Upgrading checkpoint-restore");
    assert_eq!(condition(written_status(&plan), UPGRADING).1, upgrading_reason::CHECKPOINTING);
    // The executor records a failure; it waits...
    let mut failed = apply_writes(&sandbox, &plan).unwrap();
    let conditions = failed.status.as_mut().unwrap().conditions.as_mut().unwrap();
    let upgrading = conditions.iter_mut().find(|c| c.type_ == UPGRADING).unwrap();
    upgrading.reason = upgrading_reason::CHECKPOINT_FAILED.into();
    upgrading.observed_generation = Some(1);
    assert_eq!(summary(&plan_at(&failed, Some(&rt), at(1))), "");
    // ... until the spec changes: Recreate then upgrades from PreUpgrade.
    let mut recreate = failed.clone();
    recreate.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
        type_: Some(oka_api::common::UpgradePolicyType::Recreate),
    });
    recreate.metadata.generation = Some(2);
    let plan = plan_at(&recreate, Some(&rt), at(2));
    assert_eq!(summary(&plan), "status:Upgrading rt:delete");
    assert_eq!(condition(written_status(&plan), UPGRADING).1, upgrading_reason::UPGRADE_POD);
}

/// A Running sandbox whose template changed under a Recreate policy, with these hooks.
fn upgrading_with_hooks(pre: Option<&[&str]>, post: Option<&[&str]>) -> Sandbox {
    let mut sandbox = sbx().running().build();
    sandbox.spec.template = Some(pod_template(&["sleep", "1000"]));
    sandbox.spec.upgrade_policy = Some(oka_api::common::UpgradePolicy {
        type_: Some(oka_api::common::UpgradePolicyType::Recreate),
    });
    let hook = |command: Option<&[&str]>| {
        command.map(|c| oka_api::common::UpgradeAction {
            exec: Some(k8s_openapi::api::core::v1::ExecAction {
                command: Some(c.iter().map(|s| (*s).to_owned()).collect()),
            }),
            timeout_seconds: 0,
        })
    };
    sandbox.spec.lifecycle = Some(oka_api::common::SandboxLifecycle {
        pre_upgrade: hook(pre),
        post_upgrade: hook(post),
    });
    sandbox
}

/// What the executor writes after a hook: `Upgrading` with this reason (a failure at
/// `generation`).
fn hook_ended(sandbox: &Sandbox, status: &str, reason: &str, generation: Option<i64>) -> Sandbox {
    let mut next = sandbox.clone();
    let conditions = next.status.as_mut().unwrap().conditions.as_mut().unwrap();
    let upgrading = conditions.iter_mut().find(|c| c.type_ == UPGRADING).unwrap();
    upgrading.status = status.into();
    upgrading.reason = reason.into();
    upgrading.message = if generation.is_some() { "exit code 3".into() } else { String::new() };
    upgrading.observed_generation = generation;
    next
}

#[test]
fn upgrade_hooks_run_before_and_after_the_new_instance() {
    let sandbox = upgrading_with_hooks(Some(&["sh", "-c", "backup"]), Some(&["restore"]));
    let rt = instance(&sandbox, S::Running, None);
    // PreUpgrade with a hook: the hook is run, nothing else yet.
    let plan = plan_at(&sandbox, Some(&rt), at(0));
    assert_eq!(summary(&plan), "status:Upgrading hook:pre");
    assert_eq!(condition(written_status(&plan), UPGRADING).1, upgrading_reason::PRE_UPGRADE);
    let sandbox = apply_writes(&sandbox, &plan).unwrap();
    // Re-planned before the outcome is written: the same hook again (nothing else).
    assert_eq!(summary(&plan_at(&sandbox, Some(&rt), at(1))), "hook:pre");
    // It succeeded (the executor moved on to Checkpointing): the old instance goes.
    let sandbox = hook_ended(&sandbox, FALSE, upgrading_reason::CHECKPOINTING, None);
    let plan = plan_at(&sandbox, Some(&rt), at(2));
    assert_eq!(summary(&plan), "status:Upgrading rt:delete");
    let sandbox = apply_writes(&sandbox, &plan).unwrap();
    let gone = instance(&sandbox, S::Gone, None);
    let plan = plan_at(&sandbox, Some(&gone), at(3));
    assert!(summary(&plan).ends_with("rt:ensure"), "{}", summary(&plan));
    let sandbox = apply_writes(&sandbox, &plan).unwrap();
    // The new instance runs: PostUpgrade runs its hook.
    let new = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&new), at(4));
    assert_eq!(summary(&plan), "status:Upgrading hook:post");
    assert_eq!(condition(written_status(&plan), UPGRADING).1, upgrading_reason::POST_UPGRADE);
    let sandbox = apply_writes(&sandbox, &plan).unwrap();
    // It succeeded: Running at the new revision.
    let sandbox = hook_ended(&sandbox, TRUE, upgrading_reason::SUCCEEDED, None);
    let plan = plan_at(&sandbox, Some(&new), at(5));
    let status = written_status(&plan);
    assert_eq!(status.phase, Some(P::Running));
    assert_eq!(status.update_revision, Some(sandbox_revision(&sandbox.spec)));
    let done = apply_writes(&sandbox, &plan).unwrap();
    assert_eq!(summary(&plan_at(&done, Some(&new), at(6))), "");
}

#[test]
fn a_post_upgrade_hook_runs_after_the_init_replay() {
    let mut sandbox = upgrading_with_hooks(None, Some(&["restore"]));
    sandbox.metadata.annotations.get_or_insert_with(Default::default).insert(
        annotations::INIT_RUNTIME_REQUEST.into(),
        r#"{"envVars":{},"accessToken":"tok"}"#.into(),
    );
    let rt = instance(&sandbox, S::Running, None);
    let sandbox = apply_writes(&sandbox, &plan_at(&sandbox, Some(&rt), at(0))).unwrap();
    let gone = instance(&sandbox, S::Gone, None);
    let sandbox = apply_writes(&sandbox, &plan_at(&sandbox, Some(&gone), at(1))).unwrap();
    let plan = plan_at(&sandbox, Some(&rt), at(2));
    assert_eq!(summary(&plan), "status:Upgrading initialize hook:post");
}

#[test]
fn a_failed_hook_waits_for_the_spec_to_change_then_resumes_from_its_step() {
    // PreUpgradeFailed: nothing until the spec changes; then PreUpgrade runs the hook again.
    let sandbox = upgrading_with_hooks(Some(&["false"]), None);
    let rt = instance(&sandbox, S::Running, None);
    let sandbox = apply_writes(&sandbox, &plan_at(&sandbox, Some(&rt), at(0))).unwrap();
    let failed = hook_ended(&sandbox, FALSE, upgrading_reason::PRE_UPGRADE_FAILED, Some(1));
    assert_eq!(summary(&plan_at(&failed, Some(&rt), at(1))), "");
    let mut changed = failed.clone();
    changed.spec.template = Some(pod_template(&["sleep", "2000"]));
    changed.metadata.generation = Some(2);
    let plan = plan_at(&changed, Some(&rt), at(2));
    assert_eq!(summary(&plan), "status:Upgrading hook:pre");
    assert_eq!(
        condition(written_status(&plan), UPGRADING),
        (FALSE, upgrading_reason::PRE_UPGRADE, "")
    );

    // PostUpgradeFailed: the instance is made again from the newest template, then the hook.
    let sandbox = upgrading_with_hooks(None, Some(&["false"]));
    let sandbox = apply_writes(&sandbox, &plan_at(&sandbox, Some(&rt), at(0))).unwrap();
    let failed = hook_ended(&sandbox, FALSE, upgrading_reason::POST_UPGRADE_FAILED, Some(1));
    assert_eq!(summary(&plan_at(&failed, Some(&rt), at(1))), "");
    let mut changed = failed.clone();
    changed.metadata.generation = Some(2);
    let plan = plan_at(&changed, Some(&rt), at(2));
    assert_eq!(summary(&plan), "status:Upgrading rt:delete");
    assert_eq!(condition(written_status(&plan), UPGRADING).1, upgrading_reason::UPGRADE_POD);
}

#[test]
fn hooks_need_a_command_and_default_their_timeout() {
    let sandbox = upgrading_with_hooks(Some(&[]), None);
    assert!(hook_of(&sandbox, true).is_none());
    assert!(hook_of(&sandbox, false).is_none());
    let rt = instance(&sandbox, S::Running, None);
    // An empty command is no hook: straight to UpgradePod.
    assert_eq!(summary(&plan_at(&sandbox, Some(&rt), at(0))), "status:Upgrading rt:delete");
    let mut sandbox = upgrading_with_hooks(Some(&["true"]), None);
    assert_eq!(hook_of(&sandbox, true).unwrap().1, DEFAULT_HOOK_TIMEOUT);
    let lifecycle = sandbox.spec.lifecycle.as_mut().unwrap();
    lifecycle.pre_upgrade.as_mut().unwrap().timeout_seconds = 5;
    let (command, timeout) = hook_of(&sandbox, true).unwrap();
    assert_eq!((command, timeout), (&["true".to_owned()][..], Duration::from_secs(5)));
}

#[test]
fn a_hook_failure_message_names_the_exit_code_and_the_end_of_the_output() {
    let outcome = HookOutcome {
        exit_code: 3,
        stdout: format!("{}END", "x".repeat(1000)),
        stderr: "oops\n".into(),
    };
    let message = hook_failure_message(true, &outcome);
    assert!(message.starts_with("lifecycle.preUpgrade hook exited with code 3; stdout: ..."));
    assert!(message.contains("xEND; stderr: oops"), "{message}");
    assert!(message.len() < 2 * HOOK_OUTPUT_QUOTE + 100, "{message}");
    let quiet = HookOutcome { exit_code: 1, ..HookOutcome::default() };
    assert_eq!(
        hook_failure_message(false, &quiet),
        "lifecycle.postUpgrade hook exited with code 1"
    );
}

#[test]
fn pausing_sets_the_reference_conditions() {
    let sandbox = sbx().running().cond(RESUMED, TRUE, resumed_reason::RESUME_POD).paused().build();
    let rt = instance(&sandbox, S::Running, None);
    let status = written_status(&plan_at(&sandbox, Some(&rt), t0())).clone();
    assert_eq!(status.phase, Some(P::Paused));
    assert_eq!(condition(&status, PAUSED), (FALSE, paused_reason::PENDING, ""));
    assert_eq!(condition(&status, READY).0, FALSE);
    assert!(status.condition(RESUMED).is_none(), "SandboxResumed is removed on pause");
}

#[test]
fn each_pause_mode_completes_with_its_reason() {
    for (mode, state, reason) in [
        (Freeze, S::Paused, FREEZE_PAUSE_SUCCEED),
        (Hibernate, S::Hibernated, paused_reason::SNAPSHOT_PAUSE_SUCCEED),
        (Stop, S::Stopped, paused_reason::STOP_PAUSE_SUCCEED),
        // Deeper than asked is paused too.
        (Freeze, S::Hibernated, paused_reason::SNAPSHOT_PAUSE_SUCCEED),
    ] {
        let sandbox = sbx().pausing().paused().strategy(mode).build();
        let rt = instance(&sandbox, state, None);
        let status = written_status(&plan_at(&sandbox, Some(&rt), t0())).clone();
        assert_eq!(condition(&status, PAUSED), (TRUE, reason, ""), "{mode:?} {state}");
        assert_eq!(status.phase, Some(P::Paused));
    }
}

#[test]
fn resuming_ends_running_with_resumed_and_without_paused() {
    let sandbox = sbx().paused_done(FREEZE_PAUSE_SUCCEED).unpaused().build();
    // Thawed meanwhile: Paused → Resuming → Running in one pass.
    let rt = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&rt), t0());
    assert_eq!(summary(&plan), "status:Running");
    let status = written_status(&plan);
    assert_eq!(condition(status, RESUMED), (TRUE, resumed_reason::RESUME_POD, ""));
    assert_eq!(condition(status, READY), (TRUE, ready_reason::POD_READY, ""));
    assert!(status.condition(PAUSED).is_none());
}

#[test]
fn resume_entry_marks_resumed_false_create_pod() {
    let sandbox = sbx().paused_done(FREEZE_PAUSE_SUCCEED).unpaused().build();
    let rt = instance(&sandbox, S::Paused, None);
    let status = written_status(&plan_at(&sandbox, Some(&rt), t0())).clone();
    assert_eq!(condition(&status, RESUMED), (FALSE, resumed_reason::CREATE_POD, ""));
    assert_eq!(condition(&status, PAUSED).0, TRUE, "the Paused condition stays while resuming");
}

#[test]
fn the_revision_is_kept_while_a_pause_is_incomplete() {
    let sandbox = sbx().pausing().paused().old_revision().build();
    let rt = instance(&sandbox, S::Running, None);
    assert_eq!(summary(&plan_at(&sandbox, Some(&rt), t0())), "rt:pause");
    let rt = instance(&sandbox, S::Paused, None);
    let status = written_status(&plan_at(&sandbox, Some(&rt), t0())).clone();
    assert_eq!(status.update_revision, Some(sandbox_revision(&sandbox.spec)));
}

#[test]
fn a_vanished_instance_fails_with_pod_not_found() {
    let sandbox = sbx().running().build();
    let rt = instance(&sandbox, S::Gone, None);
    let status = written_status(&plan_at(&sandbox, Some(&rt), t0())).clone();
    assert_eq!(status.phase, Some(P::Failed));
    let message = status.message.unwrap();
    assert!(message.starts_with("Pod Not Found: "), "{message}");
    assert!(message.contains(rt.id.as_str()), "{message}");
}

#[test]
fn an_exit_is_reported_like_a_pod_phase() {
    for (exit, phase, message) in [
        (
            ExitInfo::Code(0),
            P::Succeeded,
            "Pod status phase is Succeeded: the command exited with code 0",
        ),
        (
            ExitInfo::Code(3),
            P::Failed,
            "Pod status phase is Failed: the command exited with code 3",
        ),
        (
            ExitInfo::Signal(9),
            P::Failed,
            "Pod status phase is Failed: the command was killed by signal 9",
        ),
        (
            ExitInfo::Unknown,
            P::Failed,
            "Pod status phase is Failed: the command ended; its exit status is unknown",
        ),
    ] {
        let sandbox = sbx().running().build();
        let rt = instance(&sandbox, S::Stopped, Some(exit));
        let status = written_status(&plan_at(&sandbox, Some(&rt), t0())).clone();
        assert_eq!((status.phase.clone(), status.message.as_deref()), (Some(phase), Some(message)));
        assert_eq!(condition(&status, READY).0, FALSE);
    }
}

#[test]
fn an_unrunnable_template_says_what_to_fix_in_ready() {
    let mut template = pod_template(&["sh"]);
    template.spec.as_mut().unwrap().containers[0].stdin = Some(true);
    let sandbox = sbx().phase(P::Pending).template(Some(template)).build();
    let rt = instance(&sandbox, S::Gone, None);
    let plan = plan_at(&sandbox, Some(&rt), t0());
    assert_eq!(summary(&plan), "status:Pending");
    let (status, reason, message) = condition(written_status(&plan), READY);
    assert_eq!((status, reason), (FALSE, UNSUPPORTED_BY_RUNTIME));
    assert_eq!(message, "spec.template.spec.containers[0].stdin: not supported by oka's runtime");
    let after = Sandbox { status: Some(written_status(&plan).clone()), ..sandbox.clone() };
    assert_eq!(
        start_failure_events(&sandbox, &after),
        [(EventType::Warning, UNSUPPORTED_BY_RUNTIME.to_owned(), message.to_owned())]
    );
    assert_eq!(start_failure_events(&after, &after), []);
}

#[test]
fn a_missing_config_map_keeps_the_sandbox_pending_until_it_exists() {
    let mut template = pod_template(&["sh"]);
    let pod = template.spec.as_mut().unwrap();
    pod.volumes = Some(vec![
        serde_json::from_value(serde_json::json!(
            {"name": "cfg", "configMap": {"name": "settings"}}
        ))
        .unwrap(),
    ]);
    pod.containers[0].volume_mounts = Some(vec![
        serde_json::from_value(serde_json::json!(
            {"name": "cfg", "mountPath": "/etc/app"}
        ))
        .unwrap(),
    ]);
    pod.containers[0].env = Some(vec![KubeEnvVar {
        name: "MODE".into(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(
                serde_json::from_value(serde_json::json!(
                    {"name": "settings", "key": "mode"}
                ))
                .unwrap(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let sandbox = sbx().phase(P::Pending).template(Some(template)).build();
    let rt = instance(&sandbox, S::Gone, None);
    let mut inputs = inputs::PodInputs::default();
    inputs.add_config_map("settings", None);
    let plan = plan_sandbox(
        &sandbox,
        &SandboxObservation { inputs: &inputs, ..observe(&sandbox, Some(&rt)) },
        t0(),
    )
    .unwrap();
    assert_eq!(summary(&plan), "status:Pending");
    assert_eq!(plan.requeue_after, Some(INPUTS_RETRY));
    let (status, reason, message) = condition(written_status(&plan), READY);
    assert_eq!((status, reason), (FALSE, FAILED_MOUNT));
    assert_eq!(
        message,
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"settings\" not found"
    );
    let after = Sandbox { status: Some(written_status(&plan).clone()), ..sandbox.clone() };
    assert_eq!(
        start_failure_events(&sandbox, &after),
        [(EventType::Warning, FAILED_MOUNT.to_owned(), message.to_owned())]
    );

    // The ConfigMap without the key: the env fails the container's configuration.
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(serde_json::json!({"data": {"app.conf": "x=1"}})).unwrap();
    inputs.add_config_map("settings", Some(&cm));
    let plan = plan_sandbox(
        &sandbox,
        &SandboxObservation { inputs: &inputs, ..observe(&sandbox, Some(&rt)) },
        t0(),
    )
    .unwrap();
    let (_, reason, message) = condition(written_status(&plan), READY);
    assert_eq!(reason, image::reason::CREATE_CONTAINER_CONFIG_ERROR);
    assert_eq!(message, "couldn't find key mode in ConfigMap default/settings");
    let after = Sandbox { status: Some(written_status(&plan).clone()), ..sandbox.clone() };
    assert_eq!(
        start_failure_events(&sandbox, &after),
        [(EventType::Warning, "Failed".to_owned(), format!("Error: {message}"))]
    );

    // Complete: created with the file and the variable.
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(serde_json::json!({"data": {"app.conf": "x=1", "mode": "fast"}}))
            .unwrap();
    inputs.add_config_map("settings", Some(&cm));
    let plan = plan_sandbox(
        &sandbox,
        &SandboxObservation { inputs: &inputs, ..observe(&sandbox, Some(&rt)) },
        t0(),
    )
    .unwrap();
    let Some(SandboxAction::Runtime(RuntimeAction::Ensure(spec))) =
        plan.actions.iter().find(|a| matches!(a, SandboxAction::Runtime(_)))
    else {
        panic!("{plan:?}")
    };
    assert_eq!(spec.process.env, [oka_runtime_api::EnvVar::new("MODE", "fast")]);
    assert_eq!(spec.mounts.len(), 1);
    assert_eq!(spec.mounts[0].target, std::path::Path::new("/etc/app"));
    let oka_runtime_api::MountSource::Files { files, .. } = &spec.mounts[0].source else {
        panic!("{spec:?}")
    };
    assert_eq!(files.len(), 2);
}

#[test]
fn a_referenced_template_is_resolved() {
    let sandbox = sbx().phase(P::Pending).template_ref("base").build();
    let mut template = SandboxTemplate::new("base", Default::default());
    template.spec.template = Some(pod_template(&["python3", "-m", "http.server"]));
    let rt = instance(&sandbox, S::Gone, None);
    let observation = SandboxObservation {
        runtime: Some(&rt),
        template: TemplateSource::of(&sandbox, Some(&template)),
        image: &ImageState::NotNeeded,
        node_name: NODE,
        auto_pause: None,
        probes: &[],
        auto_pause_budget: autopause::Budget::default(),
        inputs: &NO_INPUTS,
    };
    let plan = plan_sandbox(&sandbox, &observation, t0()).unwrap();
    let [SandboxAction::Runtime(RuntimeAction::Ensure(spec))] = plan.actions.as_slice() else {
        panic!("{plan:?}")
    };
    assert_eq!(spec.process.command, ["python3", "-m", "http.server"]);
}

#[test]
fn timers_requeue_at_the_nearest_deadline() {
    let sandbox = sbx().running().shutdown_at(at(30)).pause_at(at(10)).build();
    let rt = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&rt), t0());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(10)));
    // A paused sandbox has no pause deadline left.
    let sandbox = sbx()
        .paused_done(FREEZE_PAUSE_SUCCEED)
        .paused()
        .shutdown_at(at(30))
        .pause_at(at(10))
        .build();
    let rt = instance(&sandbox, S::Paused, None);
    assert_eq!(plan_at(&sandbox, Some(&rt), t0()).requeue_after, Some(Duration::from_secs(30)));
}

#[test]
fn pause_with_retention_moves_both_times() {
    let sandbox = sbx()
        .running()
        .pause_at(at(-1))
        .shutdown_at(at(60))
        .annotation(annotations::RESERVE_PAUSED_SANDBOX_DURATION, "1h")
        .build();
    let rt = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&rt), at(0) + SignedDuration::from_millis(400));
    assert_eq!(
        plan.actions,
        [SandboxAction::SetPaused { until: Some(Time(at(3600))), by_policy: false }]
    );
    // Invalid and `forever` retention both mean 100 years.
    for value in ["forever", "soon", "-1s"] {
        let sandbox = sbx()
            .running()
            .pause_at(at(-1))
            .shutdown_at(at(60))
            .annotation(annotations::RESERVE_PAUSED_SANDBOX_DURATION, value)
            .build();
        let plan = plan_at(&sandbox, Some(&rt), t0());
        let [SandboxAction::SetPaused { until: Some(until), .. }] = plan.actions.as_slice() else {
            panic!()
        };
        assert_eq!(until.0.duration_since(t0()), oka_api::retention::FOREVER, "{value}");
    }
}

#[test]
fn runtime_errors_land_in_the_condition_the_verb_drives() {
    let sandbox = sbx().pausing().paused().strategy(Hibernate).build();
    let status = sandbox.status.clone().unwrap();
    let id = runtime_id(&sandbox).unwrap();
    let message = "hibernate is not supported: CRIU is not integrated yet";
    let failed =
        status_after_runtime_error(&status, &RuntimeAction::Hibernate(id.clone()), message, t0())
            .unwrap();
    assert_eq!(condition(&failed, PAUSED), (FALSE, paused_reason::CHECKPOINT_FAILED, message));
    // The same failure again changes nothing (no write, just the backoff).
    assert_eq!(
        status_after_runtime_error(&failed, &RuntimeAction::Hibernate(id.clone()), message, t0()),
        None
    );

    let pending = sbx().phase(P::Pending).build();
    let spec = TemplateSource::of(&pending, None).resolve(&pending).unwrap();
    let failed = status_after_runtime_error(
        pending.status.as_ref().unwrap(),
        &RuntimeAction::Ensure(Box::new(spec)),
        "boom",
        t0(),
    )
    .unwrap();
    assert_eq!(condition(&failed, READY), (FALSE, ready_reason::POD_CREATE_FAILED, "boom"));
    assert_eq!(status_after_runtime_error(&status, &RuntimeAction::Delete(id), "x", t0()), None);
}

// === The template conversion ===

#[test]
fn the_first_container_becomes_the_runtime_spec() {
    let mut template = pod_template(&["python3"]);
    let spec = template.spec.as_mut().unwrap();
    spec.containers[0].args = Some(vec!["-m".into(), "http.server".into()]);
    spec.containers[0].working_dir = Some("/home/user".into());
    spec.containers[0].env = Some(vec![
        KubeEnvVar { name: "A".into(), value: Some("1".into()), ..Default::default() },
        KubeEnvVar { name: "EMPTY".into(), ..Default::default() },
    ]);
    spec.containers[0].resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity("500m".into())),
            ("memory".to_owned(), Quantity("256Mi".into())),
        ])),
        ..Default::default()
    });
    spec.containers[0].security_context =
        Some(SecurityContext { run_as_user: Some(1000), ..Default::default() });
    let sandbox = sbx().template(Some(template.clone())).build();
    let resolved = resolve_runtime_spec(&sandbox, &template).unwrap();
    assert_eq!(resolved.id, runtime_id(&sandbox).unwrap());
    assert_eq!(resolved.hostname, "sbx");
    assert_eq!(resolved.argv(), ["python3", "-m", "http.server"]);
    assert_eq!(
        resolved.process.env,
        [oka_runtime_api::EnvVar::new("A", "1"), oka_runtime_api::EnvVar::new("EMPTY", "")]
    );
    assert_eq!(resolved.process.working_dir, Some("/home/user".into()));
    assert_eq!(resolved.process.user, Some(User { uid: 1000, gid: 1000 }));
    assert_eq!(
        resolved.resources,
        ResourceLimits {
            cpu_millis: Some(500),
            memory_bytes: Some(256 << 20),
            pids: Some(DEFAULT_PIDS_LIMIT)
        }
    );
    assert_eq!(resolved.root, RootFs::Default);
    assert_eq!(resolved.network, NetworkMode::Loopback);
}

use oka_runtime_api::{NetworkMode, ResourceLimits, User};

#[test]
fn a_container_without_a_command_is_the_agent_runtime_alone() {
    let mut template = pod_template(&["sh"]);
    template.spec.as_mut().unwrap().containers[0].command = None;
    let resolved = resolve_runtime_spec(&sbx().build(), &template).unwrap();
    assert!(resolved.argv().is_empty(), "{:?}", resolved.argv());
}

#[test]
fn an_absolute_image_path_is_the_root_filesystem() {
    let mut template = pod_template(&["sh"]);
    template.spec.as_mut().unwrap().containers[0].image = Some("/var/lib/oka/rootfs/debian".into());
    let sandbox = sbx().build();
    let resolved = resolve_runtime_spec(&sandbox, &template).unwrap();
    assert_eq!(resolved.root, RootFs::Directory("/var/lib/oka/rootfs/debian".into()));
    template.spec.as_mut().unwrap().containers[0].image = None;
    assert_eq!(resolve_runtime_spec(&sandbox, &template).unwrap().root, RootFs::Default);
}

fn pulled(reference: &str) -> image::PulledImage {
    image::PulledImage {
        reference: reference.into(),
        digest: "sha256:0123".into(),
        layers: vec!["/images/layers/a".into(), "/images/layers/b".into()],
        config: imageconfig::ImageConfig {
            entrypoint: vec!["/entry".into()],
            cmd: vec!["serve".into()],
            env: vec!["PATH=/app/bin:/usr/bin".into(), "MODE=image".into()],
            working_dir: Some("/app".into()),
            user: Some("app".into()),
        },
        accounts: imageconfig::ImageAccounts {
            passwd: Some("root:x:0:0::/root:/bin/sh\napp:x:500:600::/app:/bin/sh\n".into()),
            group: None,
        },
        size: 1234,
    }
}

fn image_template(reference: &str, command: &[&str]) -> PodTemplateSpec {
    let mut template = pod_template(command);
    let container = &mut template.spec.as_mut().unwrap().containers[0];
    container.image = Some(reference.into());
    container.env = Some(vec![KubeEnvVar {
        name: "MODE".into(),
        value: Some("container".into()),
        ..Default::default()
    }]);
    template
}

#[test]
fn an_image_reference_is_never_another_root_and_runs_on_its_layers_once_pulled() {
    let sandbox = sbx().build();
    let template = image_template("127.0.0.1:5000/test/app:1", &[]);
    assert_eq!(
        resolve_runtime_spec(&sandbox, &template),
        Err(ResolveError::ImageNotPulled("127.0.0.1:5000/test/app:1".into()))
    );
    let image = pulled("127.0.0.1:5000/test/app:1");
    let spec = resolve_runtime_spec_with(&sandbox, &template, Some(&image)).unwrap();
    assert_eq!(spec.root, RootFs::Layers(image.layers.clone()));
    assert_eq!(spec.argv(), ["/entry", "serve"]);
    let env: Vec<(&str, &str)> =
        spec.process.env.iter().map(|v| (v.name.as_str(), v.value.as_str())).collect();
    assert_eq!(env, [("PATH", "/app/bin:/usr/bin"), ("MODE", "image"), ("MODE", "container")]);
    assert_eq!(spec.process.working_dir, Some("/app".into()));
    assert_eq!(spec.process.user, Some(User { uid: 500, gid: 600 }));
    // An unknown user is the kubelet's CreateContainerConfigError.
    let mut ghost = image.clone();
    ghost.config.user = Some("ghost".into());
    assert!(matches!(
        resolve_runtime_spec_with(&sandbox, &template, Some(&ghost)),
        Err(ResolveError::ImageUser { .. })
    ));
}

fn observe_image<'a>(
    sandbox: &'a Sandbox,
    rt: Option<&'a InstanceStatus>,
    image: &'a ImageState,
) -> SandboxObservation<'a> {
    SandboxObservation { image, ..observe(sandbox, rt) }
}

fn ready_of(plan: &Plan<SandboxAction>) -> Option<(String, String)> {
    plan.actions.iter().find_map(|a| match a {
        SandboxAction::UpdateStatus(status) => {
            status.condition(READY).map(|c| (c.reason.clone(), c.message.clone()))
        }
        _ => None,
    })
}

#[test]
fn a_sandbox_waits_pending_for_its_image_and_is_created_on_it_once_pulled() {
    let reference = "127.0.0.1:5000/test/app:1";
    let sandbox =
        sbx().phase(P::Pending).template(Some(image_template(reference, &["sleep"]))).build();
    let rt = instance(&sandbox, S::Gone, None);
    // Absent: a pull is asked for, Ready=False/ContainerCreating, no instance.
    let absent = ImageState::Absent;
    let plan = plan_sandbox(&sandbox, &observe_image(&sandbox, Some(&rt), &absent), t0()).unwrap();
    assert!(plan.actions.contains(&SandboxAction::PullImage { reference: reference.into() }));
    assert!(!plan.actions.iter().any(|a| matches!(a, SandboxAction::Runtime(_))), "{plan:?}");
    assert_eq!(
        ready_of(&plan),
        Some(("ContainerCreating".into(), format!("Pulling image \"{reference}\"")))
    );
    // Failed: ErrImagePull with the error, then ImagePullBackOff until the next attempt.
    let failed = ImageState::Failed {
        message: "manifest unknown".into(),
        failed_at: t0(),
        retry_at: at(10),
    };
    let plan = plan_sandbox(&sandbox, &observe_image(&sandbox, Some(&rt), &failed), t0()).unwrap();
    assert_eq!(ready_of(&plan), Some(("ErrImagePull".into(), "manifest unknown".into())));
    assert!(!plan.actions.iter().any(|a| matches!(a, SandboxAction::Runtime(_))), "{plan:?}");
    let plan = plan_sandbox(&sandbox, &observe_image(&sandbox, Some(&rt), &failed), at(3)).unwrap();
    assert_eq!(ready_of(&plan).map(|r| r.0), Some("ImagePullBackOff".into()));
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(7)));
    assert!(!plan.actions.iter().any(|a| matches!(a, SandboxAction::Runtime(_))), "{plan:?}");
    let plan =
        plan_sandbox(&sandbox, &observe_image(&sandbox, Some(&rt), &failed), at(10)).unwrap();
    assert!(plan.actions.contains(&SandboxAction::PullImage { reference: reference.into() }));
    // Pulled: created on its layers, and the digest recorded once it runs.
    let ready = ImageState::Ready(Arc::new(pulled(reference)));
    let plan = plan_sandbox(&sandbox, &observe_image(&sandbox, Some(&rt), &ready), t0()).unwrap();
    let Some(SandboxAction::Runtime(RuntimeAction::Ensure(spec))) = plan.actions.last() else {
        panic!("{plan:?}")
    };
    assert!(matches!(spec.root, RootFs::Layers(_)));
    let running = instance(&sandbox, S::Running, None);
    let plan =
        plan_sandbox(&sandbox, &observe_image(&sandbox, Some(&running), &ready), t0()).unwrap();
    let SandboxAction::UpdateStatus(status) = &plan.actions[0] else { panic!("{plan:?}") };
    let recorded = status.pod_info.as_ref().and_then(|i| i.annotations.as_ref());
    assert_eq!(
        recorded.and_then(|a| a.get(image::IMAGE_ID)).map(String::as_str),
        Some("127.0.0.1:5000/test/app@sha256:0123")
    );
    assert_eq!(
        image::recorded_digests([&Sandbox { status: Some((**status).clone()), ..sandbox.clone() }]),
        ["sha256:0123".to_owned()].into_iter().collect()
    );
    // No image store on this node: said, never the default root.
    let plan =
        plan_sandbox(&sandbox, &observe_image(&sandbox, Some(&rt), &ImageState::NoSource), t0())
            .unwrap();
    assert_eq!(ready_of(&plan).map(|r| r.0), Some("ErrImagePull".into()));
    assert!(!plan.actions.iter().any(|a| matches!(a, SandboxAction::Runtime(_))), "{plan:?}");
}

#[test]
fn what_the_local_runtime_cannot_run_is_refused_with_a_reason() {
    let sandbox = sbx().build();
    let with = |edit: &dyn Fn(&mut Container)| {
        let mut template = pod_template(&["sh"]);
        edit(&mut template.spec.as_mut().unwrap().containers[0]);
        resolve_runtime_spec(&sandbox, &template).unwrap_err()
    };
    let unsupported = with(&|c| {
        c.env = Some(vec![KubeEnvVar {
            name: "IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.hostIP".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        c.tty = Some(true);
    });
    assert_eq!(
        unsupported.to_string(),
        "spec.template.spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: not supported by \
         oka's runtime: use metadata.name, metadata.namespace, metadata.uid, \
         metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName or \
         spec.serviceAccountName; spec.template.spec.containers[0].tty: not supported by oka's \
         runtime"
    );
    let non_root = with(&|c| {
        c.security_context =
            Some(SecurityContext { run_as_non_root: Some(true), ..Default::default() })
    });
    assert_eq!(
        non_root.to_string(),
        "container has runAsNonRoot and image will run as root (container: main)"
    );
    assert!(matches!(
        with(&|c| c.command = Some(vec![String::new()])),
        ResolveError::Spec(SpecError::EmptyCommand)
    ));
    assert!(matches!(with(&|c| c.working_dir = Some("relative".into())), ResolveError::Spec(_)));
    let bad_cpu = with(&|c| {
        c.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([("cpu".to_owned(), Quantity("lots".into()))])),
            ..Default::default()
        })
    });
    assert_eq!(bad_cpu.to_string(), "container main: invalid cpu limit \"lots\": not a number");
    let bad_user = with(&|c| {
        c.security_context = Some(SecurityContext { run_as_user: Some(-1), ..Default::default() })
    });
    assert!(matches!(bad_user, ResolveError::InvalidUser { .. }));
    let no_container = PodTemplateSpec { metadata: None, spec: Some(PodSpec::default()) };
    assert_eq!(resolve_runtime_spec(&sandbox, &no_container), Err(ResolveError::NoContainer));
}

#[test]
fn args_alone_name_the_program() {
    let mut template = pod_template(&[]);
    template.spec.as_mut().unwrap().containers[0].command = None;
    template.spec.as_mut().unwrap().containers[0].args = Some(vec!["sleep".into(), "1".into()]);
    let resolved = resolve_runtime_spec(&sbx().build(), &template).unwrap();
    assert_eq!(resolved.argv(), ["sleep", "1"]);
}

#[test]
fn limits_are_rounded_up() {
    // The quantity grammar is `oka_api::quantity`'s; here, how resolve rounds: up.
    let mut template = pod_template(&["sh"]);
    template.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity("1500u".into())),
            ("memory".to_owned(), Quantity("100Mi".into())),
        ])),
        ..Default::default()
    });
    let resolved = resolve_runtime_spec(&sbx().build(), &template).unwrap();
    assert_eq!(resolved.resources.cpu_millis, Some(2));
}

#[test]
fn runtime_ids_are_stable_unique_and_valid() {
    let a = sbx().build();
    let id = runtime_id(&a).unwrap();
    assert_eq!(id.as_str(), "default--sbx-sbx-uid");
    assert_eq!(runtime_id(&a.clone()).unwrap(), id, "stable");
    let mut again = a.clone();
    again.metadata.uid = Some("another-uid".into());
    assert_ne!(runtime_id(&again).unwrap(), id, "a new object of the same name is a new instance");
    let mut long = a.clone();
    long.metadata.name = Some(format!("{}.x", "n".repeat(250)));
    long.metadata.uid = Some("7c5b5a0e-3a3b-4b8e-9d49-2b1f1d3f9a10".into());
    let id = runtime_id(&long).unwrap();
    assert!(
        id.as_str().len() <= 128 && id.as_str().ends_with("-7c5b5a0e-3a3b-4b8e-9d49-2b1f1d3f9a10"),
        "{id}"
    );
    let mut nameless = a;
    nameless.metadata.uid = None;
    assert_eq!(runtime_id(&nameless), Err(ResolveError::MissingMetadata("uid")));
}

#[test]
fn hostnames_are_valid() {
    assert_eq!(hostname("base-x7k2p"), "base-x7k2p");
    assert_eq!(hostname("Web.App"), "web.app");
    let long = hostname(&format!("{}-tail", "a".repeat(62)));
    assert_eq!(long, "a".repeat(62));
    assert_eq!(hostname("--"), "sandbox");
}

// === Regressions found by the properties ===

/// Postmortem: a pause that started while a stale `SandboxPaused=True` was left (written by
/// hand, or by another controller version) kept it, so the next pass read a completed pause
/// with the instance still running and rewrote the condition: two status writes for one
/// transition. A new pause now always starts from `False/Pending`.
#[test]
fn a_new_pause_resets_a_leftover_paused_condition() {
    let sandbox = sbx().running().cond(PAUSED, TRUE, paused_reason::PENDING).paused().build();
    let rt = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&rt), t0());
    assert_eq!(summary(&plan), "status:Paused rt:pause");
    assert_eq!(condition(written_status(&plan), PAUSED), (FALSE, paused_reason::PENDING, ""));
}

/// Postmortem: pausing again a paused sandbox found running set `SandboxPaused=False` but
/// left `Ready` alone, which the next pass then changed (a second write). It sets
/// `Ready=False` in the same write now.
#[test]
fn pausing_again_also_clears_ready() {
    let sandbox = sbx().paused_done(FREEZE_PAUSE_SUCCEED).paused().ready().build();
    let rt = instance(&sandbox, S::Running, None);
    let plan = plan_at(&sandbox, Some(&rt), t0());
    assert_eq!(summary(&plan), "status:Paused rt:pause");
    let status = written_status(&plan);
    assert_eq!(condition(status, READY), (FALSE, ready_reason::POD_READY, "Sandbox is paused"));
    assert_eq!(condition(status, PAUSED).0, FALSE);
}

// === Properties ===

/// The store's view of a written sandbox: its JSON round trip (which keeps whole seconds).
fn round_trip(sandbox: &Sandbox) -> Sandbox {
    serde_json::from_value(serde_json::to_value(sandbox).unwrap()).unwrap()
}

/// Applies the store writes of a plan to `sandbox` (the runtime verb is not applied).
fn apply_writes(sandbox: &Sandbox, plan: &Plan<SandboxAction>) -> Option<Sandbox> {
    let mut next = sandbox.clone();
    for action in &plan.actions {
        match action {
            SandboxAction::AddFinalizer => {
                next.metadata.finalizers = Some(vec![finalizers::SANDBOX.into()])
            }
            SandboxAction::RemoveFinalizer | SandboxAction::Delete => return None,
            SandboxAction::SetPaused { until, .. } => {
                next.spec.paused = Some(true);
                next.metadata.generation = next.metadata.generation.map(|g| g + 1);
                if let Some(until) = until {
                    next.spec.shutdown_time = Some(until.clone());
                    next.spec.pause_time = Some(until.clone());
                }
            }
            SandboxAction::AutoResume | SandboxAction::ClearPausedBy => {
                if *action == SandboxAction::AutoResume {
                    next.spec.paused = Some(false);
                }
                if let Some(notes) = next.metadata.annotations.as_mut() {
                    notes.remove(annotations::PAUSED_BY);
                }
            }
            SandboxAction::UpdateStatus(status) => next.status = Some((**status).clone()),
            SandboxAction::ReturnToPool => next = recycle::returned_to_pool(&next, &pool_set()),
            SandboxAction::SetShutdown(until) => next.spec.shutdown_time = Some(until.clone()),
            SandboxAction::MarkRestarted(requested) => {
                next.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(annotations::RESTARTED_AT.into(), requested.clone());
            }
            SandboxAction::UpdateInPlace { revision, .. } => {
                let status = next.status.get_or_insert_with(Default::default);
                status.update_revision = Some(revision.clone());
                status.observed_generation = next.metadata.generation;
            }
            SandboxAction::PullImage { .. }
            | SandboxAction::Runtime(_)
            | SandboxAction::Initialize
            | SandboxAction::CheckpointRestore(_)
            | SandboxAction::RunHook { .. } => {}
        }
    }
    Some(round_trip(&next))
}

/// The SandboxSet `pool` that recycled fixtures come from.
fn pool_set() -> oka_api::SandboxSet {
    serde_json::from_value(serde_json::json!({
        "apiVersion": oka_api::API_VERSION,
        "kind": "SandboxSet",
        "metadata": { "name": "pool", "namespace": "default", "uid": "pool-uid" },
        "spec": { "replicas": 1 },
    }))
    .unwrap()
}

/// A claimed, running member of `pool` whose user killed it with reuse enabled.
fn to_recycle() -> Sandbox {
    let mut sandbox = sbx().running().sandbox;
    let labels = sandbox.metadata.labels.get_or_insert_default();
    labels.insert(oka_api::labels::SANDBOX_POOL.into(), "pool".into());
    labels.insert(oka_api::labels::SANDBOX_CLAIMED.into(), "true".into());
    let notes = sandbox.metadata.annotations.get_or_insert_default();
    notes.insert(annotations::CLEANUP_ENABLED.into(), "true".into());
    notes.insert(annotations::CLEANUP.into(), "true".into());
    notes.insert(annotations::ENVD_ACCESS_TOKEN.into(), "old-token".into());
    sandbox.spec.shutdown_time = Some(Time(at(3600)));
    sandbox
}

/// Plans, writes and runs verbs (on the model runtime) until nothing is left to do; returns
/// the sandbox (`None`: deleted) and the verbs run.
fn converge(
    mut sandbox: Sandbox,
    mut rt: InstanceStatus,
    now: Timestamp,
) -> (Option<Sandbox>, Vec<String>) {
    let mut verbs = Vec::new();
    for _ in 0..10 {
        let plan = plan_at(&sandbox, Some(&rt), now);
        if plan.actions.is_empty() {
            return (Some(sandbox), verbs);
        }
        for action in &plan.actions {
            if let SandboxAction::Runtime(verb) = action {
                verbs.push(verb.operation().to_string());
                model_runtime(&mut rt, verb);
            }
        }
        match apply_writes(&sandbox, &plan) {
            Some(next) => sandbox = next,
            None => return (None, verbs),
        }
    }
    panic!("no fixed point after 10 passes: {sandbox:?}");
}

#[test]
fn a_killed_reusable_sandbox_gets_a_fresh_instance_and_returns_to_its_pool() {
    let sandbox = to_recycle();
    let rt = instance(&sandbox, S::Running, None);
    let first = plan_at(&sandbox, Some(&rt), t0());
    assert_eq!(summary(&first), "status:Recycling rt:delete");
    let (returned, verbs) = converge(sandbox, rt, t0());
    let returned = returned.expect("kept");
    assert_eq!(verbs, ["delete", "ensure"], "the old instance goes, a fresh one starts");
    let status = returned.status.as_ref().unwrap();
    assert_eq!(status.phase, Some(P::Running));
    assert!(status.condition(READY).is_some_and(conditions::is_true));
    let recycled = status.condition(RECYCLING).unwrap();
    assert_eq!(
        (recycled.status.as_str(), recycled.reason.as_str()),
        (TRUE, recycling_reason::SUCCEEDED)
    );
    assert_eq!(status.reuse_count(), 1);
    assert!(!recycle::recycle_requested(&returned));
    let notes = returned.metadata.annotations.as_ref().unwrap();
    assert!(!notes.contains_key(annotations::ENVD_ACCESS_TOKEN));
    assert_eq!(
        returned.metadata.labels.as_ref().unwrap()[oka_api::labels::SANDBOX_CLAIMED],
        "false"
    );
    assert_eq!(returned.controller_ref().map(|o| o.uid.as_str()), Some("pool-uid"));
    assert!(returned.spec.shutdown_time.is_none());
}

#[test]
fn a_recycle_without_a_pool_or_past_its_timeout_deletes_the_sandbox() {
    let mut no_pool = to_recycle();
    no_pool.metadata.labels.as_mut().unwrap().remove(oka_api::labels::SANDBOX_POOL);
    let rt = instance(&no_pool, S::Running, None);
    assert_eq!(summary(&plan_at(&no_pool, Some(&rt), t0())), "delete");

    // Started at t0; the fresh instance never came up.
    let sandbox = to_recycle();
    let started = apply_writes(&sandbox, &plan_at(&sandbox, Some(&rt), t0())).unwrap();
    let gone = instance(&started, S::Gone, None);
    assert_eq!(summary(&plan_at(&started, Some(&gone), at(30))), "status:Recycling rt:ensure");
    assert_eq!(summary(&plan_at(&started, Some(&gone), at(61))), "delete");
}

#[test]
fn a_recycle_is_rejected_for_volume_claims_and_kept_on_failure_when_asked() {
    let mut with_claim = to_recycle();
    let template = with_claim.spec.template.as_mut().unwrap().spec.as_mut().unwrap();
    template.volumes = Some(vec![
        serde_json::from_value(serde_json::json!({
            "name": "data", "persistentVolumeClaim": {"claimName": "data"}
        }))
        .unwrap(),
    ]);
    let rt = instance(&with_claim, S::Running, None);
    let plan = plan_at(&with_claim, Some(&rt), t0());
    let status = written_status(&plan);
    assert_eq!(status.phase, Some(P::Running));
    assert_eq!(condition(status, RECYCLING).1, recycling_reason::REJECTED);
    assert!(!summary(&plan).contains("rt:"), "{}", summary(&plan));
    let rejected = apply_writes(&with_claim, &plan).unwrap();
    assert_eq!(summary(&plan_at(&rejected, Some(&rt), at(1))), "");

    // Timed out with cleanup-retain-on-failure: kept, with a shutdown time, not deleted.
    let mut kept = to_recycle();
    kept.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(annotations::CLEANUP_RETAIN_ON_FAILURE.into(), "10m".into());
    let started = apply_writes(&kept, &plan_at(&kept, Some(&rt), t0())).unwrap();
    let gone = instance(&started, S::Gone, None);
    let plan = plan_at(&started, Some(&gone), at(61));
    assert_eq!(summary(&plan), "status:Recycling set-shutdown");
    let failed = apply_writes(&started, &plan).unwrap();
    assert_eq!(failed.spec.shutdown_time, Some(Time(at(61 + 600))));
    assert_eq!(condition(failed.status.as_ref().unwrap(), RECYCLING).1, recycling_reason::TIMEOUT);
    assert_eq!(summary(&plan_at(&failed, Some(&gone), at(62))), "");
    assert_eq!(summary(&plan_at(&failed, Some(&gone), at(61 + 600))), "delete");
}

#[test]
fn each_upgrade_recycle_and_in_place_step_is_an_event() {
    let before =
        sbx().phase(P::Upgrading).cond(UPGRADING, FALSE, upgrading_reason::UPGRADE_POD).build();
    let after =
        sbx().phase(P::Upgrading).cond(UPGRADING, FALSE, upgrading_reason::POST_UPGRADE).build();
    let events = condition_events(&before, &after);
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].0, events[0].1.as_str()), (EventType::Normal, "UpgradePodReplaced"));
    assert!(condition_events(&after, &after).is_empty(), "no change, no event");
    let failed = sbx()
        .phase(P::Running)
        .cond_with(INPLACE_UPDATE, FALSE, inplace_update_reason::FAILED, "only resource limits")
        .build();
    let events = condition_events(&before, &failed);
    assert_eq!(
        events,
        [(EventType::Warning, "InplaceUpdateFailed".to_owned(), "only resource limits".to_owned())]
    );
    let paused = sbx()
        .phase(P::Running)
        .cond(oka_api::conditions::sandbox::AUTO_PAUSED, TRUE, "ProbeDriven")
        .build();
    let events = condition_events(&before, &paused);
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].0, events[0].1.as_str()), (EventType::Normal, "AutoPaused"));
}

/// A model of the runtime: what each verb does to the instance's state.
fn model_runtime(rt: &mut InstanceStatus, verb: &RuntimeAction) {
    let state = rt.state;
    rt.state = match verb {
        RuntimeAction::Ensure(_) => match state {
            S::Gone | S::Stopped => S::Running,
            other => other,
        },
        RuntimeAction::Pause(_) if state == S::Running => S::Paused,
        RuntimeAction::Resume(_) if state == S::Paused => S::Running,
        RuntimeAction::Hibernate(_) if matches!(state, S::Running | S::Paused) => S::Hibernated,
        RuntimeAction::Restore(_) if state == S::Hibernated => S::Running,
        RuntimeAction::Stop { .. } if matches!(state, S::Running | S::Paused) => {
            rt.last_exit = Some(ExitInfo::Signal(15));
            S::Stopped
        }
        RuntimeAction::Delete(_) => S::Gone,
        _ => state,
    };
    if rt.state == S::Running {
        rt.last_exit = None;
        rt.started_at = Some(SystemTime::UNIX_EPOCH);
    }
}

fn arb_phase() -> impl Strategy<Value = Option<SandboxPhase>> {
    prop_oneof![
        Just(None),
        Just(Some(P::Pending)),
        Just(Some(P::Running)),
        Just(Some(P::Paused)),
        Just(Some(P::Resuming)),
        Just(Some(P::Failed)),
    ]
}

fn arb_cond(
    type_: &'static str,
    reasons: &'static [&'static str],
) -> impl Strategy<Value = Option<(&'static str, &'static str, &'static str)>> {
    proptest::option::of((prop_oneof![Just(TRUE), Just(FALSE)], proptest::sample::select(reasons)))
        .prop_map(move |c| c.map(|(status, reason)| (type_, status, reason)))
}

fn arb_state() -> impl Strategy<Value = SandboxState> {
    prop_oneof![
        Just(S::Running),
        Just(S::Paused),
        Just(S::Hibernated),
        Just(S::Stopped),
        Just(S::Gone)
    ]
}

fn arb_mode() -> impl Strategy<Value = PauseMode> {
    prop_oneof![Just(Freeze), Just(Hibernate), Just(Stop)]
}

prop_compose! {
    fn arb_sandbox()(
        phase in arb_phase(),
        ready in arb_cond(READY, &[ready_reason::POD_READY, ready_reason::POD_CREATE_FAILED]),
        paused_cond in arb_cond(PAUSED, &[paused_reason::PENDING, FREEZE_PAUSE_SUCCEED, paused_reason::CHECKPOINT_FAILED]),
        resumed in arb_cond(RESUMED, &[resumed_reason::CREATE_POD, resumed_reason::RESUME_POD]),
        paused in proptest::option::of(any::<bool>()),
        mode in arb_mode(),
        finalizer in any::<bool>(),
        shutdown in proptest::option::of(-50i64..500),
        pause_at in proptest::option::of(-50i64..500),
        retention in proptest::option::of(prop_oneof![Just("forever"), Just("30s"), Just("bad")]),
        generation in 1i64..3,
        observed in proptest::option::of(1i64..3),
        old_revision in any::<bool>(),
    ) -> Sandbox {
        let mut fx = sbx().strategy(mode);
        if let Some(phase) = phase { fx = fx.phase(phase); }
        for (type_, status, reason) in [ready, paused_cond, resumed].into_iter().flatten() {
            fx = fx.cond(type_, status, reason);
        }
        fx.sandbox.spec.paused = paused;
        if !finalizer { fx = fx.no_finalizer(); }
        if let Some(s) = shutdown { fx = fx.shutdown_at(at(s)); }
        if let Some(s) = pause_at { fx = fx.pause_at(at(s)); }
        if let Some(r) = retention { fx = fx.annotation(annotations::RESERVE_PAUSED_SANDBOX_DURATION, r); }
        if old_revision { fx = fx.old_revision(); }
        let mut sandbox = fx.build();
        sandbox.metadata.generation = Some(generation);
        if let Some(status) = sandbox.status.as_mut() { status.observed_generation = observed; }
        sandbox
    }
}

fn arb_now() -> impl Strategy<Value = Timestamp> {
    (-100i64..600, 0i32..1_000_000_000).prop_map(|(s, ns)| at(s) + SignedDuration::new(0, ns))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// Re-planning what a plan wrote, with the same observation and time, writes nothing: no
    /// status write ever causes another (the runtime verb may be repeated: it is idempotent).
    #[test]
    fn replanning_the_written_status_writes_nothing(
        sandbox in arb_sandbox(),
        state in arb_state(),
        exited in proptest::option::of(0i32..3),
        now in arb_now(),
    ) {
        let rt = instance(&sandbox, state, exited.map(ExitInfo::Code));
        let plan = plan_at(&sandbox, Some(&rt), now);
        let changes_spec = plan.actions.iter().any(|a| matches!(a, SandboxAction::SetPaused { .. }));
        if let (Some(next), false) = (apply_writes(&sandbox, &plan), changes_spec) {
            let again = plan_at(&next, Some(&rt), now);
            prop_assert!(
                !again.actions.iter().any(|a| matches!(a, SandboxAction::UpdateStatus(_) | SandboxAction::AddFinalizer)),
                "second plan {:?} after {:?}", summary(&again), summary(&plan)
            );
        }
    }

    /// A planned requeue is a timer deadline: nothing timed is due just before it, and at it
    /// the sandbox is paused or deleted.
    #[test]
    fn the_planned_requeue_is_the_next_deadline(sandbox in arb_sandbox(), now in arb_now()) {
        let rt = instance(&sandbox, S::Running, None);
        let plan = plan_at(&sandbox, Some(&rt), now);
        let Some(wait) = plan.requeue_after else { return Ok(()) };
        let Some(next) = apply_writes(&sandbox, &plan) else { return Ok(()) };
        let deadline = now.checked_add(SignedDuration::try_from(wait).unwrap()).unwrap();
        let timed = |p: &Plan<SandboxAction>| p.actions.iter().any(|a| matches!(a, SandboxAction::Delete | SandboxAction::SetPaused { .. }));
        let before = deadline.checked_sub(SignedDuration::from_nanos(1)).unwrap();
        prop_assert!(!timed(&plan_at(&next, Some(&rt), before)));
        let due = plan_at(&next, Some(&rt), deadline);
        prop_assert!(timed(&due), "nothing happened at the deadline: {}", summary(&due));
    }

    /// Against a model runtime, any sandbox without timers converges within a few rounds to
    /// what its spec asks: paused (Paused, `SandboxPaused=True`, the instance paused for its
    /// mode) or running (Running, `Ready=True`, the instance running), unless its instance
    /// is lost or its command ended (Failed / Succeeded).
    #[test]
    fn a_sandbox_converges_to_its_spec(
        sandbox in arb_sandbox(),
        state in arb_state(),
    ) {
        let mut sandbox = sandbox;
        sandbox.spec.shutdown_time = None;
        sandbox.spec.pause_time = None;
        let mut rt = instance(&sandbox, state, None);
        let initially_failed = sandbox.phase() == Some(&P::Failed);
        let mut rounds = 0;
        loop {
            let plan = plan_at(&sandbox, Some(&rt), t0());
            if plan.actions.is_empty() { break; }
            rounds += 1;
            prop_assert!(rounds <= 6, "no convergence: {} (phase {:?}, {})", summary(&plan), sandbox.phase(), rt.state);
            for action in &plan.actions {
                if let SandboxAction::Runtime(verb) = action { model_runtime(&mut rt, verb); }
            }
            sandbox = apply_writes(&sandbox, &plan).expect("not deleted without timers");
        }
        let status = sandbox.status.clone().unwrap_or_default();
        match status.phase {
            Some(P::Failed | P::Succeeded) => prop_assert!(
                state == S::Gone || initially_failed,
                "failed although the instance was {state}"
            ),
            Some(P::Paused) => {
                prop_assert!(sandbox.is_paused());
                prop_assert_eq!(status.condition(PAUSED).map(|c| c.status.as_str()), Some(TRUE));
                prop_assert!(PauseMode::of(&sandbox).is_reached_by(rt.state), "{}", rt.state);
            }
            Some(P::Running) => {
                prop_assert!(!sandbox.is_paused());
                prop_assert!(sandbox.is_ready());
                prop_assert_eq!(rt.state, S::Running);
            }
            other => prop_assert!(false, "stuck in {:?} with the instance {}", other, rt.state),
        }
    }
}

#[test]
fn a_listing_wakes_changed_instances_and_running_sandboxes_without_one() {
    let named = |name: &str, phase: SandboxPhase| {
        let mut fx = sbx().phase(phase);
        fx.sandbox.metadata.name = Some(name.into());
        fx.sandbox.metadata.uid = Some(format!("{name}-uid"));
        Arc::new(fx.build())
    };
    let steady = named("steady", SandboxPhase::Running);
    let exited = named("exited", SandboxPhase::Running);
    let came_and_went = named("came-and-went", SandboxPhase::Running);
    let pending = named("pending", SandboxPhase::Pending);
    let sandboxes = [&steady, &exited, &came_and_went, &pending].map(Arc::clone).to_vec();
    let entry = |s: &Sandbox, state, exit| (runtime_id(s).unwrap(), (state, exit));
    let before: RuntimeSnapshot =
        [entry(&steady, SandboxState::Running, None), entry(&exited, SandboxState::Running, None)]
            .into();
    let now: RuntimeSnapshot = [
        entry(&steady, SandboxState::Running, None),
        entry(&exited, SandboxState::Stopped, Some(ExitInfo::Code(1))),
    ]
    .into();
    let keys = |ks: Vec<ObjectKey>| ks.into_iter().map(|k| k.name).collect::<Vec<_>>();

    assert_eq!(keys(sandboxes_to_wake(None, &now, &sandboxes)).len(), 4, "first listing: all");
    assert_eq!(
        keys(sandboxes_to_wake(Some(&before), &now, &sandboxes)),
        ["exited", "came-and-went"],
        "a changed exit, and a Running sandbox whose instance no listing ever saw"
    );
    assert!(sandboxes_to_wake(Some(&now), &now, &sandboxes[..1]).is_empty(), "nothing changed");
}

/// The auto-pause policy through the whole planner: an idle probe condition held long enough
/// pauses with the timers' write plus the marker; the paused sandbox says `AutoPaused=True`;
/// a user's resume is a ManualOverride.
#[test]
fn auto_pause_policy_through_the_planner() {
    use oka_api::conditions::sandbox::auto_paused_reason;
    use oka_api::probes::{ActivityProbe, AutoPausePolicy, PauseRule, SandboxProbe};
    let mut fx = sbx().running().cond(
        "probe.agents.kruise.io/idle",
        FALSE,
        oka_api::conditions::sandbox::probe_reason::FAILED,
    );
    fx.sandbox.spec.probes = Some(vec![SandboxProbe {
        name: "idle".into(),
        activity: Some(ActivityProbe::default()),
        ..SandboxProbe::default()
    }]);
    fx.sandbox.spec.auto_pause_policy = Some(AutoPausePolicy {
        min_running_seconds: 60,
        ..AutoPausePolicy::new(PauseRule { for_seconds: 90, ..PauseRule::new("idle") })
    });
    let sandbox = fx.build();
    let rt = instance(&sandbox, S::Running, None);
    // Condition and Ready since at(-100): held 90 s at at(-10), not yet at at(-20).
    let early = plan_at(&sandbox, Some(&rt), at(-20));
    assert_eq!(summary(&early), "");
    assert_eq!(early.next_action(), Action::requeue_after(Duration::from_secs(10)));
    let plan = plan_at(&sandbox, Some(&rt), at(0));
    assert_eq!(plan.actions, [SandboxAction::SetPaused { until: None, by_policy: true }]);
    // Paused with the marker: AutoPaused=True/ProbeDriven.
    let mut paused = apply_writes(&sandbox, &plan).unwrap();
    paused
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(annotations::PAUSED_BY.into(), annotations::PAUSED_BY_AUTO_PAUSE_POLICY.into());
    let plan = plan_at(&paused, Some(&rt), at(1));
    let next = apply_writes(&paused, &plan).unwrap();
    let c = next.condition(AUTO_PAUSED).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), (TRUE, auto_paused_reason::PROBE_DRIVEN));
    // A user sets spec.paused false, the marker stays: ManualOverride, the marker goes.
    let mut resumed = next.clone();
    resumed.spec.paused = Some(false);
    let plan = plan_at(&resumed, Some(&instance(&resumed, S::Paused, None)), at(2));
    assert!(plan.actions.contains(&SandboxAction::ClearPausedBy), "{}", summary(&plan));
    let next = apply_writes(&resumed, &plan).unwrap();
    let c = next.condition(AUTO_PAUSED).unwrap();
    assert_eq!(c.reason, auto_paused_reason::MANUAL_OVERRIDE);
}
