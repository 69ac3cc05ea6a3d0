//! The writer thread and the rules of every write.
//!
//! One thread owns all write transactions. It takes every request queued since its last commit
//! (a *batch*), validates and applies them in order against its own copy of the current objects
//! ([`State`]), each change getting the next resourceVersion, then writes the objects the batch
//! touched and the counter in one redb transaction, committed once (one `fsync`). Only then does
//! it publish the new versions to readers and watchers ([`Shared`]) and reply to the callers.
//!
//! A request either fails validation before it changes anything, or applies in full (with its
//! owner cascade), so a rejected request never disturbs the others in its batch. When the
//! commit itself fails, nothing of the batch is published and every request of the batch fails
//! with [`StoreError::Internal`]. Since a failed commit may still have reached the disk, the
//! writer then writes nothing until it has reopened the file (the next batch tries, at most once
//! a second; meanwhile writes fail with [`StoreError::Unavailable`], which callers retry) and
//! learnt from it whether that batch landed: if it did, the batch is published then (watchers
//! see it, in order); if it did not, it is forgotten. So what readers were shown never
//! contradicts what a reopen finds, and a full disk stops writes only until space is freed.
//! Without a way to reopen (a test backend), or when the file holds neither outcome, the writer
//! stays stopped until the store is reopened.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, mpsc};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::{Map, Value};
use tokio::sync::{oneshot, watch};

use super::object::{Entry, KindInfo, ObjKey, generate_name, is_dns_subdomain, spec_differs};
use crate::{Preconditions, StoreError};

/// Current objects: `(kind key, namespace, name)` → JSON, the whole object.
pub(crate) const OBJECTS: TableDefinition<(&str, &str, &str), &[u8]> =
    TableDefinition::new("objects");
/// Store-wide counters: [`RV_KEY`] and [`FORMAT_KEY`].
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The last resourceVersion handed out.
const RV_KEY: &str = "resource_version";
/// The layout of the tables above.
const FORMAT_KEY: &str = "format_version";
const FORMAT: u64 = 1;

/// How many times a `generateName` create draws a new suffix when the name is taken.
const GENERATE_NAME_ATTEMPTS: usize = 8;

/// Current objects in key order, which is the order lists return.
pub(crate) type Objects = BTreeMap<ObjKey, Arc<Entry>>;

/// What a request asks the writer to do.
pub(crate) enum Op {
    Create { meta: ObjectMeta, body: Map<String, Value> },
    Update { meta: ObjectMeta, body: Map<String, Value> },
    UpdateStatus { meta: ObjectMeta, body: Map<String, Value> },
    Delete { name: String, preconditions: Preconditions },
}

/// One queued write.
pub(crate) struct Request {
    pub kind: KindInfo,
    pub namespace: String,
    pub op: Op,
    pub reply: oneshot::Sender<Result<Outcome, StoreError>>,
}

/// What a write did.
pub(crate) enum Outcome {
    /// The object as the write left it (for an update that emptied the finalizers of a deleting
    /// object: its last state, now removed).
    Written(Arc<Entry>),
    /// A delete: the object's last state, or its state with `deletionTimestamp` set.
    Deleted { entry: Arc<Entry>, finalizing: bool },
}

/// The kind of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as kept in the watch history. Every resourceVersion names exactly one change.
#[derive(Debug)]
pub(crate) struct Event {
    pub ty: EventType,
    /// The new version; for `Deleted`, the object's last state with the deletion's rv.
    pub object: Arc<Entry>,
    /// The version before the change (`None` for `Added`).
    pub prev: Option<Arc<Entry>>,
    /// When the change's batch was committed.
    pub committed_at: Instant,
}

impl Event {
    pub fn rv(&self) -> u64 {
        self.object.rv
    }
}

/// What readers and watchers see: the committed objects and the recent changes.
pub(crate) struct View {
    pub objects: Objects,
    /// The last `history_size` changes, contiguous in resourceVersion, ending at `rv`.
    pub history: VecDeque<Arc<Event>>,
    /// The resourceVersion of the last committed change.
    pub rv: u64,
}

impl View {
    /// The oldest resourceVersion a watch can start from.
    pub fn oldest_watchable(&self) -> u64 {
        self.rv - self.history.len() as u64
    }

    /// Up to `max` changes after `rv`, or [`StoreError::Gone`] when some have left the history.
    pub fn events_after(&self, rv: u64, max: usize) -> Result<Vec<Arc<Event>>, StoreError> {
        let oldest = self.oldest_watchable();
        if rv < oldest {
            return Err(StoreError::Gone { requested: rv.to_string(), oldest: oldest.to_string() });
        }
        let start = usize::try_from(rv - oldest).unwrap_or(usize::MAX).min(self.history.len());
        Ok(self.history.range(start..).take(max).cloned().collect())
    }
}

/// The state shared by the writer, readers and watch streams.
pub(crate) struct Shared {
    view: RwLock<View>,
    history_size: usize,
}

impl Shared {
    pub fn new(objects: Objects, rv: u64, history_size: usize) -> Shared {
        Shared { view: RwLock::new(View { objects, history: VecDeque::new(), rv }), history_size }
    }

    /// The view, for reading. Every critical section leaves the view consistent, so a poisoned
    /// lock (a panic elsewhere while holding it) still guards consistent data.
    pub fn read(&self) -> RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, View> {
        self.view.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writer's copy of the current objects, with the indexes the owner cascade needs.
/// It runs ahead of [`View`] by the batch being applied.
pub(crate) struct State {
    objects: Objects,
    /// uid → object.
    by_uid: HashMap<String, ObjKey>,
    /// Owner uid → the objects naming it in their ownerReferences.
    dependents: HashMap<String, BTreeSet<ObjKey>>,
    /// The last resourceVersion handed out.
    rv: u64,
}

impl State {
    pub fn new(objects: Objects, rv: u64) -> State {
        let mut state = State {
            objects: Objects::new(),
            by_uid: HashMap::new(),
            dependents: HashMap::new(),
            rv,
        };
        for entry in objects.values() {
            state.index(entry);
        }
        state.objects = objects;
        state
    }

    fn get(&self, key: &ObjKey) -> Option<&Arc<Entry>> {
        self.objects.get(key)
    }

    fn put(&mut self, entry: Arc<Entry>) -> Option<Arc<Entry>> {
        let prev = self.objects.insert(entry.key.clone(), Arc::clone(&entry));
        if let Some(prev) = &prev {
            self.unindex(prev);
        }
        self.index(&entry);
        prev
    }

    fn remove(&mut self, key: &ObjKey) -> Option<Arc<Entry>> {
        let prev = self.objects.remove(key);
        if let Some(prev) = &prev {
            self.unindex(prev);
        }
        prev
    }

    fn index(&mut self, entry: &Entry) {
        self.by_uid.insert(entry.uid().to_owned(), entry.key.clone());
        for owner in &entry.owner_uids {
            self.dependents.entry(owner.clone()).or_default().insert(entry.key.clone());
        }
    }

    fn unindex(&mut self, entry: &Entry) {
        if self.by_uid.get(entry.uid()) == Some(&entry.key) {
            self.by_uid.remove(entry.uid());
        }
        for owner in &entry.owner_uids {
            if let Some(deps) = self.dependents.get_mut(owner) {
                deps.remove(&entry.key);
                if deps.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
    }
}

/// A change applied to [`State`] and not yet committed.
pub(crate) struct Pending {
    ty: EventType,
    object: Arc<Entry>,
    prev: Option<Arc<Entry>>,
}

/// Applies requests to the writer's state, recording each change.
struct Batch<'a> {
    state: &'a mut State,
    changes: Vec<Pending>,
    /// The batch's timestamp, for creationTimestamp and deletionTimestamp.
    now: Time,
}

fn invalid(message: impl Into<String>) -> StoreError {
    StoreError::Invalid(message.into())
}

impl Batch<'_> {
    fn apply(&mut self, kind: &KindInfo, namespace: &str, op: Op) -> Result<Outcome, StoreError> {
        match op {
            Op::Create { meta, body } => self.create(kind, namespace, meta, body),
            Op::Update { meta, body } => self.update(kind, namespace, meta, body),
            Op::UpdateStatus { meta, body } => self.update_status(kind, namespace, meta, body),
            Op::Delete { name, preconditions } => {
                self.delete(kind, namespace, name, &preconditions)
            }
        }
    }

    fn key(kind: &KindInfo, namespace: &str, name: &str) -> ObjKey {
        ObjKey {
            kind: Arc::clone(&kind.key),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    fn create(
        &mut self,
        kind: &KindInfo,
        namespace: &str,
        mut meta: ObjectMeta,
        mut body: Map<String, Value>,
    ) -> Result<Outcome, StoreError> {
        if meta.resource_version.as_deref().is_some_and(|rv| !rv.is_empty()) {
            return Err(invalid(
                "metadata.resourceVersion must not be set on objects to be created",
            ));
        }
        let name = match meta.name.as_deref().filter(|n| !n.is_empty()) {
            Some(name) => {
                if !is_dns_subdomain(name) {
                    return Err(invalid(format!(
                        "metadata.name `{name}` is not a valid name (a DNS-1123 subdomain: \
                         lowercase alphanumerics, `-` and `.`, at most 253 characters)"
                    )));
                }
                if self.state.get(&Self::key(kind, namespace, name)).is_some() {
                    return Err(kind.already_exists(namespace, name));
                }
                name.to_owned()
            }
            None => {
                let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty()) else {
                    return Err(invalid("metadata.name or metadata.generateName is required"));
                };
                let mut chosen = None;
                for _ in 0..GENERATE_NAME_ATTEMPTS {
                    let name = generate_name(prefix);
                    if !is_dns_subdomain(&name) {
                        return Err(invalid(format!(
                            "metadata.generateName `{prefix}` does not make a valid name \
                             (a DNS-1123 subdomain)"
                        )));
                    }
                    if self.state.get(&Self::key(kind, namespace, &name)).is_none() {
                        chosen = Some(name);
                        break;
                    }
                }
                chosen.ok_or_else(|| kind.already_exists(namespace, prefix))?
            }
        };
        meta.name = Some(name);
        meta.namespace = Some(namespace.to_owned());
        meta.uid = Some(uuid::Uuid::new_v4().to_string());
        meta.creation_timestamp = Some(self.now.clone());
        meta.generation = Some(1);
        meta.deletion_timestamp = None;
        meta.deletion_grace_period_seconds = None;
        meta.self_link = None;
        // As for Kubernetes custom resources with a status subresource: create cannot set status.
        body.remove("status");
        set_type(&mut body, kind);
        let entry = self.put(EventType::Added, &kind.key, meta, body)?;
        Ok(Outcome::Written(entry))
    }

    fn update(
        &mut self,
        kind: &KindInfo,
        namespace: &str,
        mut meta: ObjectMeta,
        mut body: Map<String, Value>,
    ) -> Result<Outcome, StoreError> {
        let existing = self.existing(kind, namespace, &meta)?;
        check_preconditions(
            kind,
            &existing,
            meta.uid.as_deref(),
            meta.resource_version.as_deref(),
        )?;
        if existing.deleting() {
            let added: Vec<&String> = meta
                .finalizers
                .iter()
                .flatten()
                .filter(|f| !existing.finalizers().contains(f))
                .collect();
            if !added.is_empty() {
                return Err(invalid(format!(
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object \
                     is being deleted, found new finalizers {added:?}"
                )));
            }
        }
        // Server-owned metadata is kept.
        let old = &existing.meta;
        meta.namespace = Some(namespace.to_owned());
        meta.uid.clone_from(&old.uid);
        meta.creation_timestamp.clone_from(&old.creation_timestamp);
        meta.deletion_timestamp.clone_from(&old.deletion_timestamp);
        meta.deletion_grace_period_seconds = old.deletion_grace_period_seconds;
        meta.generation = old.generation;
        meta.resource_version.clone_from(&old.resource_version);
        meta.self_link = None;
        // Status is kept.
        match existing.value.get("status") {
            Some(status) => body.insert("status".into(), status.clone()),
            None => body.remove("status"),
        };
        set_type(&mut body, kind);
        let no_fields = Map::new();
        if spec_differs(existing.value.as_object().unwrap_or(&no_fields), &body) {
            meta.generation = Some(old.generation.unwrap_or(0) + 1);
        }
        let candidate = Entry::from_parts(Arc::clone(&kind.key), meta, body)?;
        if candidate.value == existing.value {
            return Ok(Outcome::Written(existing));
        }
        let Entry { meta, value, .. } = candidate;
        let body = body_of(value);
        if existing.deleting() && meta.finalizers.as_ref().is_none_or(Vec::is_empty) {
            let entry = self.remove(&existing, meta, body)?;
            self.cascade(entry.uid().to_owned())?;
            return Ok(Outcome::Written(entry));
        }
        let entry = self.put(EventType::Modified, &kind.key, meta, body)?;
        Ok(Outcome::Written(entry))
    }

    fn update_status(
        &mut self,
        kind: &KindInfo,
        namespace: &str,
        meta: ObjectMeta,
        mut body: Map<String, Value>,
    ) -> Result<Outcome, StoreError> {
        let existing = self.existing(kind, namespace, &meta)?;
        check_preconditions(
            kind,
            &existing,
            meta.uid.as_deref(),
            meta.resource_version.as_deref(),
        )?;
        let status = body.remove("status").filter(|s| !s.is_null());
        if status.as_ref() == existing.status() {
            return Ok(Outcome::Written(existing));
        }
        let mut new_body = existing.body();
        match status {
            Some(status) => new_body.insert("status".into(), status),
            None => new_body.remove("status"),
        };
        let entry = self.put(EventType::Modified, &kind.key, existing.meta.clone(), new_body)?;
        Ok(Outcome::Written(entry))
    }

    fn delete(
        &mut self,
        kind: &KindInfo,
        namespace: &str,
        name: String,
        preconditions: &Preconditions,
    ) -> Result<Outcome, StoreError> {
        let existing = self
            .state
            .get(&Self::key(kind, namespace, &name))
            .cloned()
            .ok_or_else(|| kind.not_found(namespace, &name))?;
        check_preconditions(
            kind,
            &existing,
            preconditions.uid.as_deref(),
            preconditions.resource_version.as_deref(),
        )?;
        if existing.deleting() {
            return Ok(Outcome::Deleted { entry: existing, finalizing: true });
        }
        if !existing.finalizers().is_empty() {
            let entry = self.mark_deleting(&existing)?;
            return Ok(Outcome::Deleted { entry, finalizing: true });
        }
        let entry = self.remove(&existing, existing.meta.clone(), existing.body())?;
        self.cascade(entry.uid().to_owned())?;
        Ok(Outcome::Deleted { entry, finalizing: false })
    }

    /// The stored object `meta` names (in `namespace`).
    fn existing(
        &self,
        kind: &KindInfo,
        namespace: &str,
        meta: &ObjectMeta,
    ) -> Result<Arc<Entry>, StoreError> {
        let Some(name) = meta.name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(invalid("metadata.name is required"));
        };
        self.state
            .get(&Self::key(kind, namespace, name))
            .cloned()
            .ok_or_else(|| kind.not_found(namespace, name))
    }

    /// Sets `deletionTimestamp` (and bumps `generation`, as Kubernetes does when it marks an
    /// object for deletion).
    fn mark_deleting(&mut self, existing: &Entry) -> Result<Arc<Entry>, StoreError> {
        let mut meta = existing.meta.clone();
        meta.deletion_timestamp = Some(self.now.clone());
        meta.deletion_grace_period_seconds = Some(0);
        meta.generation = Some(meta.generation.unwrap_or(0) + 1);
        self.put(EventType::Modified, &existing.key.kind, meta, existing.body())
    }

    /// Writes a new version (`Added` or `Modified`) with the next resourceVersion.
    fn put(
        &mut self,
        ty: EventType,
        kind: &Arc<str>,
        mut meta: ObjectMeta,
        body: Map<String, Value>,
    ) -> Result<Arc<Entry>, StoreError> {
        let rv = self.state.rv + 1;
        meta.resource_version = Some(rv.to_string());
        let entry = Arc::new(Entry::from_parts(Arc::clone(kind), meta, body)?);
        self.state.rv = rv;
        let prev = self.state.put(Arc::clone(&entry));
        self.changes.push(Pending { ty, object: Arc::clone(&entry), prev });
        Ok(entry)
    }

    /// Removes `existing`; its last state is `meta` + `body` with the next resourceVersion.
    /// The caller runs the cascade.
    fn remove(
        &mut self,
        existing: &Arc<Entry>,
        mut meta: ObjectMeta,
        body: Map<String, Value>,
    ) -> Result<Arc<Entry>, StoreError> {
        let rv = self.state.rv + 1;
        meta.resource_version = Some(rv.to_string());
        let entry = Arc::new(Entry::from_parts(Arc::clone(&existing.key.kind), meta, body)?);
        self.state.rv = rv;
        self.state.remove(&existing.key);
        self.changes.push(Pending {
            ty: EventType::Deleted,
            object: Arc::clone(&entry),
            prev: Some(Arc::clone(existing)),
        });
        Ok(entry)
    }

    /// The owner cascade after the object with uid `removed` is gone, breadth first; the
    /// dependents of one owner are visited in key order. A dependent that still has another
    /// live owner loses the dangling reference; one with finalizers starts its deletion; any
    /// other is removed, and its own dependents follow.
    fn cascade(&mut self, removed: String) -> Result<(), StoreError> {
        let mut queue = VecDeque::from([removed]);
        while let Some(owner) = queue.pop_front() {
            let dependents: Vec<ObjKey> = match self.state.dependents.get(&owner) {
                Some(deps) => deps.iter().cloned().collect(),
                None => continue,
            };
            for key in dependents {
                let Some(dep) = self.state.get(&key).cloned() else { continue };
                if !dep.owner_uids.contains(&owner) {
                    continue;
                }
                let other_live_owner = dep
                    .owner_uids
                    .iter()
                    .any(|uid| *uid != owner && self.state.by_uid.contains_key(uid));
                if other_live_owner {
                    let mut meta = dep.meta.clone();
                    if let Some(refs) = &mut meta.owner_references {
                        refs.retain(|r| r.uid != owner);
                    }
                    self.put(EventType::Modified, &key.kind, meta, dep.body())?;
                } else if dep.deleting() {
                    // Already waiting for its finalizers.
                } else if !dep.finalizers().is_empty() {
                    self.mark_deleting(&dep)?;
                } else {
                    let entry = self.remove(&dep, dep.meta.clone(), dep.body())?;
                    queue.push_back(entry.uid().to_owned());
                }
            }
        }
        Ok(())
    }
}

fn set_type(body: &mut Map<String, Value>, kind: &KindInfo) {
    body.insert("apiVersion".into(), Value::String(kind.api_version.to_string()));
    body.insert("kind".into(), Value::String(kind.kind.to_string()));
}

fn body_of(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(mut body) => {
            body.remove("metadata");
            body
        }
        _ => Map::new(),
    }
}

/// The uid and resourceVersion preconditions of a write (ignored when absent or empty).
fn check_preconditions(
    kind: &KindInfo,
    existing: &Entry,
    uid: Option<&str>,
    resource_version: Option<&str>,
) -> Result<(), StoreError> {
    let conflict =
        |message: String| kind.conflict(&existing.key.namespace, &existing.key.name, message);
    if let Some(uid) = uid.filter(|u| !u.is_empty())
        && uid != existing.uid()
    {
        return Err(conflict(format!(
            "precondition failed: uid in precondition: {uid}, uid of the object: {}",
            existing.uid()
        )));
    }
    if let Some(rv) = resource_version.filter(|rv| !rv.is_empty())
        && rv != existing.rv.to_string()
    {
        return Err(conflict(format!(
            "the object has been modified (resourceVersion {rv} is stale, the current one is {}); \
             read it again and apply your changes to the latest version",
            existing.rv
        )));
    }
    Ok(())
}

/// Maps a storage failure to [`StoreError::Internal`], saying what the store was doing.
fn storage<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> StoreError {
    move |e| StoreError::Internal(format!("{what}: {e}"))
}

/// Ensures the tables exist, then reads every object and the resourceVersion counter.
pub(crate) fn load(db: &Database) -> Result<(Objects, u64), StoreError> {
    let txn = db.begin_write().map_err(storage("cannot begin a write transaction"))?;
    {
        let mut meta = txn.open_table(META).map_err(storage("cannot open the meta table"))?;
        let format = meta
            .get(FORMAT_KEY)
            .map_err(storage("cannot read the format version"))?
            .map(|v| v.value());
        match format {
            None => {
                meta.insert(FORMAT_KEY, FORMAT)
                    .map_err(storage("cannot write the format version"))?;
            }
            Some(v) if v > FORMAT => {
                return Err(StoreError::Internal(format!(
                    "the database has format version {v}, newer than this program's {FORMAT}: \
                     open it with a newer oka"
                )));
            }
            Some(_) => {}
        }
        txn.open_table(OBJECTS).map_err(storage("cannot open the objects table"))?;
    }
    txn.commit().map_err(storage("cannot commit the table layout"))?;

    let read = db.begin_read().map_err(storage("cannot begin a read transaction"))?;
    let meta = read.open_table(META).map_err(storage("cannot open the meta table"))?;
    let mut rv = meta
        .get(RV_KEY)
        .map_err(storage("cannot read the resourceVersion counter"))?
        .map(|v| v.value())
        .unwrap_or(0);
    let table = read.open_table(OBJECTS).map_err(storage("cannot open the objects table"))?;
    let mut kinds: HashMap<String, Arc<str>> = HashMap::new();
    let mut objects = Objects::new();
    for item in table.iter().map_err(storage("cannot read the objects"))? {
        let (key, value) = item.map_err(storage("cannot read an object"))?;
        let (kind, namespace, name) = key.value();
        let kind = Arc::clone(kinds.entry(kind.to_owned()).or_insert_with(|| Arc::from(kind)));
        let json: Value = serde_json::from_slice(value.value()).map_err(|e| {
            StoreError::Internal(format!("stored {kind} {namespace}/{name} is not JSON: {e}"))
        })?;
        let entry = Entry::from_value(Arc::clone(&kind), json)
            .map_err(|e| StoreError::Internal(format!("stored {kind} {namespace}/{name}: {e}")))?;
        if entry.key.namespace != namespace || entry.key.name != name {
            return Err(StoreError::Internal(format!(
                "stored {kind} {namespace}/{name} names itself {}/{}",
                entry.key.namespace, entry.key.name
            )));
        }
        rv = rv.max(entry.rv);
        objects.insert(entry.key.clone(), Arc::new(entry));
    }
    Ok((objects, rv))
}

/// Opens the store's file again, verified, with every object loaded.
pub(crate) type Reopen = Box<dyn FnMut() -> Result<(Database, Objects, u64), StoreError> + Send>;

/// How often a stopped writer tries to reopen the file.
const RECOVERY_INTERVAL: Duration = Duration::from_secs(1);

/// The writer thread's state and channels.
pub(crate) struct Writer {
    /// The open database; `None` only while a reopen after a failed commit has not succeeded.
    pub db: Option<Database>,
    /// How to reopen the file after a failed commit; `None` when it cannot be.
    pub reopen: Option<Reopen>,
    pub requests: mpsc::Receiver<Request>,
    pub state: State,
    pub shared: Arc<Shared>,
    /// Carries the last published resourceVersion to watch streams; dropped when the writer
    /// stops, which ends them.
    pub notify: watch::Sender<u64>,
    pub max_batch: usize,
    /// How long a batch waits for the callers of the previous batch to come back.
    pub linger: Duration,
    /// Set after a failed commit: the writer refuses every later write until it has recovered.
    pub failed: Option<String>,
    /// The failed batch, which may or may not be on disk: its resourceVersion and changes.
    pub unconfirmed: Option<(u64, Vec<Pending>)>,
    /// When a stopped writer may next try to reopen the file.
    pub next_recovery: Instant,
    /// Where commits are counted and timed.
    pub metrics: Arc<crate::metrics::StoreMetrics>,
}

impl Writer {
    /// Serves requests until every sender is gone, then closes the database.
    pub fn run(mut self) -> Result<(), StoreError> {
        let mut last_batch = 1;
        while let Ok(first) = self.requests.recv() {
            let mut requests = vec![first];
            while requests.len() < self.max_batch {
                match self.requests.try_recv() {
                    Ok(request) => requests.push(request),
                    Err(_) => break,
                }
            }
            // Writers that were answered together come back together: give them a moment.
            let expected = last_batch.min(self.max_batch);
            if requests.len() < expected {
                let deadline = Instant::now() + self.linger;
                while requests.len() < expected {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.requests.recv_timeout(left) {
                        Ok(request) => requests.push(request),
                        Err(_) => break,
                    }
                }
            }
            last_batch = requests.len();
            self.process(requests);
        }
        tracing::debug!("store writer stopping");
        let Writer { db, notify, .. } = self;
        drop(notify);
        let Some(db) = db else { return Ok(()) };
        db.close()
            .map_err(|e| StoreError::Internal(format!("cannot close the database cleanly: {e}")))
    }

    fn process(&mut self, requests: Vec<Request>) {
        if self.failed.is_some() && self.reopen.is_some() && Instant::now() >= self.next_recovery {
            self.next_recovery = Instant::now() + RECOVERY_INTERVAL;
            self.recover();
        }
        if let Some(reason) = &self.failed {
            let error = if self.reopen.is_some() {
                StoreError::Unavailable(format!(
                    "the store accepts no writes since a storage failure ({reason}); it retries \
                     once a second"
                ))
            } else {
                StoreError::Internal(format!(
                    "the store accepts no writes since a storage failure ({reason}); reopen it"
                ))
            };
            for request in requests {
                let _ = request.reply.send(Err(error.clone()));
            }
            return;
        }
        let mut batch = Batch {
            state: &mut self.state,
            changes: Vec::new(),
            now: Time(jiff::Timestamp::now()),
        };
        let mut replies = Vec::with_capacity(requests.len());
        let mut failure = None;
        for Request { kind, namespace, op, reply } in requests {
            let result = batch.apply(&kind, &namespace, op);
            if let Err(StoreError::Internal(message)) = &result {
                failure.get_or_insert_with(|| message.clone());
            }
            replies.push((reply, result));
        }
        let changes = batch.changes;
        let outcome = match failure {
            // Nothing reached the file: forget the batch and carry on.
            Some(message) => Err(format!("the write was not applied: {message}")),
            None if changes.is_empty() => Ok(()),
            None => {
                let started = Instant::now();
                let committed = self.commit(&changes);
                if committed.is_ok() {
                    self.metrics.commit_duration.observe(started.elapsed().as_secs_f64());
                    self.metrics.commits.inc();
                    self.metrics.writes.inc_by(replies.len() as u64);
                    self.metrics.batch_writes.observe(replies.len() as f64);
                }
                committed
            }
            .map_err(|message| {
                // The file's state is now unknown (the commit may or may not have reached the
                // disk): stop writing, so that what readers see stays what a reopen will find
                // up to this batch, until the file has been read again ([`Writer::recover`]).
                tracing::error!(error = %message, writes = replies.len(), "store commit failed; no writes until the store has read its file again");
                self.failed = Some(message.clone());
                format!(
                    "the commit failed ({message}): the write may or may not be durable, and \
                     the store takes no writes until it has read its file again"
                )
            }),
        };
        if let Err(message) = outcome {
            if self.failed.is_some() {
                self.unconfirmed = Some((self.state.rv, changes));
            }
            let view = self.shared.read();
            self.state = State::new(view.objects.clone(), view.rv);
            drop(view);
            for (reply, _) in replies {
                let _ = reply.send(Err(StoreError::Internal(message.clone())));
            }
            return;
        }
        if !changes.is_empty() {
            self.publish(changes);
        }
        for (reply, result) in replies {
            // A caller that stopped waiting is no concern of the others.
            let _ = reply.send(result);
        }
    }

    /// After a failed commit: reopens the file and learns from it whether the failed batch
    /// landed (the stored counter is the batch's) or not (it is the last published one), then
    /// publishes the batch or forgets it and takes writes again. Any other counter, or a reopen
    /// that fails, leaves the writer stopped (a reopen is tried again later).
    fn recover(&mut self) {
        let Some(reopen) = self.reopen.as_mut() else { return };
        // The file's lock is held until the old handle is gone.
        drop(self.db.take());
        let (db, objects, rv) = match reopen() {
            Ok(opened) => opened,
            Err(e) => {
                tracing::warn!(error = %e, "the store cannot reopen its file yet; writes stay refused");
                return;
            }
        };
        let shown = self.shared.read().rv;
        match self.unconfirmed.take() {
            Some((batch_rv, changes)) if rv == batch_rv => {
                self.state = State::new(objects, rv);
                self.publish(changes);
                tracing::info!(
                    resource_version = rv,
                    "the store reopened its file: the failed commit had landed and is published; writes resume"
                );
            }
            unconfirmed if rv == shown => {
                self.state = State::new(objects, rv);
                let forgotten = unconfirmed.map_or(0, |(_, changes)| changes.len());
                tracing::info!(
                    resource_version = rv,
                    forgotten,
                    "the store reopened its file: the failed commit had not landed; writes resume"
                );
            }
            unconfirmed => {
                self.unconfirmed = unconfirmed;
                self.reopen = None;
                self.failed = Some(format!(
                    "after a failed commit the file holds resourceVersion {rv}, neither the \
                     last published one ({shown}) nor the failed batch's"
                ));
                tracing::error!(
                    resource_version = rv,
                    published = shown,
                    "the store's file does not match what it published: writes stay refused until it is reopened"
                );
                self.db = Some(db);
                return;
            }
        }
        self.db = Some(db);
        self.failed = None;
    }

    /// Writes the final state of every object the batch touched, and the counter, in one
    /// durable transaction.
    fn commit(&self, changes: &[Pending]) -> Result<(), String> {
        let touched: BTreeSet<&ObjKey> = changes.iter().map(|c| &c.object.key).collect();
        let db = self.db.as_ref().ok_or("the store's file is not open")?;
        let mut txn =
            db.begin_write().map_err(|e| format!("cannot begin a write transaction: {e}"))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| format!("cannot request a durable commit: {e}"))?;
        {
            let mut objects = txn
                .open_table(OBJECTS)
                .map_err(|e| format!("cannot open the objects table: {e}"))?;
            for key in touched {
                let k = (&*key.kind, key.namespace.as_str(), key.name.as_str());
                match self.state.get(key) {
                    Some(entry) => {
                        let bytes = serde_json::to_vec(&entry.value)
                            .map_err(|e| format!("cannot serialize {key:?}: {e}"))?;
                        objects
                            .insert(k, bytes.as_slice())
                            .map_err(|e| format!("cannot write {key:?}: {e}"))?;
                    }
                    None => {
                        objects.remove(k).map_err(|e| format!("cannot remove {key:?}: {e}"))?;
                    }
                }
            }
            let mut meta =
                txn.open_table(META).map_err(|e| format!("cannot open the meta table: {e}"))?;
            meta.insert(RV_KEY, self.state.rv)
                .map_err(|e| format!("cannot write the resourceVersion counter: {e}"))?;
        }
        let started = Instant::now();
        let committed = txn.commit().map_err(|e| format!("cannot commit: {e}"));
        self.metrics.fsync_duration.observe(started.elapsed().as_secs_f64());
        committed
    }

    /// Makes a committed batch visible: objects, history, then the notification.
    fn publish(&self, changes: Vec<Pending>) {
        let committed_at = Instant::now();
        let mut view = self.shared.write();
        for Pending { ty, object, prev } in changes {
            if ty == EventType::Deleted {
                view.objects.remove(&object.key);
            } else {
                view.objects.insert(object.key.clone(), Arc::clone(&object));
            }
            view.history.push_back(Arc::new(Event { ty, object, prev, committed_at }));
            if view.history.len() > self.shared.history_size {
                view.history.pop_front();
            }
        }
        view.rv = self.state.rv;
        drop(view);
        self.notify.send_replace(self.state.rv);
    }
}
