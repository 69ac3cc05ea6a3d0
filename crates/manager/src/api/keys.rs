//! API keys and teams: the key store (a Secret in the system namespace) and the `/api-keys`,
//! `/api-keys/compatible` and `/teams` routes.
//!
//! # Model
//!
//! - A **team** is a namespace: a key of team `t` sees and creates sandboxes in namespace `t`
//!   only. The `admin` team (the admin key from configuration, keys created for it, and stored
//!   keys without a team, as in the reference) sees every namespace.
//! - A **key** oka creates is `e2b_` + 40 lowercase hex digits (what every E2B SDK accepts),
//!   shown once, in the create answer.
//! - The store keeps one record per key in the Secret [`KEY_STORE_SECRET`]`.data[<key ID>]`, in
//!   one of two forms, both read:
//!   - **oka's**: JSON `{id, name, keyHash, mask, createdAt, createdBy, team, quota?, key,
//!     lastUsed}`, `keyHash` the lowercase hex SHA-256 of the key. Its `key` is never the key:
//!     it is a random value behind a NUL character ([`INERT_KEY_PREFIX`]), which no HTTP header
//!     can carry, so that the reference, reading the Secret after a rollback, indexes oka's
//!     records under values nobody can present (without it, the reference would index them all
//!     under the empty key, which its missing `X-API-Key` header looks up).
//!   - **the reference's** (OpenKruise Agents' Secret backend): JSON `{createdAt, id, key,
//!     mask, name, createdBy, team?, lastUsed, quota?}`, `key` the raw key in plain text (a UUID,
//!     or the reference's admin key). oka hashes `key` when it loads the record. Its `quota` is
//!     read in either form the reference's releases store: `{"limits": [...]}`, or the wire
//!     form `{"<scope>": {"<dimension>": limit}}`, rewritten into the first.
//! - A presented key is first mapped to the raw key it stands for ([`key_compat::to_raw`]: the
//!   reference's SDK-compat encoding `e2b_6f6b616701…` is decoded, anything else is used as it
//!   is), then looked up by its SHA-256. So a key taken over from the reference works raw and
//!   encoded, and oka's own keys as they are.
//! - Lookups are served from memory. The cache is loaded from the Secret on first use, updated
//!   by this process's writes, and reloaded (at most once per [`RELOAD_INTERVAL`]) when a key
//!   is not found, so keys another manager created are found too.
//! - Writes are compare-and-swap updates of the Secret (its resourceVersion as precondition),
//!   retried on conflict. A write changes only the entry it is about: every other entry is
//!   written back byte for byte, whatever its form, including entries that are not key records.
//!
//! # Taking over the reference's Secret
//!
//! The reference's records are kept as they are, plain-text `key` included: oka never rewrites
//! them into its own form. Why: nothing is lost (a record is only ever removed by deleting its
//! key), no write is needed to take over, and a rollback to the reference keeps every key it
//! had working. The price is that those keys stay in plain text in the Secret, as they were
//! under the reference; rotating them (create a new key, delete the old) leaves only digests.
//! Keys created under oka exist only as digests, so after a rollback the reference does not know
//! them (their records stay inert, see above); they work again when oka is back.
//!
//! The reference's admin key entry (ID [`ADMIN_KEY_ID`], name `admin`, no team) is an ordinary
//! stored record here: its key authenticates as the admin, beside the admin key from
//! configuration (same ID, same team), it is listed once (in place of the configuration key's
//! entry, which has the same ID), and it cannot be deleted. The reference's MySQL key backend
//! is not read: its digests are HMACs with a pepper oka does not have (out of scope).
//!
//! # Where this differs from the reference, and why
//!
//! - The reference issues raw UUID keys and returns them in its compat encoding; oka issues
//!   keys that are already in the SDK's form, so `/api-keys/compatible` answers oka's keys as
//!   they are and encodes only raw keys taken over from the reference.
//! - A team's namespace is not checked for existence (the embedded store has no Namespace
//!   objects); its name must be a DNS label without `--`.
//! - The admin key lists every key (the reference: its own team's); an empty list is `[]`, not
//!   `null`.
//!
//! # Quotas
//!
//! A key's quota is validated at create ([`QuotaSpec::from_json`]: 400 with the reference's
//! reasons), stored normalised (an empty one is no quota) and immutable. It is enforced by
//! [`crate::quota`]; the key store is its list of limited keys ([`QuotaSubjects`]), and a
//! deleted key's quota state is cleaned up in the background.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use oka_store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::info;

use super::auth::{ADMIN_KEY_ID, ADMIN_TEAM_ID, API_KEY_HEADER, ApiKey, AuthError, User};
use super::{ApiError, AppState, key_compat};
use crate::quota::{QuotaSpec, QuotaSubjects};

/// The Secret that holds the key records (the reference's name).
pub const KEY_STORE_SECRET: &str = "e2b-key-store";
/// The admin team's name.
pub const ADMIN_TEAM: &str = "admin";
/// The shortest time between two reloads of the key store on a miss.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// `createdBy` of a key record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedBy {
    /// Always empty.
    #[serde(default)]
    pub email: String,
    /// The creating key's ID.
    pub id: String,
}

/// A team: `{id, name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Team {
    /// The team's ID (a UUID; the admin team's is well known).
    pub id: String,
    /// The team's name: the namespace its keys see.
    pub name: String,
}

/// E2B's key mask: what a key looks like without showing it (all empty in the reference's
/// records).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mask {
    /// The first hex digits.
    #[serde(rename = "maskedValuePrefix", default)]
    pub masked_value_prefix: String,
    /// The last hex digits.
    #[serde(rename = "maskedValueSuffix", default)]
    pub masked_value_suffix: String,
    /// `e2b_`.
    #[serde(default)]
    pub prefix: String,
    /// The number of hex digits.
    #[serde(rename = "valueLength", default)]
    pub value_length: usize,
}

/// One stored key (never the key itself).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The key's ID (a UUID): the owner stamped on its sandboxes.
    pub id: String,
    /// A human name.
    pub name: String,
    /// Lowercase hex SHA-256 of the key.
    #[serde(rename = "keyHash")]
    pub key_hash: String,
    /// The mask.
    pub mask: Mask,
    /// RFC 3339.
    #[serde(rename = "createdAt")]
    pub created_at: String,
    /// Who created it.
    #[serde(rename = "createdBy")]
    pub created_by: Option<CreatedBy>,
    /// Its team.
    pub team: Team,
    /// The quota as validated at create (`{"limits": [...]}`); `None`: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<serde_json::Value>,
}

/// `TeamAPIKey` (list answer): the record without the hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamApiKey {
    /// RFC 3339.
    #[serde(rename = "createdAt")]
    pub created_at: String,
    /// The key's ID.
    pub id: String,
    /// The mask.
    pub mask: Mask,
    /// The name.
    pub name: String,
    /// Who created it.
    #[serde(rename = "createdBy")]
    pub created_by: Option<CreatedBy>,
    /// Never tracked: `null`.
    #[serde(rename = "lastUsed")]
    pub last_used: Option<String>,
    /// The quota as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<serde_json::Value>,
}

/// `CreatedTeamAPIKey`: the list shape plus the key (shown once) and the team.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatedTeamApiKey {
    /// The key record.
    #[serde(flatten)]
    pub listed: TeamApiKey,
    /// The key itself.
    pub key: String,
    /// Its team.
    pub team: Team,
}

/// `ListedTeam`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedTeam {
    /// The team's ID.
    #[serde(rename = "teamID")]
    pub team_id: String,
    /// Its name.
    pub name: String,
    /// Always empty.
    #[serde(rename = "apiKey")]
    pub api_key: String,
    /// Whether it is the caller's team.
    #[serde(rename = "isDefault")]
    pub is_default: bool,
}

impl KeyRecord {
    fn listed(&self) -> TeamApiKey {
        TeamApiKey {
            created_at: self.created_at.clone(),
            id: self.id.clone(),
            mask: self.mask.clone(),
            name: self.name.clone(),
            created_by: self.created_by.clone(),
            last_used: None,
            quota: self.quota.clone(),
        }
    }

    /// The caller this key identifies.
    pub fn user(&self) -> User {
        User {
            id: self.id.clone(),
            team: self.team.name.clone(),
            namespace: (self.team.name != ADMIN_TEAM).then(|| self.team.name.clone()),
            quota: self.quota_spec(),
        }
    }

    /// The key's quota (`None`: unlimited). A stored quota that no longer validates is
    /// treated as unlimited (keys are validated when created).
    pub fn quota_spec(&self) -> Option<QuotaSpec> {
        QuotaSpec::from_json(self.quota.as_ref()).ok().flatten()
    }
}

/// Lowercase hex SHA-256 of `key`.
pub fn key_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// What the `key` of oka's records starts with: a NUL character (which no HTTP header value can
/// carry) and a marker; a random value follows. See the [module documentation](self).
pub const INERT_KEY_PREFIX: &str = "\u{0}oka:no-plaintext:";

/// One Secret entry as either form writes it (see the [module documentation](self)).
#[derive(Deserialize)]
struct StoredRecord {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(rename = "keyHash", default)]
    key_hash: Option<String>,
    /// The reference's plain-text key (oka's records: an inert value, never used).
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    mask: Option<Mask>,
    #[serde(rename = "createdAt", default)]
    created_at: Option<String>,
    #[serde(rename = "createdBy", default)]
    created_by: Option<CreatedBy>,
    #[serde(default)]
    team: Option<Team>,
    #[serde(default)]
    quota: Option<serde_json::Value>,
}

impl KeyRecord {
    /// The record stored at `data[id]`, in either form; `None` for an entry that is not a key
    /// record or holds no usable key (no digest, and an empty or missing plain-text key).
    fn from_stored(id: &str, bytes: &[u8]) -> Option<KeyRecord> {
        let stored: StoredRecord = serde_json::from_slice(bytes).ok()?;
        let key_hash = match (stored.key_hash.filter(|h| !h.is_empty()), stored.key) {
            (Some(hash), _) => hash,
            (None, Some(key)) if !key.is_empty() && !key.starts_with(INERT_KEY_PREFIX) => {
                key_hash(&key)
            }
            _ => return None,
        };
        Some(KeyRecord {
            id: stored.id.filter(|i| !i.is_empty()).unwrap_or_else(|| id.to_owned()),
            name: stored.name,
            key_hash,
            mask: stored.mask.unwrap_or_default(),
            created_at: stored.created_at.unwrap_or_default(),
            created_by: stored.created_by,
            // The reference treats a key without a team as the admin team's.
            team: stored
                .team
                .unwrap_or_else(|| Team { id: ADMIN_TEAM_ID.into(), name: ADMIN_TEAM.into() }),
            quota: stored.quota.filter(|q| !q.is_null()).map(limits_form),
        })
    }
}

/// A stored quota in the `{"limits": [...]}` form: as it is when it has that form; the
/// reference's wire form (`{"<scope>": {"<dimension>": limit}}`, dimensions by full or short
/// key), which some of its releases store, rewritten into it; anything else as it is (and then
/// refused by [`QuotaSpec::from_json`]).
fn limits_form(quota: serde_json::Value) -> serde_json::Value {
    let Some(scopes) = quota.as_object() else { return quota };
    if scopes.contains_key("limits") || scopes.values().any(|v| !v.is_object()) {
        return quota;
    }
    let mut limits = Vec::new();
    for scope in ["running", "all"] {
        let Some(dimensions) = scopes.get(scope).and_then(|d| d.as_object()) else { continue };
        for (full, short) in
            [("sandbox.count", "count"), ("limits.cpu", "cpu"), ("limits.memory", "memory")]
        {
            if let Some(limit) = dimensions.get(full).or_else(|| dimensions.get(short)) {
                limits.push(serde_json::json!({"dimension": full, "scope": scope, "limit": limit}));
            }
        }
    }
    let known = |scope: &str, dimensions: &serde_json::Map<String, serde_json::Value>| {
        matches!(scope, "running" | "all")
            && dimensions.keys().all(|d| {
                matches!(
                    d.as_str(),
                    "sandbox.count" | "limits.cpu" | "limits.memory" | "count" | "cpu" | "memory"
                )
            })
    };
    let all_known = scopes.iter().all(|(scope, d)| d.as_object().is_some_and(|d| known(scope, d)));
    if all_known { serde_json::json!({ "limits": limits }) } else { quota }
}

/// oka's record as written: the record, an inert `key` and `lastUsed: null` (the reference's
/// shape, so that it reads the record without error after a rollback).
#[derive(Serialize)]
struct WrittenRecord<'a> {
    #[serde(flatten)]
    record: &'a KeyRecord,
    key: String,
    #[serde(rename = "lastUsed")]
    last_used: Option<String>,
}

/// One entry of the Secret: its bytes as stored and the record they hold, if any.
#[derive(Debug, Clone)]
struct Entry {
    bytes: Vec<u8>,
    record: Option<KeyRecord>,
}

/// The Secret's entries by data key, as a write sees and changes them: entries it does not
/// change are written back as they were read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Entries(BTreeMap<String, Entry>);

impl Entries {
    fn of(secret: &Secret) -> Self {
        Self(
            secret
                .data
                .iter()
                .flatten()
                .map(|(id, bytes)| {
                    let record = KeyRecord::from_stored(id, &bytes.0);
                    (id.clone(), Entry { bytes: bytes.0.clone(), record })
                })
                .collect(),
        )
    }

    /// Every key record.
    fn records(&self) -> impl Iterator<Item = &KeyRecord> {
        self.0.values().filter_map(|e| e.record.as_ref())
    }

    /// The record stored under `id`.
    fn get(&self, id: &str) -> Option<&KeyRecord> {
        self.0.get(id).and_then(|e| e.record.as_ref())
    }

    /// Stores `record` in oka's form under its ID.
    fn insert(&mut self, record: KeyRecord) -> Result<(), ApiError> {
        let inert = format!("{INERT_KEY_PREFIX}{:032x}", uuid::Uuid::new_v4().as_u128());
        let written = WrittenRecord { record: &record, key: inert, last_used: None };
        let bytes = serde_json::to_vec(&written)
            .map_err(|e| ApiError::Internal(format!("key store: {e}")))?;
        self.0.insert(record.id.clone(), Entry { bytes, record: Some(record) });
        Ok(())
    }

    /// Removes the entry `id`.
    fn remove(&mut self, id: &str) {
        self.0.remove(id);
    }

    fn data(&self) -> BTreeMap<String, ByteString> {
        self.0.iter().map(|(id, e)| (id.clone(), ByteString(e.bytes.clone()))).collect()
    }

    fn by_hash(&self) -> HashMap<String, KeyRecord> {
        self.records().map(|r| (r.key_hash.clone(), r.clone())).collect()
    }
}

#[derive(Default)]
struct Cache {
    loaded: bool,
    last_load: Option<Instant>,
    /// Records by key hash.
    by_hash: HashMap<String, KeyRecord>,
}

/// The key store; see the [module documentation](self).
pub struct KeyStore<S> {
    store: S,
    namespace: String,
    admin_key: ApiKey,
    cache: RwLock<Cache>,
    /// Serialises this process's writes (each is still a compare-and-swap).
    write_lock: tokio::sync::Mutex<()>,
    /// The admin key's `createdAt`: it comes from configuration and has no creation record, so
    /// the list shows when this store began serving it (RFC 3339, whole seconds).
    admin_since: String,
}

impl<S> std::fmt::Debug for KeyStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyStore").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

fn store_error(error: StoreError) -> ApiError {
    ApiError::Internal(format!("key store: {error}"))
}

impl<S: Store> KeyStore<S> {
    /// A key store in the Secret [`KEY_STORE_SECRET`] of `namespace`, beside the admin key.
    pub fn new(store: S, namespace: impl Into<String>, admin_key: ApiKey) -> Self {
        Self {
            store,
            namespace: namespace.into(),
            admin_key,
            cache: RwLock::new(Cache::default()),
            write_lock: tokio::sync::Mutex::new(()),
            admin_since: crate::claim::truncate_to_second(jiff::Timestamp::now()).to_string(),
        }
    }

    async fn read_secret(&self) -> Result<Option<Secret>, StoreError> {
        match self.store.get::<Secret>(&self.namespace, KEY_STORE_SECRET).await {
            Ok(secret) => Ok(Some(secret)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn reload(&self) -> Result<(), StoreError> {
        let secret = self.read_secret().await?;
        let entries = secret.as_ref().map(Entries::of).unwrap_or_default();
        let mut cache = self.cache.write().unwrap_or_else(PoisonError::into_inner);
        cache.by_hash = entries.by_hash();
        cache.loaded = true;
        cache.last_load = Some(Instant::now());
        Ok(())
    }

    fn cached(&self, hash: &str) -> (Option<KeyRecord>, bool) {
        let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
        let stale = !cache.loaded || cache.last_load.is_none_or(|t| t.elapsed() >= RELOAD_INTERVAL);
        (cache.by_hash.get(hash).cloned(), stale)
    }

    /// Authenticates a request by its `X-API-Key` header.
    ///
    /// # Errors
    ///
    /// 401 (`Invalid API Key`) without the header or for an unknown key; 500 when the key
    /// store cannot be read.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<User, ApiError> {
        let key = headers.get(API_KEY_HEADER).ok_or(AuthError::Missing)?;
        let key = key.to_str().map_err(|_| AuthError::Invalid)?;
        self.authenticate_key(key).await
    }

    /// Authenticates an API key (the admin key, or one of the store's), presented raw or in
    /// the reference's compat encoding.
    ///
    /// # Errors
    ///
    /// 401 (`Invalid API Key`) for an unknown key; 500 when the key store cannot be read.
    pub async fn authenticate_key(&self, presented: &str) -> Result<User, ApiError> {
        let raw = key_compat::to_raw(presented);
        if self.admin_key.matches(&raw) {
            return Ok(User::admin());
        }
        let hash = key_hash(&raw);
        let (found, stale) = self.cached(&hash);
        if let Some(record) = found {
            return Ok(record.user());
        }
        if stale {
            self.reload().await.map_err(store_error)?;
            if let (Some(record), _) = self.cached(&hash) {
                return Ok(record.user());
            }
        }
        Err(AuthError::Invalid.into())
    }

    /// Every stored record.
    async fn records(&self) -> Result<Vec<KeyRecord>, ApiError> {
        self.reload().await.map_err(store_error)?;
        let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
        let mut records: Vec<KeyRecord> = cache.by_hash.values().cloned().collect();
        records.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        Ok(records)
    }

    /// Applies `change` to the records with a compare-and-swap write of the Secret (creating
    /// it when missing), retried on conflict.
    async fn modify<T>(
        &self,
        change: impl Fn(&mut Entries) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let _guard = self.write_lock.lock().await;
        for _ in 0..8 {
            let current = self.read_secret().await.map_err(store_error)?;
            let mut entries = current.as_ref().map(Entries::of).unwrap_or_default();
            let outcome = change(&mut entries)?;
            let data = entries.data();
            let written = match current {
                Some(mut secret) => {
                    secret.data = Some(data);
                    self.store.update(&self.namespace, &secret).await
                }
                None => {
                    let mut secret = Secret { data: Some(data), ..Secret::default() };
                    secret.metadata.name = Some(KEY_STORE_SECRET.into());
                    secret.metadata.namespace = Some(self.namespace.clone());
                    secret.type_ = Some("Opaque".into());
                    self.store.create(&self.namespace, &secret).await
                }
            };
            match written {
                Ok(secret) => {
                    let mut cache = self.cache.write().unwrap_or_else(PoisonError::into_inner);
                    cache.by_hash = Entries::of(&secret).by_hash();
                    cache.loaded = true;
                    cache.last_load = Some(Instant::now());
                    return Ok(outcome);
                }
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }) => {}
                Err(error) => return Err(store_error(error)),
            }
        }
        Err(ApiError::Internal("key store: too many concurrent updates".into()))
    }
}

impl<S: Store> QuotaSubjects for KeyStore<S> {
    fn limited(&self) -> futures::future::BoxFuture<'_, Result<Vec<(String, QuotaSpec)>, String>> {
        Box::pin(async move {
            let records = self.records().await.map_err(|e| e.to_string())?;
            Ok(records.into_iter().filter_map(|r| Some((r.id.clone(), r.quota_spec()?))).collect())
        })
    }

    fn lookup<'a>(&'a self, user: &'a str) -> futures::future::BoxFuture<'a, Option<QuotaSpec>> {
        let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
        let found = cache.by_hash.values().find(|r| r.id == user).and_then(KeyRecord::quota_spec);
        Box::pin(async move { found })
    }
}

/// A namespace name: a DNS-1123 label.
fn is_dns_label(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// `POST /api-keys` body (strict: unknown fields are 400).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKeyRequest {
    #[serde(default)]
    name: String,
    #[serde(rename = "teamName", default)]
    team_name: Option<String>,
    #[serde(default)]
    quota: Option<serde_json::Value>,
}

type AppStateRef<S> = State<Arc<AppState<S>>>;

/// `POST /api-keys`: 201 with the new key (shown once).
pub(super) async fn create<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: NewKeyRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("Invalid request body: {e}")))?;
    let name = request.name.trim().to_owned();
    if name.is_empty() {
        return Err(ApiError::BadRequest("api-key name is required".into()));
    }
    let team_name = match request.team_name.as_deref().map(str::trim) {
        None | Some("") => user.team.clone(),
        Some(team) => team.to_owned(),
    };
    if !user.is_admin() && team_name != user.team {
        return Err(ApiError::Forbidden(
            "You are not allowed to create an API key for another team".into(),
        ));
    }
    if request.quota.is_some() && !user.is_admin() {
        return Err(ApiError::Forbidden("only admin can set api-key quota".into()));
    }
    let quota = QuotaSpec::from_json(request.quota.as_ref())
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let quota = quota.map(|q| serde_json::to_value(q).unwrap_or_default());
    if team_name != ADMIN_TEAM {
        if team_name.contains("--") {
            return Err(ApiError::BadRequest(format!(
                "namespace \"{team_name}\" must not contain \"--\": it separates namespace and name in sandbox IDs"
            )));
        }
        if !is_dns_label(&team_name) {
            return Err(ApiError::BadRequest(format!(
                "Kubernetes namespace \"{team_name}\" is not a valid name: use lowercase letters, digits and '-'"
            )));
        }
    }
    let (_, text) = ApiKey::generate();
    let hex = text.trim_start_matches("e2b_");
    let record = KeyRecord {
        id: uuid::Uuid::new_v4().to_string(),
        name,
        key_hash: key_hash(&text),
        mask: Mask {
            masked_value_prefix: hex[..2].to_owned(),
            masked_value_suffix: hex[hex.len() - 4..].to_owned(),
            prefix: "e2b_".into(),
            value_length: hex.len(),
        },
        created_at: crate::claim::truncate_to_second(jiff::Timestamp::now()).to_string(),
        created_by: Some(CreatedBy { email: String::new(), id: user.id.clone() }),
        team: Team { id: String::new(), name: team_name.clone() },
        quota,
    };
    let record = state
        .keys
        .modify(|records| {
            // One ID per team: reuse the team's, the admin team's well-known one, or a new one.
            let team_id = if team_name == ADMIN_TEAM {
                ADMIN_TEAM_ID.to_owned()
            } else {
                records
                    .records()
                    .find(|r| r.team.name == team_name)
                    .map_or_else(|| uuid::Uuid::new_v4().to_string(), |r| r.team.id.clone())
            };
            let mut record = record.clone();
            record.team.id = team_id;
            records.insert(record.clone())?;
            Ok(record)
        })
        .await?;
    info!(key = %record.id, team = %record.team.name, "API key created");
    let created =
        CreatedTeamApiKey { listed: record.listed(), key: text, team: record.team.clone() };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// The admin key from configuration, as a list entry.
fn admin_entry(since: &str) -> TeamApiKey {
    TeamApiKey {
        created_at: since.to_owned(),
        id: ADMIN_KEY_ID.into(),
        mask: Mask {
            masked_value_prefix: String::new(),
            masked_value_suffix: String::new(),
            prefix: "e2b_".into(),
            value_length: 40,
        },
        name: "admin".into(),
        created_by: None,
        last_used: None,
        quota: None,
    }
}

/// `GET /api-keys`: the caller's team's keys (admin: every key).
pub(super) async fn list<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
) -> Result<Json<Vec<TeamApiKey>>, ApiError> {
    let records = state.keys.records().await?;
    let mut out = Vec::new();
    // The reference's admin key record has the configuration key's ID: listed once.
    if user.is_admin() && !records.iter().any(|r| r.id == ADMIN_KEY_ID) {
        out.push(admin_entry(&state.keys.admin_since));
    }
    out.extend(
        records
            .iter()
            .filter(|r| user.is_admin() || r.team.name == user.team)
            .map(KeyRecord::listed),
    );
    Ok(Json(out))
}

/// `DELETE /api-keys/{id}`: 204; 404 unknown; 403 the admin key or another team's key.
pub(super) async fn delete<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if id == ADMIN_KEY_ID {
        return Err(ApiError::Forbidden("the well-known admin api-key cannot be deleted".into()));
    }
    let limited = state
        .keys
        .modify(|records| {
            let record =
                records.get(&id).ok_or_else(|| ApiError::NotFound("API key not found".into()))?;
            if !user.is_admin() && record.team.name != user.team {
                return Err(ApiError::Forbidden(
                    "You are not allowed to delete this API key".into(),
                ));
            }
            let limited = record.quota_spec().is_some();
            records.remove(&id);
            Ok(limited)
        })
        .await?;
    info!(key = %id, "API key deleted");
    if limited && let Some(quota) = state.engine.quota() {
        quota.cleanup_in_background(&id);
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api-keys/compatible`: the caller's key in the SDK's form: oka's keys as they are, a
/// raw key taken over from the reference (sent raw or encoded) in the reference's encoding.
pub(super) async fn compatible(headers: HeaderMap) -> Result<Json<serde_json::Value>, ApiError> {
    let key = headers
        .get(API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::Auth(AuthError::Missing))?;
    let raw = key_compat::to_raw(key);
    Ok(Json(serde_json::json!({ "key": key_compat::sdk_compatible(&raw) })))
}

/// `GET /teams`: the caller's team (admin: every team that has keys, and admin).
pub(super) async fn teams<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
) -> Result<Json<Vec<ListedTeam>>, ApiError> {
    let records = state.keys.records().await?;
    let mut teams: BTreeMap<String, String> = BTreeMap::new();
    if user.is_admin() {
        teams.insert(ADMIN_TEAM.into(), ADMIN_TEAM_ID.into());
        for record in &records {
            teams.entry(record.team.name.clone()).or_insert_with(|| record.team.id.clone());
        }
    } else if let Some(record) = records.iter().find(|r| r.team.name == user.team) {
        teams.insert(record.team.name.clone(), record.team.id.clone());
    }
    Ok(Json(
        teams
            .into_iter()
            .map(|(name, team_id)| ListedTeam {
                is_default: name == user.team,
                team_id,
                name,
                api_key: String::new(),
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(json: &str) -> Option<KeyRecord> {
        KeyRecord::from_stored("0b8e9d8c-7f1a-4c39-8d0e-51c2a3b4d5e6", json.as_bytes())
    }

    #[test]
    fn a_reference_record_is_hashed_and_a_missing_team_is_the_admin_team() {
        let record = stored(
            r#"{"createdAt":"2026-05-01T10:00:00Z","id":"0b8e9d8c-7f1a-4c39-8d0e-51c2a3b4d5e6","key":"raw","mask":{"maskedValuePrefix":"","maskedValueSuffix":"","prefix":"","valueLength":0},"name":"admin","createdBy":null,"lastUsed":null}"#,
        )
        .expect("a record");
        assert_eq!(record.key_hash, key_hash("raw"));
        assert_eq!(record.team.name, ADMIN_TEAM);
        assert_eq!(record.team.id, ADMIN_TEAM_ID);
        assert!(record.user().is_admin());
        // No usable key: not a record.
        assert!(stored(r#"{"id":"x","key":""}"#).is_none());
        assert!(stored(&format!(r#"{{"id":"x","key":"{INERT_KEY_PREFIX}00"}}"#)).is_none());
        assert!(stored("not json").is_none());
    }

    #[test]
    fn a_quota_in_the_reference_s_wire_form_is_read_as_limits() {
        let spec = |quota: &str| {
            stored(&format!(
                r#"{{"id":"x","key":"raw","team":{{"id":"t","name":"team-a"}},"quota":{quota}}}"#
            ))
            .expect("a record")
            .quota_spec()
        };
        let limits = spec(r#"{"limits":[{"dimension":"sandbox.count","scope":"all","limit":5}]}"#);
        let wire = spec(r#"{"all":{"sandbox.count":5}}"#);
        let short = spec(r#"{"all":{"count":5}}"#);
        assert!(limits.is_some());
        assert_eq!(limits, wire);
        assert_eq!(limits, short);
        let both = spec(
            r#"{"running":{"limits.cpu":8000,"limits.memory":16384},"all":{"sandbox.count":50}}"#,
        )
        .expect("limited");
        assert_eq!(both.limits.len(), 3);
        // Unknown scopes or dimensions are not guessed at.
        assert_eq!(spec(r#"{"all":{"gpu":1}}"#), None);
    }
}
