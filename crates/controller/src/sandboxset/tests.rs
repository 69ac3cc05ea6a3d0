//! The pool planner: a table of scaling cases, the new member and the status, and properties
//! over random pools simulated round by round (convergence, the count invariant, claimed
//! sandboxes untouched, the scale-down order, the fixed point).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use oka_api::common::{PauseStrategy, PauseStrategyType, SandboxTemplateRef};
use oka_api::sandboxset::SandboxSetScaleStrategy;
use oka_api::{SandboxSetSpec, SandboxTemplateSpec};
use proptest::prelude::*;

use super::*;

fn t0() -> Timestamp {
    Timestamp::from_second(1_772_366_400).unwrap()
}

fn at(secs: i64) -> Timestamp {
    t0().checked_add(SignedDuration::from_secs(secs)).unwrap()
}

fn pool(replicas: i32) -> SandboxSet {
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([
                ("app".to_owned(), "agent".to_owned()),
                (labels::SANDBOX_CLAIMED.to_owned(), "true".to_owned()),
            ])),
            annotations: Some(BTreeMap::from([
                ("note".to_owned(), "kept".to_owned()),
                (annotations::CLEANUP_ENABLED.to_owned(), "true".to_owned()),
                (annotations::LOCK.to_owned(), "dropped".to_owned()),
            ])),
            ..ObjectMeta::default()
        }),
        spec: None,
    };
    let mut set = SandboxSet::new(
        "pool",
        SandboxSetSpec { replicas, template: Some(template), ..Default::default() },
    );
    set.metadata.namespace = Some("default".into());
    set.metadata.uid = Some("pool-uid".into());
    set.metadata.generation = Some(1);
    set.metadata.resource_version = Some("5".into());
    set
}

fn max_unavailable(mut set: SandboxSet, value: IntOrString) -> SandboxSet {
    set.spec.scale_strategy = Some(SandboxSetScaleStrategy { max_unavailable: Some(value) });
    set
}

fn revision(set: &SandboxSet) -> String {
    sandbox_set_revision(&set.spec, None)
}

/// A member fixture of the pool above.
#[derive(Clone, Debug)]
struct M(Sandbox);

fn member(name: &str, created: i64) -> M {
    let mut sandbox = Sandbox::test().name(name).pooled("pool").build();
    sandbox.status = None;
    sandbox.metadata.creation_timestamp = Some(Time(at(created)));
    sandbox
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::TEMPLATE_HASH.into(), revision(&pool(1)));
    M(sandbox)
}

impl M {
    fn phase(mut self, phase: SandboxPhase) -> Self {
        self.0.status.get_or_insert_with(Default::default).phase = Some(phase);
        self
    }
    fn ready(mut self, ready: bool) -> Self {
        let status = if ready { "True" } else { "False" };
        let list = self
            .0
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new);
        list.retain(|c| c.type_ != "Ready");
        list.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: "PodReady".into(),
            message: String::new(),
            last_transition_time: Time(t0()),
            observed_generation: None,
        });
        self
    }
    fn pending(self) -> Self {
        self.phase(SandboxPhase::Pending)
    }
    fn available(self) -> Self {
        self.phase(SandboxPhase::Running).ready(true)
    }
    fn not_ready(self) -> Self {
        self.phase(SandboxPhase::Running).ready(false)
    }
    fn reused(mut self, count: i32) -> Self {
        self = self.available();
        self.0.status.get_or_insert_with(Default::default).set_reuse_count(count);
        self
    }
    fn dead(self) -> Self {
        self.phase(SandboxPhase::Failed)
    }
    fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(Time(t0()));
        self
    }
    fn old(mut self) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::TEMPLATE_HASH.into(), "old".into());
        self
    }
    fn locked(mut self) -> Self {
        let a = self.0.metadata.annotations.get_or_insert_with(BTreeMap::new);
        a.insert(annotations::LOCK.into(), "claim-lock".into());
        a.insert(annotations::OWNER.into(), "claim-uid".into());
        self
    }
    /// Claimed the way a claim does it: label flipped, ownerReference removed.
    fn claimed(mut self) -> Self {
        self.0.metadata.owner_references = None;
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::SANDBOX_CLAIMED.into(), "true".into());
        self
    }
    /// Claimed label flipped while the ownerReference is still there.
    fn claim_label_only(mut self) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::SANDBOX_CLAIMED.into(), "true".into());
        self
    }
    fn other_pool(mut self) -> Self {
        if let Some(owner) = self.0.metadata.owner_references.as_mut().and_then(|o| o.first_mut()) {
            owner.uid = "other-uid".into();
        }
        self
    }
    fn arc(self) -> Arc<Sandbox> {
        Arc::new(self.0)
    }
}

fn plan(set: &SandboxSet, members: &[M]) -> Plan<SetAction> {
    let members: Vec<Arc<Sandbox>> = members.iter().cloned().map(M::arc).collect();
    plan_sandbox_set(set, &members, None, t0()).expect("plannable")
}

/// `+2 -a -b xc status(3/1)`: creates, scale-downs (in order), dead deletes, status counts.
fn summary(plan: &Plan<SetAction>) -> String {
    let mut parts = Vec::new();
    let creates = plan.actions.iter().filter(|a| matches!(a, SetAction::Create(_))).count();
    if creates > 0 {
        parts.push(format!("+{creates}"));
    }
    for action in &plan.actions {
        match action {
            SetAction::Create(_) => {}
            SetAction::ScaleDown(s) => {
                parts.push(format!("-{}", s.metadata.name.as_deref().unwrap()))
            }
            SetAction::DeleteDead(s) => {
                parts.push(format!("x{}", s.metadata.name.as_deref().unwrap()))
            }
            SetAction::RollingDelete(s) => {
                parts.push(format!("~{}", s.metadata.name.as_deref().unwrap()))
            }
            SetAction::UpdateStatus(s) => {
                parts.push(format!("status({}/{})", s.replicas, s.available_replicas))
            }
        }
    }
    parts.join(" ")
}

#[test]
fn scaling_table() {
    let cases: Vec<(&str, SandboxSet, Vec<M>, &str)> = vec![
        ("an empty pool creates its replicas", pool(3), vec![], "+3 status(3/0)"),
        (
            "a short pool creates the difference",
            pool(3),
            vec![member("a", 0).available(), member("b", 1).pending()],
            "+1 status(3/1)",
        ),
        (
            "maxUnavailable caps creates",
            max_unavailable(pool(3), IntOrString::Int(1)),
            vec![],
            "+1 status(1/0)",
        ),
        (
            "a percentage is of replicas, rounded up",
            max_unavailable(pool(3), IntOrString::String("50%".into())),
            vec![],
            "+2 status(2/0)",
        ),
        (
            "creating members use up maxUnavailable",
            max_unavailable(pool(3), IntOrString::Int(1)),
            vec![member("a", 0).pending()],
            "status(1/0)",
        ),
        (
            "maxUnavailable does not cap ready members",
            max_unavailable(pool(3), IntOrString::Int(1)),
            vec![member("a", 0).available()],
            "+1 status(2/1)",
        ),
        (
            "a full pool only reports",
            pool(2),
            vec![member("a", 0).available(), member("b", 1).available()],
            "status(2/2)",
        ),
        (
            "a claimed sandbox is replaced",
            pool(1),
            vec![member("a", 0).available().claimed()],
            "+1 status(1/0)",
        ),
        (
            "a sandbox labelled claimed is not counted either",
            pool(1),
            vec![member("a", 0).available().claim_label_only()],
            "+1 status(1/0)",
        ),
        (
            "another pool's sandbox is not counted",
            pool(1),
            vec![member("a", 0).available().other_pool()],
            "+1 status(1/0)",
        ),
        (
            "a dead member is deleted and replaced",
            pool(1),
            vec![member("a", 0).dead()],
            "+1 xa status(1/0)",
        ),
        (
            "a member past its shutdown time is dead",
            pool(1),
            vec![{
                let mut m = member("a", 0).available();
                m.0.spec.shutdown_time = Some(Time(at(-1)));
                m
            }],
            "+1 xa status(1/0)",
        ),
        (
            "a member being deleted counts for nothing",
            pool(1),
            vec![member("a", 0).available().deleting()],
            "+1 status(1/0)",
        ),
        (
            "scale down deletes newest creating first",
            pool(1),
            vec![
                member("old", 0).pending(),
                member("new", 5).pending(),
                member("mid", 2).pending(),
            ],
            "-new -mid status(1/0)",
        ),
        (
            "scale down order: creating, reused (most first), not ready, available (newest first)",
            pool(0),
            vec![
                member("avail-old", 1).available(),
                member("avail-new", 9).available(),
                member("unready", 3).not_ready(),
                member("reused-1", 4).reused(1),
                member("reused-3", 2).reused(3),
                member("pending", 0).pending(),
                member("empty", 8),
            ],
            "-empty -pending -reused-3 -reused-1 -unready -avail-new -avail-old status(0/0)",
        ),
        (
            "a reused member that is not ready is still reused",
            pool(1),
            vec![member("unready", 9).not_ready(), {
                let mut m = member("reused", 1).reused(2);
                m = m.ready(false);
                m
            }],
            "-reused status(1/0)",
        ),
        (
            "an outdated member goes before a current creating one",
            pool(1),
            vec![member("current", 5).pending(), member("outdated", 1).available().old()],
            "-outdated status(1/0)",
        ),
        (
            "a member locked by a claimer is skipped",
            pool(1),
            vec![member("locked", 9).pending().locked(), member("free", 1).available()],
            "-free status(1/0)",
        ),
        (
            "a lock the pool took itself does not protect",
            pool(0),
            vec![{
                let mut m = member("a", 0).available();
                let a = m.0.metadata.annotations.get_or_insert_with(BTreeMap::new);
                a.insert(annotations::LOCK.into(), "x".into());
                a.insert(annotations::OWNER.into(), annotations::OWNER_MANAGER_SCALE_DOWN.into());
                m
            }],
            "-a status(0/0)",
        ),
        (
            "a claimed sandbox is never scaled down",
            pool(0),
            vec![member("a", 0).available().claimed()],
            "status(0/0)",
        ),
    ];
    for (name, set, members, expected) in cases {
        assert_eq!(summary(&plan(&set, &members)), expected, "{name}");
    }
}

#[test]
fn a_deleting_pool_does_nothing() {
    let mut set = pool(3);
    set.metadata.deletion_timestamp = Some(Time(t0()));
    assert_eq!(summary(&plan(&set, &[])), "");
}

#[test]
fn invalid_pools_are_errors() {
    let mut set = pool(1);
    set.spec.template = None;
    set.spec.template_ref = Some(SandboxTemplateRef { name: "base".into(), ..Default::default() });
    assert_eq!(
        plan_sandbox_set(&set, &[], None, t0()),
        Err(InvalidSet::TemplateNotFound("base".into()))
    );
    let bad = max_unavailable(pool(1), IntOrString::String("many".into()));
    assert!(matches!(plan_sandbox_set(&bad, &[], None, t0()), Err(InvalidSet::MaxUnavailable(_))));
}

#[test]
fn a_new_member_carries_the_pool_labels_owner_and_spec() {
    let mut set = pool(1);
    set.spec.pause_strategy =
        Some(PauseStrategy { type_: Some(PauseStrategyType::Stop), ..Default::default() });
    set.spec.persistent_contents = Some(vec!["filesystem".into()]);
    let revision = revision(&set);
    let sandbox = new_pool_sandbox(&set, None, &revision);
    assert_eq!(sandbox.metadata.generate_name.as_deref(), Some("pool-"));
    assert_eq!(sandbox.metadata.name, None);
    assert_eq!(sandbox.metadata.namespace.as_deref(), Some("default"));
    let labels = sandbox.metadata.labels.as_ref().unwrap();
    assert_eq!(labels.get("app").map(String::as_str), Some("agent"));
    assert_eq!(labels.get(labels::SANDBOX_POOL).map(String::as_str), Some("pool"));
    assert_eq!(labels.get(labels::SANDBOX_TEMPLATE).map(String::as_str), Some("pool"));
    assert_eq!(
        labels.get(labels::SANDBOX_CLAIMED).map(String::as_str),
        Some("false"),
        "the template's own value is dropped"
    );
    assert_eq!(labels.get(labels::TEMPLATE_HASH), Some(&revision));
    let annotations = sandbox.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations.get("note").map(String::as_str), Some("kept"));
    assert_eq!(
        annotations.get(annotations::CLEANUP_ENABLED).map(String::as_str),
        Some("true"),
        "preserved key"
    );
    assert!(!annotations.contains_key(annotations::LOCK));
    assert!(sandbox.is_controlled_by_sandbox_set());
    assert_eq!(sandbox.controller_ref().unwrap().uid, "pool-uid");
    assert!(is_member(&sandbox, "pool-uid"));
    assert_eq!(sandbox.spec.pause_strategy, set.spec.pause_strategy);
    assert_eq!(sandbox.spec.persistent_contents, set.spec.persistent_contents);
    assert_eq!(sandbox.spec.template, set.spec.template);
    assert_eq!(sandbox_state(&sandbox, t0()).state, SandboxState::Creating);
}

#[test]
fn a_long_pool_name_is_cut_in_generate_name() {
    let mut set = pool(1);
    set.metadata.name = Some("p".repeat(80));
    let sandbox = new_pool_sandbox(&set, None, "r");
    assert_eq!(sandbox.metadata.generate_name.unwrap().len(), MAX_GENERATE_NAME);
}

#[test]
fn a_template_ref_member_refers_to_the_template() {
    let mut set = pool(1);
    set.spec.template = None;
    set.spec.template_ref = Some(SandboxTemplateRef { name: "base".into(), ..Default::default() });
    let mut template = SandboxTemplate::new(
        "base",
        SandboxTemplateSpec {
            template: pool(1).spec.template,
            pause_strategy: Some(PauseStrategy {
                type_: Some(PauseStrategyType::Hibernate),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    template.metadata.namespace = Some("default".into());
    let plan = plan_sandbox_set(&set, &[], Some(&template), t0()).unwrap();
    let SetAction::Create(sandbox) = &plan.actions[0] else { panic!("{plan:?}") };
    assert_eq!(sandbox.spec.template, None);
    assert_eq!(sandbox.spec.template_ref.as_ref().map(|r| r.name.as_str()), Some("base"));
    assert_eq!(
        sandbox.metadata.labels.as_ref().unwrap().get(labels::SANDBOX_TEMPLATE).map(String::as_str),
        Some("base")
    );
    assert_eq!(
        sandbox.metadata.labels.as_ref().unwrap().get("app").map(String::as_str),
        Some("agent")
    );
    assert_eq!(
        sandbox.spec.pause_strategy, template.spec.pause_strategy,
        "the template's strategy when the pool has none"
    );
    let SetAction::UpdateStatus(status) = plan.actions.last().unwrap() else { panic!() };
    assert_eq!(status.current_revision.as_deref(), Some("base"));
    assert_eq!(status.update_revision, Some(sandbox_set_revision(&set.spec, Some(&template.spec))));
}

#[test]
fn the_status_is_the_outcome_of_the_plan() {
    let set = pool(3);
    let members =
        [member("a", 0).available(), member("b", 1).available().old(), member("c", 2).pending()];
    let plan = plan(&set, &members);
    let Some(SetAction::UpdateStatus(status)) = plan.actions.last() else { panic!("{plan:?}") };
    assert_eq!(status.replicas, 3);
    assert_eq!(status.available_replicas, 2);
    assert_eq!(status.updated_replicas, Some(2));
    assert_eq!(status.updated_available_replicas, Some(1));
    assert_eq!(status.update_revision, Some(revision(&set)));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(
        status.selector.as_deref(),
        Some("agents.kruise.io/sandbox-claimed=false,agents.kruise.io/sandbox-pool=pool")
    );
}

// === Properties: a pool simulated round by round ===

#[derive(Clone, Debug)]
enum Kind {
    Fresh,
    Pending,
    NotReady,
    Available,
    Reused(i32),
    Dead,
    Deleting,
    Claimed,
    OtherPool,
}

fn arb_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        1 => Just(Kind::Fresh),
        1 => Just(Kind::Pending),
        1 => Just(Kind::NotReady),
        3 => Just(Kind::Available),
        1 => (1i32..4).prop_map(Kind::Reused),
        1 => Just(Kind::Dead),
        1 => Just(Kind::Deleting),
        1 => Just(Kind::Claimed),
        1 => Just(Kind::OtherPool),
    ]
}

fn build_member(index: usize, kind: &Kind, created: i64, old: bool) -> Arc<Sandbox> {
    let m = member(&format!("m{index}"), created);
    let m = match kind {
        Kind::Fresh => m,
        Kind::Pending => m.pending(),
        Kind::NotReady => m.not_ready(),
        Kind::Available => m.available(),
        Kind::Reused(n) => m.reused(*n),
        Kind::Dead => m.dead(),
        Kind::Deleting => m.available().deleting(),
        Kind::Claimed => m.available().claimed(),
        Kind::OtherPool => m.available().other_pool(),
    };
    if old { m.old().arc() } else { m.arc() }
}

prop_compose! {
    fn arb_pool()(
        replicas in 0i32..8,
        cap in proptest::option::of(prop_oneof![
            (1i32..4).prop_map(IntOrString::Int),
            (1i32..101).prop_map(|p| IntOrString::String(format!("{p}%"))),
        ]),
        members in proptest::collection::vec((arb_kind(), 0i64..50, any::<bool>()), 0..12),
    ) -> (SandboxSet, Vec<Arc<Sandbox>>) {
        let mut set = pool(replicas);
        if let Some(cap) = cap { set = max_unavailable(set, cap); }
        let members = members.iter().enumerate().map(|(i, (kind, created, old))| build_member(i, kind, *created, *old)).collect();
        (set, members)
    }
}

fn counted(set: &SandboxSet, sandboxes: &[Arc<Sandbox>]) -> usize {
    let uid = set.metadata.uid.as_deref().unwrap();
    sandboxes
        .iter()
        .filter(|s| is_member(s, uid) && s.metadata.deletion_timestamp.is_none())
        .filter(|s| {
            matches!(sandbox_state(s, t0()).state, SandboxState::Creating | SandboxState::Available)
        })
        .count()
}

/// Applies a plan the way the store and executor would.
fn apply(
    set: &mut SandboxSet,
    sandboxes: &mut Vec<Arc<Sandbox>>,
    plan: &Plan<SetAction>,
    next: &mut usize,
) {
    for action in &plan.actions {
        match action {
            SetAction::Create(sandbox) => {
                let mut sandbox = (**sandbox).clone();
                *next += 1;
                sandbox.metadata.name = Some(format!("new{next}"));
                sandbox.metadata.uid = Some(format!("new{next}-uid"));
                sandbox.metadata.creation_timestamp = Some(Time(at(100 + *next as i64)));
                sandboxes.push(Arc::new(sandbox));
            }
            SetAction::ScaleDown(gone)
            | SetAction::DeleteDead(gone)
            | SetAction::RollingDelete(gone) => {
                sandboxes.retain(|s| s.metadata.name != gone.metadata.name);
            }
            SetAction::UpdateStatus(status) => set.status = Some((**status).clone()),
        }
    }
}

/// The world between two rounds: every member still creating becomes available.
fn become_ready(sandboxes: &mut [Arc<Sandbox>]) {
    for sandbox in sandboxes.iter_mut() {
        if sandbox_state(sandbox, t0()).state == SandboxState::Creating {
            *sandbox = M((**sandbox).clone()).available().arc();
        }
    }
}

fn deleted_names(plan: &Plan<SetAction>) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            SetAction::ScaleDown(s) | SetAction::DeleteDead(s) | SetAction::RollingDelete(s) => {
                s.metadata.name.clone()
            }
            _ => None,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

    /// From any starting state the pool reaches `replicas` unclaimed members within
    /// `replicas + 3` rounds and then plans nothing; no round overshoots, and a round that
    /// starts at or above `replicas` ends exactly at it.
    #[test]
    fn the_pool_converges_to_its_replicas((set, sandboxes) in arb_pool()) {
        let (mut set, mut sandboxes) = (set, sandboxes);
        let desired = set.spec.replicas as usize;
        let mut next = 0;
        let mut rounds = 0;
        loop {
            let plan = plan_sandbox_set(&set, &sandboxes, None, t0()).unwrap();
            if plan.actions.is_empty() { break; }
            rounds += 1;
            prop_assert!(rounds <= desired + 3, "no convergence after {} rounds: {}", rounds, summary(&plan));
            let before = counted(&set, &sandboxes);
            apply(&mut set, &mut sandboxes, &plan, &mut next);
            let after = counted(&set, &sandboxes);
            prop_assert!(after <= desired.max(before), "overshot: {} → {} for {}", before, after, desired);
            if before >= desired { prop_assert_eq!(after, desired); }
            become_ready(&mut sandboxes);
        }
        prop_assert_eq!(counted(&set, &sandboxes), desired);
        let status = set.status.clone().unwrap();
        prop_assert_eq!(status.replicas as usize, desired);
        prop_assert_eq!(status.available_replicas as usize, desired);
    }

    /// Nothing but the pool's own unclaimed members is ever deleted: claimed sandboxes and
    /// other pools' sandboxes survive every plan.
    #[test]
    fn a_claimed_sandbox_is_never_deleted_by_its_pool((set, sandboxes) in arb_pool()) {
        let plan = plan_sandbox_set(&set, &sandboxes, None, t0()).unwrap();
        for name in deleted_names(&plan) {
            let sandbox = sandboxes.iter().find(|s| s.metadata.name.as_deref() == Some(&name)).unwrap();
            prop_assert!(is_member(sandbox, "pool-uid"), "{} is not the pool's", name);
            prop_assert!(sandbox.metadata.deletion_timestamp.is_none());
        }
    }

    /// Every member scaled down ranks before every candidate kept.
    #[test]
    fn the_scale_down_order_holds((set, sandboxes) in arb_pool()) {
        let plan = plan_sandbox_set(&set, &sandboxes, None, t0()).unwrap();
        let revision = revision(&set);
        let removed: Vec<&Arc<Sandbox>> = plan.actions.iter().filter_map(|a| match a {
            SetAction::ScaleDown(s) => Some(s),
            _ => None,
        }).collect();
        if removed.is_empty() { return Ok(()); }
        let kept = sandboxes.iter().filter(|s| is_member(s, "pool-uid") && s.metadata.deletion_timestamp.is_none())
            .filter(|s| matches!(sandbox_state(s, t0()).state, SandboxState::Creating | SandboxState::Available))
            .filter(|s| !removed.iter().any(|r| r.metadata.name == s.metadata.name));
        let last = removed.iter().map(|s| scale_down_rank(s, &revision)).max().unwrap();
        for sandbox in kept {
            prop_assert!(scale_down_rank(sandbox, &revision) > last, "{:?} kept before a removed one", sandbox.metadata.name);
        }
        // And the plan lists them in that order.
        let ranks: Vec<_> = removed.iter().map(|s| scale_down_rank(s, &revision)).collect();
        prop_assert!(ranks.windows(2).all(|w| w[0] <= w[1]));
    }

    /// Re-planning after the plan was applied (nothing else happening) plans nothing: the
    /// status written is the plan's own outcome.
    #[test]
    fn replanning_what_was_written_writes_nothing((set, sandboxes) in arb_pool()) {
        let (mut set, mut sandboxes) = (set, sandboxes);
        let plan = plan_sandbox_set(&set, &sandboxes, None, t0()).unwrap();
        apply(&mut set, &mut sandboxes, &plan, &mut 0);
        let set: SandboxSet = serde_json::from_value(serde_json::to_value(&set).unwrap()).unwrap();
        let again = plan_sandbox_set(&set, &sandboxes, None, t0()).unwrap();
        prop_assert!(again.actions.is_empty(), "second plan {} after {}", summary(&again), summary(&plan));
    }
}

// === Rolling update ===

fn update_max_unavailable_of(mut set: SandboxSet, value: IntOrString) -> SandboxSet {
    set.spec.update_strategy =
        Some(oka_api::sandboxset::SandboxSetUpdateStrategy { max_unavailable: Some(value) });
    set
}

#[test]
fn rolling_update_table() {
    let cases: Vec<(&str, SandboxSet, Vec<M>, &str)> = vec![
        (
            "the default budget is 20% of replicas rounded up: one of three",
            pool(3),
            vec![
                member("a", 0).available().old(),
                member("b", 1).available().old(),
                member("c", 2).available().old(),
            ],
            "+1 ~a status(3/2)",
        ),
        (
            "old creating members are all replaced, whatever the budget",
            pool(3),
            vec![
                member("a", 0).pending().old(),
                member("b", 1).pending().old(),
                member("c", 2).available().old(),
            ],
            "+2 ~a ~b status(3/1)",
        ),
        (
            "a budget spent on new creating members waits",
            pool(3),
            vec![
                member("a", 0).available().old(),
                member("b", 1).pending(),
                member("c", 2).available(),
            ],
            "status(3/2)",
        ),
        (
            "a count budget, oldest first",
            update_max_unavailable_of(pool(4), IntOrString::Int(2)),
            vec![
                member("d", 3).available().old(),
                member("a", 0).available().old(),
                member("c", 2).available().old(),
                member("b", 1).available(),
            ],
            "+2 ~a ~c status(4/2)",
        ),
        (
            "a member a claimer locked is left alone",
            update_max_unavailable_of(pool(2), IntOrString::Int(2)),
            vec![member("a", 0).available().old().locked(), member("b", 1).available().old()],
            "+1 ~b status(2/1)",
        ),
        (
            "a claimed sandbox is not a member and is never rolled",
            pool(1),
            vec![member("a", 0).available().old().claimed(), member("b", 1).available()],
            "status(1/1)",
        ),
        (
            "no rolling while the pool scales up; the new members are of the new revision",
            pool(3),
            vec![member("a", 0).available().old()],
            "+2 status(3/1)",
        ),
        (
            "a budget of 0% rolls nothing",
            update_max_unavailable_of(pool(3), IntOrString::String("0%".into())),
            vec![
                member("a", 0).available().old(),
                member("b", 1).available(),
                member("c", 2).available(),
            ],
            "status(3/3)",
        ),
    ];
    for (name, set, members, expected) in cases {
        assert_eq!(summary(&plan(&set, &members)), expected, "{name}");
    }
}

#[test]
fn the_rolling_status_counts_the_updated_members() {
    let set = pool(3);
    let members = [
        member("a", 0).available().old(),
        member("b", 1).available(),
        member("c", 2).available().old(),
    ];
    let plan = plan(&set, &members);
    let Some(SetAction::UpdateStatus(status)) = plan.actions.last() else { panic!("{plan:?}") };
    // `a` is replaced by a new (creating) member; `b` is updated and available.
    assert_eq!(status.updated_replicas, Some(2));
    assert_eq!(status.updated_available_replicas, Some(1));
    assert_eq!(status.current_revision, Some(materialized_name("pool", &revision(&set))));
}

/// Members the reference labelled with another form of the pool's revision (its legacy v0.3
/// revision, or the revision of newer Kubernetes libraries) are up to date: a pool taken over
/// is not rolled, and they count as updated.
#[test]
fn members_of_the_reference_s_other_revisions_are_not_rolled() {
    let set = pool(3);
    let accepted = accepted_sandbox_set_revisions(&set.spec, None);
    assert_eq!(accepted.len(), 3, "{accepted:?}");
    let labelled = |m: M, hash: &str| {
        let mut m = m;
        m.0.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::TEMPLATE_HASH.into(), hash.into());
        m
    };
    let members = [
        labelled(member("a", 0).available(), &accepted[0]),
        labelled(member("b", 1).available(), &accepted[1]),
        labelled(member("c", 2).available(), &accepted[2]),
    ];
    let taken_over = plan(&set, &members);
    assert!(
        taken_over.actions.iter().all(|a| matches!(a, SetAction::UpdateStatus(_))),
        "{taken_over:?}"
    );
    let Some(SetAction::UpdateStatus(status)) = taken_over.actions.last() else {
        panic!("{taken_over:?}")
    };
    assert_eq!(status.updated_replicas, Some(3));
    assert_eq!(status.updated_available_replicas, Some(3));
    assert_eq!(status.update_revision, Some(revision(&set)));
    // Anything else is old, and is rolled.
    let members = [member("a", 0).available().old(), member("b", 1).available()];
    let rolled = plan(&pool(2), &members);
    assert!(rolled.actions.iter().any(|a| matches!(a, SetAction::RollingDelete(_))), "{rolled:?}");
}

#[test]
fn an_invalid_update_budget_is_refused() {
    let set = update_max_unavailable_of(pool(3), IntOrString::String("half".into()));
    assert_eq!(
        plan_sandbox_set(&set, &[], None, t0()),
        Err(InvalidSet::UpdateMaxUnavailable("half".into()))
    );
}

/// The members of the pool not available: the rolling update's "unavailable".
fn creating_members(sandboxes: &[Arc<Sandbox>]) -> usize {
    sandboxes
        .iter()
        .filter(|s| is_member(s, "pool-uid") && s.metadata.deletion_timestamp.is_none())
        .filter(|s| sandbox_state(s, t0()).state == SandboxState::Creating)
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// A pool of old members rolls to the new revision: no round leaves more members
    /// unavailable than the budget, no claimed sandbox is touched, the pool keeps its size,
    /// and every member ends at the new revision, with `updatedReplicas == replicas`. Between
    /// rounds only some creating members become ready (`ready_mask`), as in a slow world.
    #[test]
    fn a_rolling_update_stays_in_budget_and_converges(
        replicas in 1usize..40,
        claimed in 0usize..5,
        budget in prop_oneof![
            (1i32..10).prop_map(IntOrString::Int),
            (1i32..=100).prop_map(|p| IntOrString::String(format!("{p}%"))),
        ],
        ready_mask in proptest::collection::vec(any::<bool>(), 64),
    ) {
        let mut set = update_max_unavailable_of(pool(replicas as i32), budget);
        let limit = update_max_unavailable(&set).unwrap() as usize;
        let mut sandboxes: Vec<Arc<Sandbox>> = (0..replicas)
            .map(|i| member(&format!("m{i}"), i as i64).available().old().arc())
            .chain((0..claimed).map(|i| member(&format!("c{i}"), 0).available().old().claimed().arc()))
            .collect();
        let claimed_before: Vec<Arc<Sandbox>> = sandboxes.iter().filter(|s| !is_member(s, "pool-uid")).cloned().collect();
        let mut next = 0;
        let mut round = 0;
        loop {
            let plan = plan_sandbox_set(&set, &sandboxes, None, t0()).unwrap();
            if plan.actions.is_empty() { break; }
            round += 1;
            prop_assert!(round <= 4 * replicas + 10, "no convergence: {}", summary(&plan));
            apply(&mut set, &mut sandboxes, &plan, &mut next);
            prop_assert!(creating_members(&sandboxes) <= limit, "{} unavailable > {}", creating_members(&sandboxes), limit);
            prop_assert_eq!(counted(&set, &sandboxes), replicas);
            for before in &claimed_before {
                prop_assert!(sandboxes.iter().any(|s| s == before), "claimed {:?} touched", before.metadata.name);
            }
            // Some creating members become ready; when none would, one does (time passes).
            let mut any = false;
            for (i, sandbox) in sandboxes.iter_mut().enumerate() {
                if sandbox_state(sandbox, t0()).state == SandboxState::Creating && ready_mask[(i + round) % 64] {
                    *sandbox = M((**sandbox).clone()).available().arc();
                    any = true;
                }
            }
            if !any
                && let Some(sandbox) = sandboxes
                    .iter_mut()
                    .find(|s| sandbox_state(s, t0()).state == SandboxState::Creating)
            {
                *sandbox = M((**sandbox).clone()).available().arc();
            }
        }
        let revision = revision(&set);
        for sandbox in sandboxes.iter().filter(|s| is_member(s, "pool-uid")) {
            prop_assert_eq!(template_hash(sandbox), Some(revision.as_str()));
        }
        let status = set.status.clone().unwrap();
        prop_assert_eq!(status.updated_replicas, Some(replicas as i32));
        prop_assert_eq!(status.updated_available_replicas, Some(replicas as i32));
    }
}

#[test]
fn members_carry_the_pools_probes_and_auto_pause_policy_without_a_new_revision() {
    use oka_api::probes::{AutoPausePolicy, PauseRule, SandboxProbe};
    let probe = |name: &str| -> SandboxProbe {
        serde_json::from_value(serde_json::json!({"name": name, "activity": {}})).unwrap()
    };
    let policy = |probe: &str| AutoPausePolicy::new(PauseRule::new(probe));
    // The set's own.
    let mut set = pool(1);
    let before = crate::revision::sandbox_set_revision(&set.spec, None);
    set.spec.probes = Some(vec![probe("idle")]);
    set.spec.auto_pause_policy = Some(policy("idle"));
    assert_eq!(
        crate::revision::sandbox_set_revision(&set.spec, None),
        before,
        "probes and the policy are not part of the revision: adding them rolls nothing"
    );
    let member = new_pool_sandbox(&set, None, "r");
    assert_eq!(member.spec.probes, Some(vec![probe("idle")]));
    assert_eq!(member.spec.auto_pause_policy, Some(policy("idle")));
    // The referenced SandboxTemplate's, where the set has none; the set's win.
    let mut referencing = pool(1);
    referencing.spec.template = None;
    referencing.spec.template_ref =
        Some(SandboxTemplateRef { name: "base".into(), ..Default::default() });
    let mut template = SandboxTemplate::new(
        "base",
        SandboxTemplateSpec {
            template: pool(1).spec.template,
            probes: Some(vec![probe("quiet")]),
            auto_pause_policy: Some(policy("quiet")),
            ..Default::default()
        },
    );
    template.metadata.namespace = Some("default".into());
    let plan = plan_sandbox_set(&referencing, &[], Some(&template), t0()).unwrap();
    let SetAction::Create(member) = &plan.actions[0] else { panic!("{plan:?}") };
    assert_eq!(member.spec.probes, Some(vec![probe("quiet")]));
    assert_eq!(member.spec.auto_pause_policy, Some(policy("quiet")));
    referencing.spec.auto_pause_policy = Some(policy("own"));
    let member = new_pool_sandbox(&referencing, Some(&template), "r");
    assert_eq!(member.spec.auto_pause_policy, Some(policy("own")), "the set's wins");
    assert_eq!(member.spec.probes, Some(vec![probe("quiet")]), "per field");
    // A member's own revision ignores them too, so a claimed sandbox never updates in place
    // for them.
    let mut bare = member.clone();
    bare.spec.probes = None;
    bare.spec.auto_pause_policy = None;
    assert_eq!(
        crate::revision::sandbox_revision(&member.spec),
        crate::revision::sandbox_revision(&bare.spec)
    );
}
