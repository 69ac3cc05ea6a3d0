//! The embedded store against a model: random sequences of operations (create, update,
//! status update, finalizer changes, delete with owner cascade, get, list, watch from a past
//! version, restart) run against the store and against a plain `BTreeMap` model kept in step.
//! Results, errors, resourceVersions, the final contents and the exact event sequence every
//! watcher saw (including a selector watcher) must match the model's.

// Test helpers panic on failure: in a test, a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use oka_store::embedded::{EmbeddedOptions, EmbeddedStore};
use oka_store::{Deleted, Object, Preconditions, Selector, Store, StoreError, WatchStream};
use proptest::prelude::*;

const HISTORY: usize = 32;
/// Kind 0 sorts before kind 1 by storage key (`gadgets.…` < `widgets.…`), as in the store.
const GADGET: usize = 0;
const WIDGET: usize = 1;
const RED: u8 = 0;

/// What the tests need to drive either kind the same way.
trait TestKind: Object + Fixture {
    fn make(name: &str, spec: u8) -> Self;
    fn spec(&self) -> u8;
    fn set_spec(&mut self, spec: u8);
    fn status(&self) -> Option<u8>;
    fn set_status(&mut self, status: Option<u8>);
}

impl TestKind for Widget {
    fn make(name: &str, spec: u8) -> Self {
        Widget::new(name, WidgetSpec { size: i32::from(spec), color: String::new() })
    }
    fn spec(&self) -> u8 {
        u8::try_from(self.spec.size).unwrap()
    }
    fn set_spec(&mut self, spec: u8) {
        self.spec.size = i32::from(spec);
    }
    fn status(&self) -> Option<u8> {
        self.status.as_ref().map(|s| s.phase[1..].parse().unwrap())
    }
    fn set_status(&mut self, status: Option<u8>) {
        self.status = status.map(|s| WidgetStatus { phase: format!("p{s}") });
    }
}

impl TestKind for Gadget {
    fn make(name: &str, spec: u8) -> Self {
        Gadget::new(name, GadgetSpec { mode: format!("m{spec}") })
    }
    fn spec(&self) -> u8 {
        self.spec.mode[1..].parse().unwrap()
    }
    fn set_spec(&mut self, spec: u8) {
        self.spec.mode = format!("m{spec}");
    }
    fn status(&self) -> Option<u8> {
        self.status.as_ref().map(|s| u8::from(s.ready))
    }
    fn set_status(&mut self, status: Option<u8>) {
        self.status = status.map(|s| GadgetStatus { ready: s == 1 });
    }
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        kind: usize,
        name: u8,
        spec: u8,
        color: Option<u8>,
        finalizers: u8,
        owners: Vec<u8>,
        generate: bool,
    },
    Update {
        kind: usize,
        name: u8,
        stale: bool,
        spec: u8,
        color: Option<u8>,
    },
    UpdateStatus {
        kind: usize,
        name: u8,
        stale: bool,
        status: Option<u8>,
    },
    AddFinalizer {
        kind: usize,
        name: u8,
        which: u8,
    },
    RemoveFinalizer {
        kind: usize,
        name: u8,
        which: u8,
    },
    Delete {
        kind: usize,
        name: u8,
        stale: bool,
    },
    Get {
        kind: usize,
        name: u8,
    },
    List {
        kind: usize,
        red_only: bool,
    },
    WatchFrom {
        back: u8,
    },
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let kind = 0..2usize;
    let name = 0..3u8;
    let color = proptest::option::of(0..2u8);
    // Half the objects have no finalizer, so that deletes remove and cascade.
    let finalizers = prop_oneof![Just(0u8), 1..4u8];
    // Owners are picked among the objects that exist when the create runs.
    let owners = proptest::collection::vec(any::<u8>(), 0..3);
    prop_oneof![
        5 => (kind.clone(), name.clone(), 0..3u8, color.clone(), finalizers, owners,
              proptest::bool::weighted(0.1))
            .prop_map(|(kind, name, spec, color, finalizers, owners, generate)|
                Op::Create { kind, name, spec, color, finalizers, owners, generate }),
        3 => (kind.clone(), name.clone(), any::<bool>(), 0..3u8, color)
            .prop_map(|(kind, name, stale, spec, color)| Op::Update { kind, name, stale, spec, color }),
        2 => (kind.clone(), name.clone(), proptest::bool::weighted(0.2), proptest::option::of(0..2u8))
            .prop_map(|(kind, name, stale, status)| Op::UpdateStatus { kind, name, stale, status }),
        2 => (kind.clone(), name.clone(), 0..2u8)
            .prop_map(|(kind, name, which)| Op::AddFinalizer { kind, name, which }),
        3 => (kind.clone(), name.clone(), 0..2u8)
            .prop_map(|(kind, name, which)| Op::RemoveFinalizer { kind, name, which }),
        4 => (kind.clone(), name.clone(), proptest::bool::weighted(0.2))
            .prop_map(|(kind, name, stale)| Op::Delete { kind, name, stale }),
        1 => (kind.clone(), name).prop_map(|(kind, name)| Op::Get { kind, name }),
        1 => (kind, any::<bool>()).prop_map(|(kind, red_only)| Op::List { kind, red_only }),
        1 => (0..40u8).prop_map(|back| Op::WatchFrom { back }),
        1 => Just(Op::Restart),
    ]
}

// ---------------------------------------------------------------------------------------------
// The model

#[derive(Debug, Clone, PartialEq)]
struct MObj {
    name: String,
    uid: String,
    rv: u64,
    generation: i64,
    spec: u8,
    color: Option<u8>,
    finalizers: Vec<String>,
    owners: Vec<String>,
    status: Option<u8>,
    deleting: bool,
}

impl MObj {
    fn red(&self) -> bool {
        self.color == Some(RED)
    }

    fn of<K: TestKind>(k: &K) -> MObj {
        let meta = k.meta();
        MObj {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            rv: k.rv(),
            generation: meta.generation.unwrap_or_default(),
            spec: k.spec(),
            color: meta.labels.as_ref().and_then(|l| l.get("color")).map(|c| color_index(c)),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            owners: meta.owner_references.iter().flatten().map(|r| r.uid.clone()).collect(),
            status: k.status(),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }
}

fn color_name(c: u8) -> &'static str {
    if c == RED { "red" } else { "blue" }
}

fn color_index(c: &str) -> u8 {
    if c == "red" { RED } else { 1 }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug, Clone, PartialEq)]
struct MEvent {
    kind: usize,
    ty: Ty,
    name: String,
    rv: u64,
    prev_red: bool,
    cur_red: bool,
}

/// A result as the test compares it.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok(MObj),
    Finalizing(MObj),
    Gone(MObj),
    NotFound,
    AlreadyExists,
    Conflict,
    Invalid,
    Other(String),
}

fn outcome_of<K: TestKind>(r: Result<K, StoreError>) -> Outcome {
    match r {
        Ok(k) => Outcome::Ok(MObj::of(&k)),
        Err(e) => error_outcome(e),
    }
}

fn error_outcome(e: StoreError) -> Outcome {
    match e {
        StoreError::NotFound { .. } => Outcome::NotFound,
        StoreError::AlreadyExists { .. } => Outcome::AlreadyExists,
        StoreError::Conflict { .. } => Outcome::Conflict,
        StoreError::Invalid(_) => Outcome::Invalid,
        other => Outcome::Other(other.to_string()),
    }
}

#[derive(Default)]
struct Model {
    objs: BTreeMap<(usize, String), MObj>,
    rv: u64,
    events: Vec<MEvent>,
    /// The resourceVersion at the last (re)open: the history starts there.
    opened_at: u64,
}

impl Model {
    fn get(&self, kind: usize, name: &str) -> Outcome {
        match self.objs.get(&(kind, name.to_owned())) {
            Some(o) => Outcome::Ok(o.clone()),
            None => Outcome::NotFound,
        }
    }

    fn uid_exists(&self, uid: &str) -> bool {
        self.objs.values().any(|o| o.uid == uid)
    }

    fn put(&mut self, kind: usize, ty: Ty, mut obj: MObj, prev: Option<&MObj>) -> MObj {
        self.rv += 1;
        obj.rv = self.rv;
        self.events.push(MEvent {
            kind,
            ty,
            name: obj.name.clone(),
            rv: self.rv,
            prev_red: prev.is_some_and(MObj::red),
            cur_red: obj.red(),
        });
        self.objs.insert((kind, obj.name.clone()), obj.clone());
        obj
    }

    /// Removes `(kind, name)`, whose last state is `last`, and runs the cascade.
    fn remove(&mut self, kind: usize, last: MObj) -> MObj {
        let uid = last.uid.clone();
        let last = self.remove_one(kind, last);
        self.cascade(uid);
        last
    }

    /// Removes `(kind, name)`, whose last state is `last`; the caller runs the cascade.
    fn remove_one(&mut self, kind: usize, mut last: MObj) -> MObj {
        let prev = self.objs.remove(&(kind, last.name.clone())).expect("removing a present object");
        self.rv += 1;
        last.rv = self.rv;
        self.events.push(MEvent {
            kind,
            ty: Ty::Deleted,
            name: last.name.clone(),
            rv: self.rv,
            prev_red: prev.red(),
            cur_red: false,
        });
        last
    }

    fn mark_deleting(&mut self, kind: usize, obj: &MObj) -> MObj {
        let mut new = obj.clone();
        new.deleting = true;
        new.generation += 1;
        self.put(kind, Ty::Modified, new, Some(obj))
    }

    fn cascade(&mut self, uid: String) {
        let mut queue = std::collections::VecDeque::from([uid]);
        while let Some(owner) = queue.pop_front() {
            let deps: Vec<(usize, String)> = self
                .objs
                .iter()
                .filter(|(_, o)| o.owners.contains(&owner))
                .map(|(k, _)| k.clone())
                .collect();
            for key in deps {
                let Some(dep) = self.objs.get(&key).cloned() else { continue };
                if !dep.owners.contains(&owner) {
                    continue;
                }
                let other_live = dep.owners.iter().any(|u| *u != owner && self.uid_exists(u));
                if other_live {
                    let mut new = dep.clone();
                    new.owners.retain(|u| *u != owner);
                    self.put(key.0, Ty::Modified, new, Some(&dep));
                } else if dep.deleting {
                } else if !dep.finalizers.is_empty() {
                    self.mark_deleting(key.0, &dep);
                } else {
                    self.remove_one(key.0, dep.clone());
                    queue.push_back(dep.uid);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        kind: usize,
        name: Option<&str>,
        spec: u8,
        color: Option<u8>,
        finalizers: Vec<String>,
        owners: Vec<String>,
        assigned: Option<(String, String)>,
    ) -> Outcome {
        if let Some(name) = name
            && self.objs.contains_key(&(kind, name.to_owned()))
        {
            return Outcome::AlreadyExists;
        }
        let (assigned_name, uid) = assigned.unwrap_or_default();
        let obj = MObj {
            name: name.map_or(assigned_name, str::to_owned),
            uid,
            rv: 0,
            generation: 1,
            spec,
            color,
            finalizers,
            owners,
            status: None,
            deleting: false,
        };
        Outcome::Ok(self.put(kind, Ty::Added, obj, None))
    }

    /// An update (of spec and metadata) computed by `change` on the current object.
    fn update(
        &mut self,
        kind: usize,
        name: &str,
        stale: bool,
        change: impl FnOnce(&mut MObj),
    ) -> Outcome {
        let Some(old) = self.objs.get(&(kind, name.to_owned())).cloned() else {
            return Outcome::NotFound;
        };
        if stale {
            return Outcome::Conflict;
        }
        let mut new = old.clone();
        change(&mut new);
        if old.deleting && new.finalizers.iter().any(|f| !old.finalizers.contains(f)) {
            return Outcome::Invalid;
        }
        if new.spec != old.spec {
            new.generation += 1;
        }
        if new == old {
            return Outcome::Ok(old);
        }
        if old.deleting && new.finalizers.is_empty() {
            return Outcome::Ok(self.remove(kind, new));
        }
        Outcome::Ok(self.put(kind, Ty::Modified, new, Some(&old)))
    }

    fn update_status(
        &mut self,
        kind: usize,
        name: &str,
        stale: bool,
        status: Option<u8>,
    ) -> Outcome {
        let Some(old) = self.objs.get(&(kind, name.to_owned())).cloned() else {
            return Outcome::NotFound;
        };
        if stale {
            return Outcome::Conflict;
        }
        if old.status == status {
            return Outcome::Ok(old);
        }
        let mut new = old.clone();
        new.status = status;
        Outcome::Ok(self.put(kind, Ty::Modified, new, Some(&old)))
    }

    fn delete(&mut self, kind: usize, name: &str, stale: bool) -> Outcome {
        let Some(old) = self.objs.get(&(kind, name.to_owned())).cloned() else {
            return Outcome::NotFound;
        };
        if stale {
            return Outcome::Conflict;
        }
        if old.deleting {
            return Outcome::Finalizing(old);
        }
        if !old.finalizers.is_empty() {
            return Outcome::Finalizing(self.mark_deleting(kind, &old));
        }
        Outcome::Gone(self.remove(kind, old.clone()))
    }

    /// The oldest resourceVersion a watch can start from.
    fn oldest_watchable(&self) -> u64 {
        self.opened_at.max(self.rv.saturating_sub(HISTORY as u64))
    }

    /// What a watcher of `kind` (all objects, or only red ones) sees after `from`.
    fn expected(&self, kind: usize, red_only: bool, from: u64) -> Vec<(&'static str, String, u64)> {
        self.events
            .iter()
            .filter(|e| e.kind == kind && e.rv > from)
            .filter_map(|e| {
                let ty = if !red_only {
                    match e.ty {
                        Ty::Added => "Added",
                        Ty::Modified => "Modified",
                        Ty::Deleted => "Deleted",
                    }
                } else {
                    match (e.ty, e.prev_red, e.cur_red) {
                        (Ty::Deleted, true, _) | (_, true, false) => "Deleted",
                        (Ty::Deleted, false, _) | (_, false, false) => return None,
                        (_, false, true) => "Added",
                        (_, true, true) => "Modified",
                    }
                };
                Some((ty, e.name.clone(), e.rv))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The harness

fn options() -> EmbeddedOptions {
    EmbeddedOptions { history_size: HISTORY, ..EmbeddedOptions::default() }
}

struct Watchers {
    widgets: WatchStream<Widget>,
    gadgets: WatchStream<Gadget>,
    red_widgets: WatchStream<Widget>,
}

#[derive(Default)]
struct Seen {
    widgets: Vec<(&'static str, String, u64)>,
    gadgets: Vec<(&'static str, String, u64)>,
    red_widgets: Vec<(&'static str, String, u64)>,
}

impl Watchers {
    async fn start(store: &EmbeddedStore) -> Watchers {
        let all = Selector::everything();
        let red: Selector = "color=red".parse().unwrap();
        Watchers {
            widgets: store.watch(None, &all, "").await.unwrap(),
            gadgets: store.watch(None, &all, "").await.unwrap(),
            red_widgets: store.watch(Some(NS), &red, "").await.unwrap(),
        }
    }

    fn drain(&mut self, seen: &mut Seen) {
        seen.widgets.extend(ready(&mut self.widgets).iter().map(summary));
        seen.gadgets.extend(ready(&mut self.gadgets).iter().map(summary));
        seen.red_widgets.extend(ready(&mut self.red_widgets).iter().map(summary));
    }
}

fn name_of(n: u8) -> String {
    format!("n{n}")
}

fn set_color<K: TestKind>(k: &mut K, color: Option<u8>) {
    let labels = k.meta_mut().labels.get_or_insert_with(BTreeMap::new);
    match color {
        Some(c) => labels.insert("color".into(), color_name(c).into()),
        None => labels.remove("color"),
    };
}

fn owner_ref(model: &Model, kind: usize, name: &str) -> Option<OwnerReference> {
    let obj = model.objs.get(&(kind, name.to_owned()))?;
    let (api_version, k) = if kind == WIDGET {
        ("test.oka.dev/v1", "Widget")
    } else {
        ("other.oka.dev/v1beta1", "Gadget")
    };
    Some(OwnerReference {
        api_version: api_version.into(),
        kind: k.into(),
        name: name.into(),
        uid: obj.uid.clone(),
        ..OwnerReference::default()
    })
}

/// Runs `op` on the store and the model; returns (store outcome, model outcome).
async fn step<K: TestKind>(
    store: &EmbeddedStore,
    model: &mut Model,
    kind: usize,
    op: &Op,
) -> (Outcome, Outcome) {
    match op {
        Op::Create { name, spec, color, finalizers, owners, generate, .. } => {
            let name = name_of(*name);
            let mut obj = K::make(if *generate { "" } else { &name }, *spec);
            if *generate {
                obj.meta_mut().name = None;
                obj.meta_mut().generate_name = Some("gen-".into());
            }
            set_color(&mut obj, *color);
            let fins: Vec<String> = (0..2)
                .filter(|i| finalizers & (1 << i) != 0)
                .map(|i| format!("test.oka.dev/f{i}"))
                .collect();
            obj.meta_mut().finalizers = Some(fins.clone());
            let existing: Vec<(usize, String)> = model.objs.keys().cloned().collect();
            let refs: Vec<OwnerReference> = owners
                .iter()
                .filter(|_| !existing.is_empty())
                .filter_map(|i| {
                    let (k, n) = &existing[usize::from(*i) % existing.len()];
                    owner_ref(model, *k, n)
                })
                .collect();
            let owner_uids = refs.iter().map(|r| r.uid.clone()).collect();
            obj.meta_mut().owner_references = Some(refs);
            let actual = outcome_of(store.create(NS, &obj).await);
            let assigned = match &actual {
                Outcome::Ok(o) => Some((o.name.clone(), o.uid.clone())),
                _ => None,
            };
            let requested = if *generate { None } else { Some(name.as_str()) };
            let expected = model.create(kind, requested, *spec, *color, fins, owner_uids, assigned);
            (actual, expected)
        }
        Op::Update { name, stale, spec, color, .. } => {
            let name = name_of(*name);
            let obj = match store.get::<K>(NS, &name).await {
                Ok(mut o) => {
                    o.set_spec(*spec);
                    set_color(&mut o, *color);
                    if *stale {
                        o.meta_mut().resource_version = Some("0".into());
                    }
                    o
                }
                Err(_) => K::make(&name, *spec),
            };
            let actual = outcome_of(store.update(NS, &obj).await);
            let (spec, color) = (*spec, *color);
            let expected = model.update(kind, &name, *stale, |o| {
                o.spec = spec;
                o.color = color;
            });
            (actual, expected)
        }
        Op::UpdateStatus { name, stale, status, .. } => {
            let name = name_of(*name);
            let mut obj = store.get::<K>(NS, &name).await.unwrap_or_else(|_| K::make(&name, 0));
            obj.set_status(*status);
            if *stale {
                obj.meta_mut().resource_version = Some("0".into());
            }
            let actual = outcome_of(store.update_status(NS, &obj).await);
            (actual, model.update_status(kind, &name, *stale, *status))
        }
        Op::AddFinalizer { name, which, .. } | Op::RemoveFinalizer { name, which, .. } => {
            let add = matches!(op, Op::AddFinalizer { .. });
            let name = name_of(*name);
            let finalizer = format!("test.oka.dev/f{which}");
            let change = |fins: &mut Vec<String>| {
                if add {
                    if !fins.contains(&finalizer) {
                        fins.push(finalizer.clone());
                    }
                } else {
                    fins.retain(|f| *f != finalizer);
                }
            };
            let obj = match store.get::<K>(NS, &name).await {
                Ok(mut o) => {
                    change(o.meta_mut().finalizers.get_or_insert_with(Vec::new));
                    o
                }
                Err(_) => K::make(&name, 0),
            };
            let actual = outcome_of(store.update(NS, &obj).await);
            let expected = model.update(kind, &name, false, |o| change(&mut o.finalizers));
            (actual, expected)
        }
        Op::Delete { name, stale, .. } => {
            let name = name_of(*name);
            let pre = Preconditions { uid: None, resource_version: stale.then(|| "0".to_owned()) };
            let actual = match store.delete::<K>(NS, &name, &pre).await {
                Ok(Deleted::Gone(k)) => Outcome::Gone(MObj::of(&k)),
                Ok(Deleted::Finalizing(k)) => Outcome::Finalizing(MObj::of(&k)),
                Err(e) => error_outcome(e),
            };
            (actual, model.delete(kind, &name, *stale))
        }
        Op::Get { name, .. } => {
            let name = name_of(*name);
            (outcome_of(store.get::<K>(NS, &name).await), model.get(kind, &name))
        }
        Op::List { red_only, .. } => {
            let selector =
                if *red_only { "color=red".parse().unwrap() } else { Selector::everything() };
            let list = store.list::<K>(Some(NS), &selector).await.unwrap();
            let actual: Vec<MObj> = list.items.iter().map(|k| MObj::of(&**k)).collect();
            let expected: Vec<MObj> = model
                .objs
                .iter()
                .filter(|((k, _), o)| *k == kind && (!red_only || o.red()))
                .map(|(_, o)| o.clone())
                .collect();
            let rv = list.resource_version.parse::<u64>().unwrap();
            (
                Outcome::Other(format!("{rv} {actual:?}")),
                Outcome::Other(format!("{} {expected:?}", model.rv)),
            )
        }
        Op::WatchFrom { .. } | Op::Restart => unreachable!("handled by the caller"),
    }
}

fn kind_of(op: &Op) -> usize {
    match op {
        Op::Create { kind, .. }
        | Op::Update { kind, .. }
        | Op::UpdateStatus { kind, .. }
        | Op::AddFinalizer { kind, .. }
        | Op::RemoveFinalizer { kind, .. }
        | Op::Delete { kind, .. }
        | Op::Get { kind, .. }
        | Op::List { kind, .. } => *kind,
        Op::WatchFrom { .. } | Op::Restart => WIDGET,
    }
}

async fn run(path: &Path, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut store = EmbeddedStore::open(path, options()).unwrap();
    let mut model = Model::default();
    let mut watchers = Watchers::start(&store).await;
    let mut seen = Seen::default();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Restart => {
                watchers.drain(&mut seen);
                store.close().unwrap();
                store = EmbeddedStore::open(path, options()).unwrap();
                prop_assert_eq!(store.resource_version(), model.rv.to_string(), "rv after restart");
                model.opened_at = model.rv;
                watchers = Watchers::start(&store).await;
            }
            Op::WatchFrom { back } => {
                let from = model.rv.saturating_sub(u64::from(*back));
                let result =
                    store.watch::<Widget>(None, &Selector::everything(), &from.to_string()).await;
                if from < model.oldest_watchable() {
                    let gone = matches!(result, Err(StoreError::Gone { .. }));
                    prop_assert!(gone, "op {}: watch from {} should be Gone", i, from);
                } else {
                    let mut stream = result.map_err(|e| {
                        TestCaseError::fail(format!("op {i}: watch from {from}: {e}"))
                    })?;
                    let got: Vec<_> = ready(&mut stream).iter().map(summary).collect();
                    prop_assert_eq!(
                        got,
                        model.expected(WIDGET, false, from),
                        "op {}: replay from {}",
                        i,
                        from
                    );
                }
            }
            _ => {
                let kind = kind_of(op);
                let (actual, expected) = if kind == WIDGET {
                    step::<Widget>(&store, &mut model, kind, op).await
                } else {
                    step::<Gadget>(&store, &mut model, kind, op).await
                };
                prop_assert_eq!(actual, expected, "op {}: {:?}", i, op);
            }
        }
        prop_assert_eq!(store.resource_version(), model.rv.to_string(), "op {}: rv", i);
        watchers.drain(&mut seen);
    }
    // Final contents.
    let widgets = store.list::<Widget>(None, &Selector::everything()).await.unwrap();
    let gadgets = store.list::<Gadget>(None, &Selector::everything()).await.unwrap();
    let actual: Vec<MObj> = gadgets
        .items
        .iter()
        .map(|g| MObj::of(&**g))
        .chain(widgets.items.iter().map(|w| MObj::of(&**w)))
        .collect();
    let expected: Vec<MObj> = model.objs.values().cloned().collect();
    prop_assert_eq!(actual, expected, "final contents");
    // Every watcher saw exactly the model's events (each segment between restarts starts at
    // the rv of the reopen, and the segments together cover everything).
    prop_assert_eq!(&seen.widgets, &model.expected(WIDGET, false, 0), "widget watch");
    prop_assert_eq!(&seen.gadgets, &model.expected(GADGET, false, 0), "gadget watch");
    prop_assert_eq!(&seen.red_widgets, &model.expected(WIDGET, true, 0), "red widget watch");
    store.close().unwrap();
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..64)) {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(&dir.path().join("store.redb"), &ops))?;
    }
}
