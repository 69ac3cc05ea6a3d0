//! The HTTP handlers: thin, each reads the request, calls the typed store operations and
//! answers JSON, a Table or a `Status`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use oka_store::{Preconditions, Requirement, Selector, Store};
use serde_json::{Value, json};

use oka_admission::{Admission, AdmissionError, FieldValidation, Operation};

use crate::listing::{self, Continue, ListOptions};
use crate::resources::{self, Resource, Scale};
use crate::status::ApiStatus;
use crate::table::{self, IncludeObject};
use crate::typed::{OpError, OpResult, dispatch};
use crate::{KubeApi, json_response, watch};

type Api<S> = State<Arc<KubeApi<S>>>;
type Answer = Result<Response, ApiStatus>;

/// The object routes of one group version (`/api/v1`, `/apis/agents.kruise.io/v1alpha1`).
/// A group's routes also take its cluster-scoped kinds (`/apis/<group>/<version>/<plural>` and
/// `.../<plural>/<name>[/<sub>]`); the core group's one cluster-scoped kind, Namespace, has
/// routes of its own.
fn resource_routes<S: Store>(
    router: Router<Arc<KubeApi<S>>>,
    prefix: &str,
    cluster_kinds: bool,
) -> Router<Arc<KubeApi<S>>> {
    let router = if cluster_kinds {
        router
            .route(
                &format!("{prefix}/{{plural}}"),
                get(list_all::<S>).post(create_cluster::<S>).delete(delete_collection_cluster::<S>),
            )
            .route(
                &format!("{prefix}/{{plural}}/{{name}}"),
                get(get_cluster::<S>)
                    .put(replace_cluster::<S>)
                    .patch(patch_cluster::<S>)
                    .delete(delete_cluster::<S>),
            )
            .route(
                &format!("{prefix}/{{plural}}/{{name}}/{{sub}}"),
                get(get_subresource_cluster::<S>)
                    .put(replace_subresource_cluster::<S>)
                    .patch(patch_subresource_cluster::<S>),
            )
    } else {
        router.route(&format!("{prefix}/{{plural}}"), get(list_all::<S>))
    };
    router
        .route(
            &format!("{prefix}/namespaces/{{ns}}/{{plural}}"),
            get(list_namespaced::<S>).post(create::<S>).delete(delete_collection::<S>),
        )
        .route(
            &format!("{prefix}/namespaces/{{ns}}/{{plural}}/{{name}}"),
            get(get_object::<S>).put(replace::<S>).patch(patch::<S>).delete(delete::<S>),
        )
        .route(
            &format!("{prefix}/namespaces/{{ns}}/{{plural}}/{{name}}/{{sub}}"),
            get(get_subresource::<S>).put(replace_subresource::<S>).patch(patch_subresource::<S>),
        )
}

/// Every route, behind the bearer token check.
pub(crate) fn routes<S: Store>(api: Arc<KubeApi<S>>) -> Router {
    let mut router = Router::new()
        .route("/version", get(version))
        .route("/api", get(core_versions::<S>))
        .route(
            "/api/v1",
            get(|State(api): Api<S>| async move {
                ok(&resources::resource_list(&api.resources, "", "v1"))
            }),
        )
        .route("/api/v1/namespaces", get(list_namespaces::<S>).post(create_namespace::<S>))
        .route(
            "/api/v1/namespaces/{ns}",
            get(get_namespace::<S>)
                .put(replace_namespace::<S>)
                .patch(patch_namespace::<S>)
                .delete(delete_namespace::<S>),
        )
        .route(
            "/api/v1/namespaces/{ns}/status",
            get(get_namespace_status::<S>)
                .put(replace_namespace_status::<S>)
                .patch(patch_namespace_status::<S>),
        )
        .route("/apis", get(groups::<S>))
        .route("/openapi/v2", get(openapi_v2))
        .route("/openapi/v3", get(|State(api): Api<S>| async move { ok(&api.openapi.1) }))
        .route(
            &format!("/openapi/v3/{}", crate::openapi::GROUP_VERSION_PATH),
            get(|State(api): Api<S>| async move { ok(&api.openapi.0) }),
        );
    router = resource_routes(router, "/api/v1", false);
    for (group, version) in resources::group_versions(&api.resources) {
        let prefix = format!("/apis/{group}/{version}");
        router = router.route(
            &prefix,
            get(move |State(api): Api<S>| async move {
                ok(&resources::resource_list(&api.resources, &group, &version))
            }),
        );
        router = resource_routes(router, &prefix, true);
    }
    router
        .fallback(|| async { ApiStatus::no_such_path() })
        .layer(middleware::from_fn_with_state(Arc::clone(&api), known_resource::<S>))
        .layer(middleware::from_fn_with_state(Arc::clone(&api), authenticate::<S>))
        .with_state(api)
}

/// 404 for a resource path whose group version does not serve that resource (the routes of
/// every group version take any resource name).
async fn known_resource<S: Store>(State(api): Api<S>, request: Request, next: Next) -> Response {
    if let Some(access) =
        crate::auth::access(request.method().as_str(), request.uri().path(), false)
        && !api.resources.iter().any(|r| {
            r.group == access.group
                && r.version == access.version
                && r.plural == access.resource
                && (r.namespaced || access.namespace.is_none())
        })
    {
        return ApiStatus::no_such_path().into_response();
    }
    next.run(request).await
}

fn ok(value: &Value) -> Response {
    json_response(StatusCode::OK, value)
}

/// Lets through requests whose bearer token is the admin token, or a team's API key used in
/// the team's namespace; 401 for no or an unknown token, 403 outside the team's namespace.
async fn authenticate<S: Store>(State(api): Api<S>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let Some(token) = token else { return ApiStatus::unauthorized().into_response() };
    if constant_time_eq(token.as_bytes(), api.config.admin_token.as_bytes()) {
        return next.run(request).await;
    }
    let principal = match &api.config.team_keys {
        Some(keys) => keys.authenticate(&token).await,
        None => None,
    };
    let Some(principal) = principal else { return ApiStatus::unauthorized().into_response() };
    if let Some(own) = &principal.namespace
        && let Err(e) = crate::namespaces::ensure(&api.store, own).await
    {
        return ApiStatus::from_store(&e, "namespaces", "Namespace", own).into_response();
    }
    let watch = query(request.uri().query()).get("watch").is_some_and(|w| w == "true" || w == "1");
    let access = crate::auth::access(request.method().as_str(), request.uri().path(), watch);
    if let Some(access) = access
        && let Err(e) = crate::auth::authorize(&principal, &access)
    {
        return e.into_response();
    }
    next.run(request).await
}

/// Compares without an early exit, so the time taken says nothing about the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn version() -> Response {
    ok(&json!({
        "major": "1",
        "minor": "32",
        "gitVersion": concat!("v1.32.0+oka-", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    }))
}

/// An empty OpenAPI v2 document (protobuf, what kubectl asks for): kubectl's client-side
/// validation finds no schema for our kinds and skips them, as it does for a CRD without one,
/// instead of refusing every `kubectl apply`. The real schemas are still to be served.
async fn openapi_v2() -> Response {
    let mut response = (StatusCode::OK, Vec::<u8>::new()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static(
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        ),
    );
    response
}

/// Whether the client takes aggregated discovery (`apidiscovery.k8s.io/v2`).
fn wants_aggregated(headers: &HeaderMap) -> bool {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    accept.split(',').any(|media| {
        let params: BTreeSet<&str> = media.split(';').map(str::trim).collect();
        params.contains("g=apidiscovery.k8s.io")
            && params.contains("v=v2")
            && params.contains("as=APIGroupDiscoveryList")
    })
}

fn aggregated(value: &Value) -> Response {
    let mut response = ok(value);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static(resources::AGGREGATED_MEDIA_TYPE),
    );
    response
}

async fn core_versions<S: Store>(State(api): Api<S>, headers: HeaderMap) -> Response {
    if wants_aggregated(&headers) {
        return aggregated(&resources::aggregated_core(&api.resources));
    }
    ok(&resources::core_versions(&api.config.server_address))
}

async fn groups<S: Store>(State(api): Api<S>, headers: HeaderMap) -> Response {
    if wants_aggregated(&headers) {
        return aggregated(&resources::aggregated_groups(&api.resources));
    }
    ok(&resources::group_list(&api.resources))
}

const NAMESPACES: &str = "namespaces";

async fn list_namespaces<S: Store>(state: Api<S>, headers: HeaderMap, raw: RawQuery) -> Answer {
    list_all(state, Path(NAMESPACES.to_owned()), headers, raw).await
}

async fn create_namespace<S: Store>(
    State(api): Api<S>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let r = resource(&api, NAMESPACES)?;
    let mode = WriteMode::parse(raw.as_deref())?;
    let body = parse_object(&headers, &body)?;
    let name = body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let ns = r.filed_under(None, name);
    Ok(written_response(StatusCode::CREATED, &typed_create(&api, r, &ns, body, &mode).await?))
}

async fn get_namespace<S: Store>(
    state: Api<S>,
    Path(name): Path<String>,
    headers: HeaderMap,
    raw: RawQuery,
) -> Answer {
    get_cluster(state, Path((NAMESPACES.to_owned(), name)), headers, raw).await
}

async fn replace_namespace<S: Store>(
    state: Api<S>,
    Path(name): Path<String>,
    raw: RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    replace_cluster(state, Path((NAMESPACES.to_owned(), name)), raw, headers, body).await
}

async fn patch_namespace<S: Store>(
    state: Api<S>,
    Path(name): Path<String>,
    raw: RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    patch_cluster(state, Path((NAMESPACES.to_owned(), name)), raw, headers, body).await
}

async fn delete_namespace<S: Store>(
    state: Api<S>,
    Path(name): Path<String>,
    raw: RawQuery,
    body: Bytes,
) -> Answer {
    delete_cluster(state, Path((NAMESPACES.to_owned(), name)), raw, body).await
}

async fn get_namespace_status<S: Store>(state: Api<S>, Path(name): Path<String>) -> Answer {
    get_subresource_cluster(state, Path((NAMESPACES.to_owned(), name, "status".to_owned()))).await
}

async fn replace_namespace_status<S: Store>(
    state: Api<S>,
    Path(name): Path<String>,
    raw: RawQuery,
    body: Bytes,
) -> Answer {
    let path = Path((NAMESPACES.to_owned(), name, "status".to_owned()));
    replace_subresource_cluster(state, path, raw, body).await
}

async fn patch_namespace_status<S: Store>(
    state: Api<S>,
    Path(name): Path<String>,
    raw: RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let path = Path((NAMESPACES.to_owned(), name, "status".to_owned()));
    patch_subresource_cluster(state, path, raw, headers, body).await
}

/// Where a cluster-scoped object named `name` of `plural` is filed in the store
/// ([`Resource::filed_under`]); 404 for a namespaced kind, whose objects have no cluster path.
fn cluster_filing<S>(api: &KubeApi<S>, plural: &str, name: &str) -> Result<String, ApiStatus> {
    let r = resource(api, plural)?;
    if r.namespaced {
        return Err(ApiStatus::no_such_path());
    }
    Ok(r.filed_under(None, name))
}

async fn create_cluster<S: Store>(
    State(api): Api<S>,
    Path(plural): Path<String>,
    raw: RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let ns = cluster_filing(&api, &plural, "")?;
    create(State(api), Path((ns, plural)), raw, headers, body).await
}

async fn delete_collection_cluster<S: Store>(
    State(api): Api<S>,
    Path(plural): Path<String>,
    raw: RawQuery,
    body: Bytes,
) -> Answer {
    let ns = cluster_filing(&api, &plural, "")?;
    delete_collection(State(api), Path((ns, plural)), raw, body).await
}

async fn get_cluster<S: Store>(
    State(api): Api<S>,
    Path((plural, name)): Path<(String, String)>,
    headers: HeaderMap,
    raw: RawQuery,
) -> Answer {
    let ns = cluster_filing(&api, &plural, &name)?;
    get_object(State(api), Path((ns, plural, name)), headers, raw).await
}

async fn replace_cluster<S: Store>(
    State(api): Api<S>,
    Path((plural, name)): Path<(String, String)>,
    raw: RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let ns = cluster_filing(&api, &plural, &name)?;
    replace(State(api), Path((ns, plural, name)), raw, headers, body).await
}

async fn patch_cluster<S: Store>(
    State(api): Api<S>,
    Path((plural, name)): Path<(String, String)>,
    raw: RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let ns = cluster_filing(&api, &plural, &name)?;
    patch(State(api), Path((ns, plural, name)), raw, headers, body).await
}

async fn delete_cluster<S: Store>(
    State(api): Api<S>,
    Path((plural, name)): Path<(String, String)>,
    raw: RawQuery,
    body: Bytes,
) -> Answer {
    let ns = cluster_filing(&api, &plural, &name)?;
    delete(State(api), Path((ns, plural, name)), raw, body).await
}

async fn get_subresource_cluster<S: Store>(
    State(api): Api<S>,
    Path((plural, name, sub)): Path<(String, String, String)>,
) -> Answer {
    let ns = cluster_filing(&api, &plural, &name)?;
    get_subresource(State(api), Path((ns, plural, name, sub))).await
}

async fn replace_subresource_cluster<S: Store>(
    State(api): Api<S>,
    Path((plural, name, sub)): Path<(String, String, String)>,
    raw: RawQuery,
    body: Bytes,
) -> Answer {
    let ns = cluster_filing(&api, &plural, &name)?;
    replace_subresource(State(api), Path((ns, plural, name, sub)), raw, body).await
}

async fn patch_subresource_cluster<S: Store>(
    State(api): Api<S>,
    Path((plural, name, sub)): Path<(String, String, String)>,
    raw: RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let ns = cluster_filing(&api, &plural, &name)?;
    patch_subresource(State(api), Path((ns, plural, name, sub)), raw, headers, body).await
}

/// The query string's parameters.
fn query(raw: Option<&str>) -> BTreeMap<String, String> {
    form_urlencoded::parse(raw.unwrap_or_default().as_bytes()).into_owned().collect()
}

fn resource<'a, S>(api: &'a KubeApi<S>, plural: &str) -> Result<&'a Resource, ApiStatus> {
    api.resources.iter().find(|r| r.plural == plural).ok_or_else(ApiStatus::no_such_path)
}

/// A typed operation's error as the API server words it for object `name` of `r`.
pub(crate) fn op_error(e: OpError, r: &Resource, name: &str) -> ApiStatus {
    match e {
        OpError::Store(e) => ApiStatus::from_store(&e, &r.qualified(), &r.kind, name),
        OpError::Decode(message) => ApiStatus::bad_request(format!(
            "the body of the request is not a valid {}: {message}",
            r.kind
        )),
    }
}

pub(crate) async fn typed_list<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: Option<&str>,
    selector: &Selector,
) -> Result<(Vec<Value>, String), ApiStatus> {
    dispatch!(r.kind.as_str(), list(&api.store, ns, selector), Ok((Vec::new(), String::new())))
        .map_err(|e| op_error(e, r, ""))
}

/// Deletes one object in the background, as its owner's garbage collection would.
pub(crate) async fn typed_delete<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    name: &str,
) -> Result<(), ApiStatus> {
    let pre = Preconditions::default();
    dispatch!(r.kind.as_str(), delete(&api.store, ns, name, &pre), Ok(Value::Null))
        .map(|_| ())
        .map_err(|e| op_error(e, r, name))
}

async fn typed_get<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    name: &str,
) -> Result<Value, ApiStatus> {
    dispatch!(r.kind.as_str(), get(&api.store, ns, name), Err(OpError::Decode(String::new())))
        .map_err(|e| op_error(e, r, name))
}

/// Which part of an object a write replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Metadata and spec.
    Main,
    /// `spec.replicas` through the scale subresource: stored as [`Part::Main`], admitted
    /// without the webhooks (they are registered for the resource alone).
    Scale,
    /// `status` (the status subresource).
    Status,
}

/// How a write is admitted, and whether it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WriteMode {
    /// `dryRun=All`: every check, no write.
    dry: bool,
    /// `fieldValidation`: what unknown fields do.
    validation: FieldValidation,
    /// Whether the write is admitted: a client's is; the server's own bookkeeping (an
    /// owner reference or finalizer removed) changes nothing admission checks.
    admitted: bool,
    /// `fieldManager`: who the fields a write changes are recorded for in `managedFields`
    /// (none for the server's own writes and for applies, which record their own).
    manager: Option<String>,
}

impl WriteMode {
    /// `dryRun` and `fieldValidation` from the query.
    fn parse(raw: Option<&str>) -> Result<Self, ApiStatus> {
        let query = query(raw);
        let validation = match query.get("fieldValidation") {
            None => FieldValidation::Warn,
            Some(text) => FieldValidation::parse(text).ok_or_else(|| {
                ApiStatus::bad_request(format!(
                    "fieldValidation: Unsupported value: \"{text}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
                ))
            })?,
        };
        let manager = query.get("fieldManager").cloned();
        Ok(WriteMode { dry: dry_run(raw)?, validation, admitted: true, manager })
    }

    /// A write of the server's own bookkeeping: stored as it is.
    const INTERNAL: WriteMode = WriteMode {
        dry: false,
        validation: FieldValidation::Ignore,
        admitted: false,
        manager: None,
    };
}

/// An object as a write left it, and the warnings for the client.
struct Written {
    object: Value,
    warnings: Vec<String>,
}

/// `written` with its warnings as `Warning: 299 - "..."` headers, as the API server sends them.
fn written_response(code: StatusCode, written: &Written) -> Response {
    let mut response = json_response(code, &written.object);
    for warning in &written.warnings {
        let text = format!("299 - {}", serde_json::Value::from(warning.as_str()));
        if let Ok(value) = axum::http::HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

/// The API server's defaults of the built-in kinds served: a Secret's `type` is `Opaque`, and
/// its `stringData` is written into `data`, base64-encoded.
fn builtin_defaults(kind: &str, body: &mut Value) {
    if kind == "Namespace" {
        let name = body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let name = name.to_owned();
        crate::namespaces::defaults(body, &name);
        return;
    }
    if kind != "Secret" {
        return;
    }
    let Value::Object(map) = body else { return };
    if map.get("type").and_then(Value::as_str).is_none_or(str::is_empty) {
        map.insert("type".to_owned(), json!("Opaque"));
    }
    if let Some(Value::Object(strings)) = map.remove("stringData") {
        use base64::Engine as _;
        let data = map.entry("data").or_insert_with(|| json!({}));
        if let Value::Object(data) = data {
            for (key, value) in strings {
                let text = value.as_str().unwrap_or_default();
                let encoded = base64::engine::general_purpose::STANDARD.encode(text);
                data.insert(key, json!(encoded));
            }
        }
    }
}

/// What a write is admitted as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A create or update of the resource: the webhooks, mutating and validating, run.
    Resource(Operation),
    /// An update through the `status` or `scale` subresource: they do not.
    Subresource,
}

/// Admits `body` as a `kind` object written as `target` (pruning, defaults, the mutating
/// webhooks, validation, the CRD's CEL rules, the validating webhooks; `old` is the stored
/// object an update replaces), or answers the API server's error for it.
fn admit(
    api_admission: &Admission,
    r: &Resource,
    target: Target,
    body: &mut Value,
    old: Option<&Value>,
    validation: FieldValidation,
) -> Result<Vec<String>, ApiStatus> {
    let name =
        body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let operation = match target {
        Target::Resource(operation) => operation,
        Target::Subresource => Operation::Update,
    };
    if !r.crd {
        // A built-in kind: its metadata is checked here, the rest by the store's decoding.
        builtin_defaults(&r.kind, body);
        let errors = oka_admission::validate_metadata(body, operation);
        let label = if r.kind == "Namespace" && operation == Operation::Create {
            crate::namespaces::name_errors(&name)
        } else {
            None
        };
        if errors.is_empty() && label.is_none() {
            return Ok(Vec::new());
        }
        let mut causes: Vec<(&str, String)> =
            errors.iter().map(|e| (e.field.as_str(), e.body())).collect();
        if let Some(label) = label {
            causes.retain(|(field, _)| *field != "metadata.name");
            causes.push(("metadata.name", label));
        }
        return Err(ApiStatus::invalid(&r.kind, &r.group, &name, &causes));
    }
    let admitted = match target {
        Target::Resource(_) => api_admission.admit(&r.kind, operation, body, old, validation),
        Target::Subresource => api_admission.admit_subresource(&r.kind, body, old, validation),
    };
    match admitted {
        Ok(admitted) => Ok(admitted.warnings),
        Err(e @ AdmissionError::UnknownFields(_)) => {
            let message = e.to_string();
            Err(ApiStatus::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: {message}",
                kind = r.kind,
                version = r.version,
            )))
        }
        Err(AdmissionError::Invalid(errors)) => {
            let causes: Vec<(&str, String)> =
                errors.iter().map(|e| (e.field.as_str(), e.body())).collect();
            Err(ApiStatus::invalid(&r.kind, &r.group, &name, &causes))
        }
        Err(AdmissionError::Denied(denial)) => Err(ApiStatus::denied(denial.message())),
        Err(AdmissionError::UnknownKind(kind)) => {
            Err(ApiStatus::internal(format!("no schema for kind {kind}")))
        }
    }
}

/// Admits `body` as a change of `part` of the stored object and writes it (or, with `dryRun`,
/// answers what it would be). `read` is the stored object when the caller has just read it;
/// otherwise it is read here when admission needs it.
async fn typed_update<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    mut body: Value,
    part: Part,
    mode: &WriteMode,
    read: Option<Value>,
) -> Result<Written, ApiStatus> {
    let warnings = if mode.admitted {
        // A CRD's transition rules (`oldSelf`) compare with the stored object, and the fields
        // a manager changes are found against it; a missing one is reported by the write
        // itself.
        let name =
            body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let wanted = r.crd || mode.manager.is_some();
        let current = match read {
            Some(read) => Some(read),
            None if wanted => typed_get(api, r, ns, &name).await.ok(),
            None => None,
        };
        if let (Part::Main | Part::Scale, Some(manager), Some(current)) =
            (part, &mode.manager, &current)
        {
            let now = managed_time();
            let schema = api.admission.schema(&r.kind);
            crate::ssa::record_update(current, &mut body, manager, &r.api_version(), schema, &now);
        }
        if let (Part::Status, Some(current)) = (part, &current) {
            body = status_view(current, &body);
        }
        let target = match part {
            Part::Main => Target::Resource(Operation::Update),
            Part::Scale | Part::Status => Target::Subresource,
        };
        let warnings =
            admit(&api.admission, r, target, &mut body, current.as_ref(), mode.validation)?;
        if r.kind == "PoolAutoscaler" && matches!(part, Part::Main) {
            pool_autoscaler_against_others(api, r, ns, &body, current.as_ref()).await?;
        }
        warnings
    } else {
        Vec::new()
    };
    let name =
        body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let store = &api.store;
    let none = || Err(OpError::Decode(String::new()));
    let kind = r.kind.as_str();
    let object = match (part, mode.dry) {
        (Part::Main | Part::Scale, false) => dispatch!(kind, update(store, ns, body), none()),
        (Part::Main | Part::Scale, true) => dispatch!(kind, update_dry(store, ns, body), none()),
        (Part::Status, false) => dispatch!(kind, update_status(store, ns, body), none()),
        (Part::Status, true) => dispatch!(kind, update_status_dry(store, ns, body), none()),
    }
    .map_err(|e| op_error(e, r, &name))?;
    Ok(Written { object, warnings })
}

/// What a status write admits and stores: the stored object with the body's `status` (and
/// the body's `resourceVersion`, its precondition), as the API server's status strategy
/// makes it before validation: changes to anything else are ignored, not refused.
fn status_view(current: &Value, body: &Value) -> Value {
    let mut view = current.clone();
    if let Value::Object(map) = &mut view {
        match body.get("status") {
            Some(status) => map.insert("status".to_owned(), status.clone()),
            None => map.remove("status"),
        };
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            match body.pointer("/metadata/resourceVersion") {
                Some(version) => meta.insert("resourceVersion".to_owned(), version.clone()),
                None => meta.remove("resourceVersion"),
            };
        }
    }
    view
}

/// `dryRun`: `All` asks for every check and no write; anything else is refused.
fn dry_run(raw: Option<&str>) -> Result<bool, ApiStatus> {
    let values: Vec<String> = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .filter(|(k, _)| k == "dryRun")
        .map(|(_, v)| v.into_owned())
        .collect();
    match values.as_slice() {
        [] => Ok(false),
        [all] if all == "All" => Ok(true),
        other => Err(ApiStatus::bad_request(format!(
            "dryRun: Unsupported value: {other:?}: supported values: \"All\""
        ))),
    }
}

/// Whether the client asked for a `meta.k8s.io/v1` Table among the media types it accepts.
fn wants_table(headers: &HeaderMap) -> bool {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    accept.split(',').any(|media| {
        let params: BTreeSet<&str> = media.split(';').map(str::trim).collect();
        params.contains("as=Table") && params.contains("v=v1") && params.contains("g=meta.k8s.io")
    })
}

async fn list_all<S: Store>(
    State(api): Api<S>,
    Path(plural): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Answer {
    list(&api, &plural, None, &headers, raw.as_deref()).await
}

async fn list_namespaced<S: Store>(
    State(api): Api<S>,
    Path((ns, plural)): Path<(String, String)>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Answer {
    list(&api, &plural, Some(&ns), &headers, raw.as_deref()).await
}

async fn list<S: Store>(
    api: &KubeApi<S>,
    plural: &str,
    ns: Option<&str>,
    headers: &HeaderMap,
    raw: Option<&str>,
) -> Answer {
    let r = resource(api, plural)?;
    let query = query(raw);
    let options = ListOptions::parse(&query, &r.selectable_fields())?;
    let include = IncludeObject::parse(query.get("includeObject").map(String::as_str));
    let table = wants_table(headers).then_some(include);
    if options.watch {
        let format = watch::Format {
            table,
            columns: r.columns.clone(),
            kind: r.kind.clone(),
            api_version: r.api_version(),
        };
        return watch::serve(api, r, ns, &options, format).await;
    }
    let read = list_page(api, r, ns, &options);
    let page = match options.timeout {
        Some(limit) => tokio::time::timeout(limit, read).await.map_err(|_| {
            ApiStatus::timeout(format!(
                "the list did not finish within timeoutSeconds={}",
                limit.as_secs()
            ))
        })??,
        None => read.await?,
    };
    let mut metadata = json!({"resourceVersion": page.rv.to_string()});
    if let Some(token) = &page.continue_token {
        crate::merge_patch(
            &mut metadata,
            &json!({"continue": token, "remainingItemCount": page.remaining}),
        );
    }
    if let Some(include) = table {
        let mut table = table::table(
            &r.columns,
            &page.items,
            &page.rv.to_string(),
            include,
            jiff::Timestamp::now(),
        );
        table["metadata"] = metadata;
        return Ok(ok(&table));
    }
    Ok(ok(&json!({
        "apiVersion": r.api_version(),
        "kind": r.list_kind,
        "metadata": metadata,
        "items": page.items,
    })))
}

/// One page of a list: the first (its snapshot kept for the pages after it) or the one a
/// `continue` token asks for.
async fn list_page<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: Option<&str>,
    options: &ListOptions,
) -> Result<listing::Page, ApiStatus> {
    let scope = format!(
        "{}\n{}\n{}\n{}",
        r.plural,
        ns.unwrap_or_default(),
        options.label_text,
        options.field_text
    );
    let page = match &options.continue_token {
        Some(token) => {
            let token = Continue::decode(token)?;
            match api.snapshots.next_page(&scope, &token, options.limit)? {
                Some(page) => page,
                None => {
                    let (items, rv) = matching(api, r, ns, options).await?;
                    listing::current_page(&items, rv, &token, options.limit)
                }
            }
        }
        None => {
            let (items, rv) = matching(api, r, ns, options).await?;
            options.check_version(rv)?;
            api.snapshots.first_page(&scope, rv, items, options.limit)
        }
    };
    Ok(page)
}

/// The objects of `r` in `ns` that match the options' selectors, in the store's order, and
/// the resourceVersion they were read at.
async fn matching<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: Option<&str>,
    options: &ListOptions,
) -> Result<(Vec<Value>, u64), ApiStatus> {
    let (mut items, rv) = typed_list(api, r, ns, &options.labels).await?;
    if !options.fields.is_empty() {
        items.retain(|o| options.fields.matches(o));
    }
    let rv = rv.parse().map_err(|_| {
        ApiStatus::internal(format!("the store answered resourceVersion {rv}, not a number"))
    })?;
    Ok((items, rv))
}

async fn get_object<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Answer {
    let r = resource(&api, &plural)?;
    let obj = typed_get(&api, r, &ns, &name).await?;
    check_get_version(&api, r, &ns, &obj, raw.as_deref()).await?;
    if wants_table(&headers) {
        let query = query(raw.as_deref());
        let include = IncludeObject::parse(query.get("includeObject").map(String::as_str));
        let rv = obj
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        return Ok(ok(&table::table(&r.columns, &[obj], &rv, include, jiff::Timestamp::now())));
    }
    Ok(ok(&obj))
}

/// A get's `resourceVersion`: any version not older than the one asked for is served, and
/// every read here is of the current state, so only a version the store has not reached yet
/// is refused (504, as the API server answers it); anything but a decimal is a bad request.
async fn check_get_version<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    obj: &Value,
    raw: Option<&str>,
) -> Result<(), ApiStatus> {
    let query = query(raw);
    let requested = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => return Ok(()),
        Some(text) => text
            .parse::<u64>()
            .map_err(|_| ApiStatus::bad_request(format!("invalid resource version: \"{text}\"")))?,
    };
    let own = obj.pointer("/metadata/resourceVersion").and_then(Value::as_str);
    if own.and_then(|v| v.parse::<u64>().ok()).is_some_and(|own| requested <= own) {
        return Ok(());
    }
    // The object is older than the version asked for: the store's current version decides.
    let (_, current) = typed_list(api, r, Some(ns), &never_matches()).await?;
    let current = current.parse::<u64>().unwrap_or_default();
    if requested > current {
        return Err(ApiStatus::too_large_resource_version(requested, current));
    }
    Ok(())
}

/// A label selector no object matches, to read only a list's resourceVersion.
fn never_matches() -> Selector {
    Selector::new(vec![
        Requirement::Exists("oka.dev/never-set".to_owned()),
        Requirement::DoesNotExist("oka.dev/never-set".to_owned()),
    ])
}

/// An object in a create or replace body: JSON, or the protobuf kubectl sends built-in kinds in.
fn parse_object(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiStatus> {
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if content_type.split(';').next().is_some_and(|m| m.trim() == crate::protobuf::MEDIA_TYPE) {
        return crate::protobuf::decode(body).map_err(|e| {
            ApiStatus::bad_request(format!("the body of the request is not a valid object: {e}"))
        });
    }
    parse_body(body)
}

fn parse_body(body: &Bytes) -> Result<Value, ApiStatus> {
    serde_json::from_slice(body)
        .map_err(|e| ApiStatus::bad_request(format!("the body of the request is not JSON: {e}")))
}

/// Checks that a body names the path's object (or names none, and then takes the path's).
fn name_from_path(body: &mut Value, name: &str) -> Result<(), ApiStatus> {
    match body.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if n != name => Err(ApiStatus::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))),
        Some(_) => Ok(()),
        None => {
            crate::merge_patch(body, &json!({"metadata": {"name": name}}));
            Ok(())
        }
    }
}

async fn create<S: Store>(
    State(api): Api<S>,
    Path((ns, plural)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let mode = WriteMode::parse(raw.as_deref())?;
    let body = parse_object(&headers, &body)?;
    Ok(written_response(StatusCode::CREATED, &typed_create(&api, r, &ns, body, &mode).await?))
}

/// Admits `body` as a new object and creates it (or, with `dryRun`, answers what it would
/// be): the one create path of every request that creates.
async fn typed_create<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    mut body: Value,
    mode: &WriteMode,
) -> Result<Written, ApiStatus> {
    if let Some(manager) = &mode.manager {
        // Every field of a new object is its creator's.
        let schema = api.admission.schema(&r.kind);
        let now = managed_time();
        crate::ssa::record_update(&json!({}), &mut body, manager, &r.api_version(), schema, &now);
    }
    let create = Target::Resource(Operation::Create);
    let warnings = admit(&api.admission, r, create, &mut body, None, mode.validation)?;
    if r.namespaced {
        let name = body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        crate::namespaces::admit_content(api, r, ns, name).await?;
    }
    if r.kind == "SandboxUpdateOps" {
        // The one webhook rule that reads the namespace: one active SandboxUpdateOps at a time.
        let (others, _) = typed_list(api, r, Some(ns), &Selector::everything()).await?;
        if let Some(denial) = oka_admission::webhooks::update_ops_against_others(&body, &others) {
            return Err(ApiStatus::denied(denial.message()));
        }
    }
    if r.kind == "PoolAutoscaler" {
        pool_autoscaler_against_others(api, r, ns, &body, None).await?;
    }
    let name =
        body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let store = &api.store;
    let none = || Err(OpError::Decode(String::new()));
    let object = if mode.dry {
        dispatch!(r.kind.as_str(), create_dry(store, ns, body), none())
    } else if r.is_namespace() {
        create_namespace_record(store, ns, body).await
    } else {
        dispatch!(r.kind.as_str(), create(store, ns, body), none())
    }
    .map_err(|e| op_error(e, r, &name))?;
    Ok(Written { object, warnings })
}

/// A Namespace is created `Active`.
async fn create_namespace_record<S: Store>(store: &S, ns: &str, body: Value) -> OpResult<Value> {
    let record: crate::namespaces::NamespaceRecord =
        serde_json::from_value(body).map_err(|e| OpError::Decode(e.to_string()))?;
    let created = store.create(ns, &record).await?;
    let active = crate::namespaces::activate(store, created).await?;
    serde_json::to_value(&active).map_err(|e| OpError::Decode(e.to_string()))
}

/// The PoolAutoscaler webhook rule that reads the namespace: one autoscaler per SandboxSet
/// (checked on a create and on an update that changes the target).
async fn pool_autoscaler_against_others<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    body: &Value,
    old: Option<&Value>,
) -> Result<(), ApiStatus> {
    let (others, _) = typed_list(api, r, Some(ns), &Selector::everything()).await?;
    match oka_admission::webhooks::pool_autoscaler_against_others(body, old, &others) {
        Some(denial) => Err(ApiStatus::denied(denial.message())),
        None => Ok(()),
    }
}

/// Now, as `managedFields` times are written.
fn managed_time() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

async fn replace<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let mode = WriteMode::parse(raw.as_deref())?;
    let mut body = parse_object(&headers, &body)?;
    name_from_path(&mut body, &name)?;
    Ok(written_response(
        StatusCode::OK,
        &typed_update(&api, r, &ns, body, Part::Main, &mode, None).await?,
    ))
}

/// The media types of the patches this server applies, as the API server lists them.
const PATCH_TYPES: &str =
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml";

/// Applies the request's patch (JSON patch or JSON merge patch, by its content type) to
/// `target`. A strategic merge patch is refused, as the API server refuses it for custom
/// resources.
fn apply_patch(
    r: &Resource,
    headers: &HeaderMap,
    body: &Bytes,
    target: &mut Value,
) -> Result<(), ApiStatus> {
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim();
    match media {
        "application/strategic-merge-patch+json" if !r.crd => {
            crate::merge::strategic_merge_patch(target, &parse_body(body)?);
            Ok(())
        }
        "application/merge-patch+json" => {
            crate::merge_patch(target, &parse_body(body)?);
            Ok(())
        }
        "application/json-patch+json" => crate::json_patch::apply(target, &parse_body(body)?)
            .map_err(|e| ApiStatus::invalid_patch(&e.to_string())),
        _ => Err(ApiStatus::unsupported_patch_type(PATCH_TYPES)),
    }
}

/// How many times a write that read the object retries when another write came between.
const RETRIES: usize = 8;

/// Reads object `name`, changes it with `modify` and writes `part` of it back, conditional on
/// the version read; as the API server does for a patch, a conflict with another writer reads
/// again and retries, unless `modify` set a resourceVersion of its own.
async fn read_modify_write<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    name: &str,
    part: Part,
    mode: WriteMode,
    mut modify: impl FnMut(&mut Value) -> Result<(), ApiStatus>,
) -> Result<Written, ApiStatus> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut obj = typed_get(api, r, ns, name).await?;
        let current = obj.clone();
        let read = obj.pointer("/metadata/resourceVersion").cloned();
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        modify(&mut obj)?;
        name_from_path(&mut obj, name)?;
        let own_version = obj.pointer("/metadata/resourceVersion").is_some();
        if !own_version && let Some(rv) = &read {
            crate::merge_patch(&mut obj, &json!({"metadata": {"resourceVersion": rv}}));
        }
        match typed_update(api, r, ns, obj, part, &mode, Some(current)).await {
            Err(e) if e.reason == "Conflict" && !own_version && attempt < RETRIES => continue,
            result => return result,
        }
    }
}

async fn patch<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let mode = WriteMode::parse(raw.as_deref())?;
    if media_type(&headers) == APPLY_PATCH {
        return server_side_apply(&api, r, &ns, &name, raw.as_deref(), mode, &body).await;
    }
    refuse_force(raw.as_deref())?;
    let patched = read_modify_write(&api, r, &ns, &name, Part::Main, mode, |obj| {
        apply_patch(r, &headers, &body, obj)
    })
    .await?;
    Ok(written_response(StatusCode::OK, &patched))
}

/// `force` belongs to server-side apply; on another patch the API server refuses it.
fn refuse_force(raw: Option<&str>) -> Result<(), ApiStatus> {
    if query(raw).contains_key("force") {
        return Err(ApiStatus::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            &[("force", "Forbidden: may not be specified for non-apply patch".to_owned())],
        ));
    }
    Ok(())
}

/// The media type of a server-side apply.
const APPLY_PATCH: &str = "application/apply-patch+yaml";

fn media_type(headers: &HeaderMap) -> &str {
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    content_type.split(';').next().unwrap_or_default().trim()
}

/// Server-side apply (see [`crate::ssa`]): the body is the manager's whole intent, in YAML or
/// JSON; an object that does not exist yet is created.
async fn server_side_apply<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    name: &str,
    raw: Option<&str>,
    mode: WriteMode,
    body: &Bytes,
) -> Answer {
    let query = query(raw);
    let Some(manager) = query.get("fieldManager").cloned() else {
        return Err(ApiStatus::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            &[("fieldManager", "Required value: is required for apply patch".to_owned())],
        ));
    };
    let force = query.get("force").is_some_and(|f| f == "true");
    let mut applied: Value = serde_yaml::from_slice(body)
        .map_err(|e| ApiStatus::bad_request(format!("error decoding YAML: {e}")))?;
    name_from_path(&mut applied, name)?;
    let schema = api.admission.schema(&r.kind).cloned();
    let now = managed_time();
    let api_version = r.api_version();
    // Applies record their own managedFields.
    let mode = WriteMode { manager: None, ..mode };
    match typed_get(api, r, ns, name).await {
        Err(e) if e.code == 404 => {
            let mut base =
                json!({"apiVersion": api_version, "kind": r.kind, "metadata": {"name": name}});
            if r.namespaced {
                base["metadata"]["namespace"] = json!(ns);
            }
            let created = crate::ssa::apply(
                &base,
                &applied,
                &manager,
                &api_version,
                schema.as_ref(),
                force,
                &now,
            )
            .map_err(|c| ApiStatus::apply_conflict(c.message(), c.causes()))?;
            let written = typed_create(api, r, ns, created, &mode).await?;
            Ok(written_response(StatusCode::CREATED, &written))
        }
        Err(e) => Err(e),
        Ok(_) => {
            let written = read_modify_write(api, r, ns, name, Part::Main, mode, |obj| {
                *obj = crate::ssa::apply(
                    obj,
                    &applied,
                    &manager,
                    &api_version,
                    schema.as_ref(),
                    force,
                    &now,
                )
                .map_err(|c| ApiStatus::apply_conflict(c.message(), c.causes()))?;
                Ok(())
            })
            .await?;
            Ok(written_response(StatusCode::OK, &written))
        }
    }
}

/// A delete's options (`DeleteOptions` in the body, or the same names in the query).
struct DeleteOptions {
    preconditions: Preconditions,
    /// What becomes of the dependents.
    propagation: Propagation,
    dry_run: bool,
}

/// `propagationPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Propagation {
    /// The object goes now; its dependents after it (the default for custom resources).
    Background,
    /// The dependents are deleted first; the object stays, deleting, until they are gone.
    Foreground,
    /// The dependents stay, without their owner reference.
    Orphan,
}

fn delete_options(raw: Option<&str>, body: &Bytes) -> Result<DeleteOptions, ApiStatus> {
    let options = if body.is_empty() { json!({}) } else { parse_body(body)? };
    let text = |key: &str| {
        options.pointer(&format!("/preconditions/{key}")).and_then(Value::as_str).map(str::to_owned)
    };
    let query = query(raw);
    let policy = options
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| query.get("propagationPolicy").cloned());
    let orphan_dependents = options
        .get("orphanDependents")
        .and_then(Value::as_bool)
        .or_else(|| query.get("orphanDependents").map(|v| v == "true"));
    let propagation = match (policy.as_deref(), orphan_dependents) {
        (Some("Orphan"), _) | (None, Some(true)) => Propagation::Orphan,
        (Some("Background") | None, _) => Propagation::Background,
        (Some("Foreground"), _) => Propagation::Foreground,
        (Some(other), _) => {
            return Err(ApiStatus::invalid(
                "DeleteOptions",
                "meta.k8s.io",
                "",
                &[(
                    "propagationPolicy",
                    format!(
                        "Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                )],
            ));
        }
    };
    let mut dry = dry_run(raw)?;
    if let Some(values) = options.get("dryRun").and_then(Value::as_array) {
        match values.iter().map(Value::as_str).collect::<Vec<_>>().as_slice() {
            [] => {}
            [Some("All")] => dry = true,
            other => {
                return Err(ApiStatus::bad_request(format!(
                    "dryRun: Unsupported value: {other:?}: supported values: \"All\""
                )));
            }
        }
    }
    Ok(DeleteOptions {
        preconditions: Preconditions {
            uid: text("uid"),
            resource_version: text("resourceVersion"),
        },
        propagation,
        dry_run: dry,
    })
}

/// Removes the owner reference to `uid` from every object of namespace `ns` that has one, so
/// that deleting the owner leaves them.
async fn orphan_dependents<S: Store>(
    api: &KubeApi<S>,
    ns: &str,
    uid: &str,
) -> Result<(), ApiStatus> {
    for r in api.resources.iter().filter(|r| r.namespaced) {
        let (items, _) = typed_list(api, r, Some(ns), &Selector::everything()).await?;
        for mut item in items {
            let Some(refs) =
                item.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut)
            else {
                continue;
            };
            let before = refs.len();
            refs.retain(|o| o.get("uid").and_then(Value::as_str) != Some(uid));
            if refs.len() != before {
                typed_update(api, r, ns, item, Part::Main, &WriteMode::INTERNAL, None).await?;
            }
        }
    }
    Ok(())
}

async fn delete_one<S: Store>(
    api: &Arc<KubeApi<S>>,
    r: &Resource,
    ns: &str,
    name: &str,
    options: &DeleteOptions,
) -> Result<Value, ApiStatus> {
    let store = &api.store;
    let none = || Err(OpError::Decode(String::new()));
    let pre = &options.preconditions;
    if r.is_namespace() {
        // A Namespace: the namespace controller empties it first.
        crate::namespaces::admit_delete(name)?;
        if !options.dry_run {
            return crate::namespaces::delete(api, name, pre).await;
        }
    }
    if options.dry_run {
        return dispatch!(r.kind.as_str(), delete_dry(store, ns, name, pre), none())
            .map_err(|e| op_error(e, r, name));
    }
    match options.propagation {
        Propagation::Background => {
            return dispatch!(r.kind.as_str(), delete(store, ns, name, pre), none())
                .map_err(|e| op_error(e, r, name));
        }
        Propagation::Foreground => {
            // As the API server's garbage collector deletes in the foreground: the
            // `foregroundDeletion` finalizer holds the object, deleting, until its dependents
            // are gone.
            dispatch!(r.kind.as_str(), delete_dry(store, ns, name, pre), none())
                .map_err(|e| op_error(e, r, name))?;
            read_modify_write(api, r, ns, name, Part::Main, WriteMode::INTERNAL, |obj| {
                add_finalizer(obj, FOREGROUND_FINALIZER);
                Ok(())
            })
            .await?;
            let deleting = dispatch!(r.kind.as_str(), delete(store, ns, name, pre), none())
                .map_err(|e| op_error(e, r, name))?;
            tokio::spawn(finish_foreground(Arc::clone(api), r.plural.clone(), deleting.clone()));
            return Ok(deleting);
        }
        Propagation::Orphan => {}
    }
    // As the API server's garbage collector orphans: the `orphan` finalizer holds the object
    // (deleting, so its controller stops making dependents) while the dependents lose their
    // reference to it; then the finalizer goes and the object with it.
    dispatch!(r.kind.as_str(), delete_dry(store, ns, name, pre), none())
        .map_err(|e| op_error(e, r, name))?;
    read_modify_write(api, r, ns, name, Part::Main, WriteMode::INTERNAL, |obj| {
        add_finalizer(obj, ORPHAN_FINALIZER);
        Ok(())
    })
    .await?;
    let deleting = dispatch!(r.kind.as_str(), delete(store, ns, name, pre), none())
        .map_err(|e| op_error(e, r, name))?;
    finish_orphaning(api, r, ns, &deleting).await
}

/// The finalizer that holds an object deleted with `propagationPolicy=Orphan` until its
/// dependents no longer name it.
const ORPHAN_FINALIZER: &str = "orphan";
/// The finalizer that holds an object deleted with `propagationPolicy=Foreground` until its
/// dependents are gone.
const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// How often a foreground deletion looks whether the dependents are gone.
const FOREGROUND_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The objects of `ns` that name `uid` as an owner: their resource and JSON.
async fn dependents<S: Store>(
    api: &KubeApi<S>,
    ns: &str,
    uid: &str,
) -> Result<Vec<(usize, Value)>, ApiStatus> {
    let mut found = Vec::new();
    for (i, r) in api.resources.iter().enumerate().filter(|(_, r)| r.namespaced) {
        let (items, _) = typed_list(api, r, Some(ns), &Selector::everything()).await?;
        found.extend(
            items
                .into_iter()
                .filter(|item| {
                    item.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(
                        |refs| {
                            refs.iter().any(|o| o.get("uid").and_then(Value::as_str) == Some(uid))
                        },
                    )
                })
                .map(|item| (i, item)),
        );
    }
    Ok(found)
}

/// Deletes the dependents of `deleting` (an object held by the `foregroundDeletion`
/// finalizer), waits until they are gone (theirs may have finalizers), then removes the
/// finalizer, and with it the object.
async fn finish_foreground<S: Store>(api: Arc<KubeApi<S>>, plural: String, deleting: Value) {
    let text = |p: &str| deleting.pointer(p).and_then(Value::as_str).unwrap_or_default().to_owned();
    let (name, uid) = (text("/metadata/name"), text("/metadata/uid"));
    let Ok(r) = resource(&api, &plural) else { return };
    let ns = r.filed_under(Some(&text("/metadata/namespace")), &name);
    loop {
        let found = match dependents(&api, &ns, &uid).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(%name, error = %e, "foreground deletion: cannot list the dependents");
                tokio::time::sleep(FOREGROUND_POLL * 10).await;
                continue;
            }
        };
        if found.is_empty() {
            break;
        }
        for (i, item) in
            found.iter().filter(|(_, item)| item.pointer("/metadata/deletionTimestamp").is_none())
        {
            let dependent = &api.resources[*i];
            let dep_name =
                item.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            let pre = Preconditions {
                uid: item.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_owned),
                resource_version: None,
            };
            let deleted: OpResult<Value> = dispatch!(
                dependent.kind.as_str(),
                delete(&api.store, &ns, dep_name, &pre),
                Err(OpError::Decode(String::new()))
            );
            if let Err(e) = deleted {
                tracing::debug!(dependent = %dep_name, error = ?e, "foreground deletion: a dependent was not deleted");
            }
        }
        tokio::time::sleep(FOREGROUND_POLL).await;
    }
    let removed = read_modify_write(&api, r, &ns, &name, Part::Main, WriteMode::INTERNAL, |obj| {
        if let Some(items) = obj.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
            items.retain(|f| f != FOREGROUND_FINALIZER);
        }
        Ok(())
    })
    .await;
    if let Err(e) = removed
        && e.code != 404
    {
        tracing::warn!(%name, error = %e, "foreground deletion: cannot remove the finalizer");
    }
}

fn add_finalizer(obj: &mut Value, finalizer: &str) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(items) = list.as_array_mut()
        && !items.iter().any(|f| f == finalizer)
    {
        items.push(json!(finalizer));
    }
}

/// Orphans the dependents of `deleting` (an object held by the `orphan` finalizer), then
/// removes the finalizer; answers the object's last state.
async fn finish_orphaning<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    deleting: &Value,
) -> Result<Value, ApiStatus> {
    let name = deleting.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if let Some(uid) = deleting.pointer("/metadata/uid").and_then(Value::as_str) {
        orphan_dependents(api, ns, uid).await?;
    }
    let written = read_modify_write(api, r, ns, name, Part::Main, WriteMode::INTERNAL, |obj| {
        if let Some(items) = obj.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
            items.retain(|f| f != ORPHAN_FINALIZER);
        }
        Ok(())
    })
    .await?;
    Ok(written.object)
}

/// Finishes the orphaning and foreground deletes a stopped server left half done (objects
/// deleting, still held by the `orphan` or `foregroundDeletion` finalizer).
pub(crate) async fn finish_pending_orphans<S: Store>(api: Arc<KubeApi<S>>) {
    for r in &api.resources {
        let Ok((items, _)) = typed_list(&api, r, None, &Selector::everything()).await else {
            continue;
        };
        for item in items {
            let held = |finalizer: &str| {
                item.pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| f.iter().any(|f| f == finalizer))
            };
            if item.pointer("/metadata/deletionTimestamp").is_none() {
                continue;
            }
            if held(FOREGROUND_FINALIZER) {
                tokio::spawn(finish_foreground(Arc::clone(&api), r.plural.clone(), item.clone()));
            }
            if !held(ORPHAN_FINALIZER) {
                continue;
            }
            let text = |p: &str| item.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let ns = r.filed_under(Some(text("/metadata/namespace")), text("/metadata/name"));
            if let Err(e) = finish_orphaning(&api, r, &ns, &item).await {
                tracing::warn!(kind = %r.kind, error = %e, "cannot finish an orphaning delete");
            }
        }
    }
}

async fn delete<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let options = delete_options(raw.as_deref(), &body)?;
    Ok(ok(&delete_one(&api, r, &ns, &name, &options).await?))
}

/// `deletecollection`: deletes every object of the namespace that the selectors match;
/// answers the list of what it deleted.
async fn delete_collection<S: Store>(
    State(api): Api<S>,
    Path((ns, plural)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let list_options = ListOptions::parse(&query(raw.as_deref()), &r.selectable_fields())?;
    let options = delete_options(raw.as_deref(), &body)?;
    let (items, rv) = matching(&api, r, Some(&ns), &list_options).await?;
    let mut deleted = Vec::with_capacity(items.len());
    for item in &items {
        let name = item.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        match delete_one(&api, r, &ns, name, &options).await {
            Ok(obj) => deleted.push(obj),
            // Deleted meanwhile: nothing left to do.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ok(&json!({
        "apiVersion": r.api_version(),
        "kind": r.list_kind,
        "metadata": {"resourceVersion": rv.to_string()},
        "items": deleted,
    })))
}

/// The object's `autoscaling/v1 Scale`.
fn scale_of(obj: &Value, scale: &Scale) -> Value {
    let at = |path: &str| {
        let pointer = format!("/{}", table::split_path(path).join("/"));
        obj.pointer(&pointer).cloned()
    };
    let mut status = json!({"replicas": at(&scale.status_replicas_path).unwrap_or(json!(0))});
    if let Some(selector) = scale.label_selector_path.as_deref().and_then(at) {
        crate::merge_patch(&mut status, &json!({"selector": selector}));
    }
    let metadata = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let keep = ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"];
    let metadata: serde_json::Map<String, Value> =
        keep.iter().filter_map(|k| Some(((*k).to_owned(), metadata.get(*k)?.clone()))).collect();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        "spec": {"replicas": at(&scale.spec_replicas_path).unwrap_or(json!(0))},
        "status": status,
    })
}

/// A subresource of a resource.
enum Sub<'a> {
    Status,
    Scale(&'a Scale),
}

fn subresource<'a>(r: &'a Resource, sub: &str) -> Result<Sub<'a>, ApiStatus> {
    match sub {
        "scale" => r.scale.as_ref().map(Sub::Scale).ok_or_else(ApiStatus::no_such_path),
        "status" if r.status => Ok(Sub::Status),
        _ => Err(ApiStatus::no_such_path()),
    }
}

async fn get_subresource<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name, sub)): Path<(String, String, String, String)>,
) -> Answer {
    let r = resource(&api, &plural)?;
    let sub = subresource(r, &sub)?;
    let obj = typed_get(&api, r, &ns, &name).await?;
    Ok(ok(&match sub {
        Sub::Scale(scale) => scale_of(&obj, scale),
        Sub::Status => obj,
    }))
}

/// Sets `obj`'s replicas (and resourceVersion, when it names one) from a changed `Scale`.
fn set_scale(obj: &mut Value, scale: &Scale, new_scale: &Value) -> Result<(), ApiStatus> {
    let replicas = new_scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .ok_or_else(|| ApiStatus::bad_request("spec.replicas of the Scale must be an integer"))?;
    if let Some(rv) = new_scale.pointer("/metadata/resourceVersion") {
        crate::merge_patch(obj, &json!({"metadata": {"resourceVersion": rv}}));
    }
    let mut patch = json!(replicas);
    for key in table::split_path(&scale.spec_replicas_path).iter().rev() {
        patch = json!({ key: patch });
    }
    crate::merge_patch(obj, &patch);
    Ok(())
}

async fn replace_subresource<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name, sub)): Path<(String, String, String, String)>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let mode = WriteMode::parse(raw.as_deref())?;
    let sub = subresource(r, &sub)?;
    let mut new = parse_body(&body)?;
    match sub {
        Sub::Scale(scale) => {
            let updated = read_modify_write(&api, r, &ns, &name, Part::Scale, mode, |obj| {
                set_scale(obj, scale, &new)
            })
            .await?;
            Ok(ok(&scale_of(&updated.object, scale)))
        }
        Sub::Status => {
            name_from_path(&mut new, &name)?;
            let written = typed_update(&api, r, &ns, new, Part::Status, &mode, None).await?;
            Ok(written_response(StatusCode::OK, &written))
        }
    }
}

async fn patch_subresource<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name, sub)): Path<(String, String, String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let mode = WriteMode::parse(raw.as_deref())?;
    let sub = subresource(r, &sub)?;
    refuse_force(raw.as_deref())?;
    match sub {
        Sub::Scale(scale) => {
            let updated = read_modify_write(&api, r, &ns, &name, Part::Scale, mode, |obj| {
                let mut new_scale = scale_of(obj, scale);
                apply_patch(r, &headers, &body, &mut new_scale)?;
                set_scale(obj, scale, &new_scale)
            })
            .await?;
            Ok(ok(&scale_of(&updated.object, scale)))
        }
        Sub::Status => {
            let patched = read_modify_write(&api, r, &ns, &name, Part::Status, mode, |obj| {
                apply_patch(r, &headers, &body, obj)
            })
            .await?;
            Ok(written_response(StatusCode::OK, &patched))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_probe_selector_matches_nothing() {
        let selector = never_matches();
        assert!(!selector.matches(None));
        let labels = BTreeMap::from([("oka.dev/never-set".to_owned(), String::new())]);
        assert!(!selector.matches(Some(&labels)));
    }

    #[test]
    fn tables_are_served_when_kubectl_asks_for_them() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
                .parse()
                .unwrap(),
        );
        assert!(wants_table(&headers));
        headers.insert(header::ACCEPT, "application/json".parse().unwrap());
        assert!(!wants_table(&headers));
    }

    #[test]
    fn a_scale_reads_the_crd_paths() {
        let scale = Scale {
            spec_replicas_path: ".spec.replicas".into(),
            status_replicas_path: ".status.replicas".into(),
            label_selector_path: Some(".status.selector".into()),
        };
        let obj = json!({
            "metadata": {"name": "base", "namespace": "default", "labels": {"a": "b"}, "resourceVersion": "9"},
            "spec": {"replicas": 2},
            "status": {"replicas": 1, "selector": "x=y"},
        });
        assert_eq!(
            scale_of(&obj, &scale),
            json!({
                "kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "base", "namespace": "default", "resourceVersion": "9"},
                "spec": {"replicas": 2},
                "status": {"replicas": 1, "selector": "x=y"},
            })
        );
    }
}
