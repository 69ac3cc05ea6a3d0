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
use oka_store::{Preconditions, Selector, Store, StoreError};
use serde_json::{Value, json};

use crate::listing::{self, Continue, ListOptions};
use crate::resources::{self, Resource, Scale};
use crate::status::ApiStatus;
use crate::table::{self, IncludeObject};
use crate::typed::{OpError, dispatch};
use crate::{KubeApi, json_response, watch};

type Api<S> = State<Arc<KubeApi<S>>>;
type Answer = Result<Response, ApiStatus>;

const GROUP_PATH: &str = "/apis/agents.kruise.io/v1alpha1";

/// Every route, behind the bearer token check.
pub(crate) fn routes<S: Store>(api: Arc<KubeApi<S>>) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/api", get(core_versions::<S>))
        .route("/api/v1", get(|| async { ok(&resources::core_resource_list()) }))
        .route("/api/v1/namespaces", get(list_namespaces::<S>))
        .route("/api/v1/namespaces/{name}", get(get_namespace::<S>))
        .route("/apis", get(|| async { ok(&resources::group_list()) }))
        .route("/openapi/v2", get(openapi_v2))
        .route(GROUP_PATH, get(group_resources::<S>))
        .route(&format!("{GROUP_PATH}/{{plural}}"), get(list_all::<S>))
        .route(
            &format!("{GROUP_PATH}/namespaces/{{ns}}/{{plural}}"),
            get(list_namespaced::<S>).post(create::<S>),
        )
        .route(
            &format!("{GROUP_PATH}/namespaces/{{ns}}/{{plural}}/{{name}}"),
            get(get_object::<S>).put(replace::<S>).patch(patch::<S>).delete(delete::<S>),
        )
        .route(
            &format!("{GROUP_PATH}/namespaces/{{ns}}/{{plural}}/{{name}}/{{sub}}"),
            get(get_subresource::<S>).put(replace_subresource::<S>).patch(patch_subresource::<S>),
        )
        .fallback(|| async { ApiStatus::no_such_path() })
        .layer(middleware::from_fn_with_state(Arc::clone(&api), authenticate::<S>))
        .with_state(api)
}

fn ok(value: &Value) -> Response {
    json_response(StatusCode::OK, value)
}

/// Lets through requests that carry `Authorization: Bearer <admin token>`; 401 otherwise.
async fn authenticate<S: Store>(State(api): Api<S>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(token) if constant_time_eq(token.as_bytes(), api.config.admin_token.as_bytes()) => {
            next.run(request).await
        }
        _ => ApiStatus::unauthorized().into_response(),
    }
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

async fn core_versions<S: Store>(State(api): Api<S>) -> Response {
    ok(&resources::core_versions(&api.config.server_address))
}

async fn group_resources<S: Store>(State(api): Api<S>) -> Response {
    ok(&resources::group_resource_list(&api.resources))
}

/// `default` and every namespace an object lives in.
async fn namespaces<S: Store>(api: &KubeApi<S>) -> Result<BTreeSet<String>, ApiStatus> {
    let mut names = BTreeSet::from(["default".to_owned()]);
    for r in &api.resources {
        let (items, _) = typed_list(api, r, None, &Selector::everything()).await?;
        names.extend(
            items
                .iter()
                .filter_map(|o| o.pointer("/metadata/namespace")?.as_str())
                .map(str::to_owned),
        );
    }
    Ok(names)
}

fn namespace_object(name: &str) -> Value {
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": name},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

async fn list_namespaces<S: Store>(State(api): Api<S>) -> Answer {
    let items: Vec<Value> = namespaces(&api).await?.iter().map(|n| namespace_object(n)).collect();
    Ok(ok(&json!({"kind": "NamespaceList", "apiVersion": "v1", "metadata": {}, "items": items})))
}

async fn get_namespace<S: Store>(State(api): Api<S>, Path(name): Path<String>) -> Answer {
    if namespaces(&api).await?.contains(&name) {
        return Ok(ok(&namespace_object(&name)));
    }
    let e = StoreError::NotFound {
        kind: "Namespace".into(),
        namespace: String::new(),
        name: name.clone(),
    };
    Err(ApiStatus::from_store(&e, "namespaces", "Namespace", &name))
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

async fn typed_list<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: Option<&str>,
    selector: &Selector,
) -> Result<(Vec<Value>, String), ApiStatus> {
    dispatch!(r.kind.as_str(), list(&api.store, ns, selector), Ok((Vec::new(), String::new())))
        .map_err(|e| op_error(e, r, ""))
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

async fn typed_update<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    ns: &str,
    body: Value,
) -> Result<Value, ApiStatus> {
    let name =
        body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    dispatch!(r.kind.as_str(), update(&api.store, ns, body), Err(OpError::Decode(String::new())))
        .map_err(|e| op_error(e, r, &name))
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
    let options = ListOptions::parse(&query)?;
    let include = IncludeObject::parse(query.get("includeObject").map(String::as_str));
    let table = wants_table(headers).then_some(include);
    if options.watch {
        let format = watch::Format { table, columns: r.columns.clone(), kind: r.kind.clone() };
        return watch::serve(api, r, ns, &options, format).await;
    }
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
                    let (items, rv) = matching(api, r, ns, &options).await?;
                    listing::current_page(&items, rv, &token, options.limit)
                }
            }
        }
        None => {
            let (items, rv) = matching(api, r, ns, &options).await?;
            options.check_version(rv)?;
            api.snapshots.first_page(&scope, rv, items, options.limit)
        }
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
        "apiVersion": oka_api::API_VERSION,
        "kind": r.list_kind,
        "metadata": metadata,
        "items": page.items,
    })))
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
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let body = parse_body(&body)?;
    let name =
        body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let created = dispatch!(
        r.kind.as_str(),
        create(&api.store, &ns, body),
        Err(OpError::Decode(String::new()))
    )
    .map_err(|e| op_error(e, r, &name))?;
    Ok(json_response(StatusCode::CREATED, &created))
}

async fn replace<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name)): Path<(String, String, String)>,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let mut body = parse_body(&body)?;
    name_from_path(&mut body, &name)?;
    Ok(ok(&typed_update(&api, r, &ns, body).await?))
}

/// The patch's body, when its type is one this server applies: JSON merge patch, what kubectl
/// sends for custom resources (`apply`, `scale`, `patch --type merge`). A strategic merge patch
/// is refused, as the API server refuses it for custom resources.
fn merge_patch_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiStatus> {
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim();
    match media {
        "application/merge-patch+json" => parse_body(body),
        _ => Err(ApiStatus::unsupported_patch_type()),
    }
}

async fn patch<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let patch = merge_patch_body(&headers, &body)?;
    let mut obj = typed_get(&api, r, &ns, &name).await?;
    crate::merge_patch(&mut obj, &patch);
    name_from_path(&mut obj, &name)?;
    Ok(ok(&typed_update(&api, r, &ns, obj).await?))
}

async fn delete<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name)): Path<(String, String, String)>,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let options = if body.is_empty() { json!({}) } else { parse_body(&body)? };
    let text = |key: &str| {
        options.pointer(&format!("/preconditions/{key}")).and_then(Value::as_str).map(str::to_owned)
    };
    let preconditions =
        Preconditions { uid: text("uid"), resource_version: text("resourceVersion") };
    let deleted = dispatch!(
        r.kind.as_str(),
        delete(&api.store, &ns, &name, &preconditions),
        Err(OpError::Decode(String::new()))
    )
    .map_err(|e| op_error(e, r, &name))?;
    Ok(ok(&deleted))
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

/// The resource's subresource `sub`: its status (read only here) or its scale.
fn subresource<'a>(r: &'a Resource, sub: &str) -> Result<Option<&'a Scale>, ApiStatus> {
    match sub {
        "scale" => r.scale.as_ref().map(Some).ok_or_else(ApiStatus::no_such_path),
        "status" if r.status => Ok(None),
        _ => Err(ApiStatus::no_such_path()),
    }
}

async fn get_subresource<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name, sub)): Path<(String, String, String, String)>,
) -> Answer {
    let r = resource(&api, &plural)?;
    let scale = subresource(r, &sub)?;
    let obj = typed_get(&api, r, &ns, &name).await?;
    Ok(ok(&match scale {
        Some(scale) => scale_of(&obj, scale),
        None => obj,
    }))
}

/// Sets the object's replicas from a changed `Scale` and stores it; answers the new `Scale`.
async fn write_scale<S: Store>(
    api: &KubeApi<S>,
    r: &Resource,
    scale: &Scale,
    ns: &str,
    mut obj: Value,
    new_scale: &Value,
) -> Answer {
    let replicas = new_scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .ok_or_else(|| ApiStatus::bad_request("spec.replicas of the Scale must be an integer"))?;
    if let Some(rv) = new_scale.pointer("/metadata/resourceVersion") {
        crate::merge_patch(&mut obj, &json!({"metadata": {"resourceVersion": rv}}));
    }
    let mut patch = json!(replicas);
    for key in table::split_path(&scale.spec_replicas_path).iter().rev() {
        patch = json!({ key: patch });
    }
    crate::merge_patch(&mut obj, &patch);
    let updated = typed_update(api, r, ns, obj).await?;
    Ok(ok(&scale_of(&updated, scale)))
}

async fn replace_subresource<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name, sub)): Path<(String, String, String, String)>,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let Some(scale) = subresource(r, &sub)? else {
        return Err(ApiStatus::method_not_allowed("status is written by oka's controllers"));
    };
    let new_scale = parse_body(&body)?;
    let obj = typed_get(&api, r, &ns, &name).await?;
    write_scale(&api, r, scale, &ns, obj, &new_scale).await
}

async fn patch_subresource<S: Store>(
    State(api): Api<S>,
    Path((ns, plural, name, sub)): Path<(String, String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let r = resource(&api, &plural)?;
    let Some(scale) = subresource(r, &sub)? else {
        return Err(ApiStatus::method_not_allowed("status is written by oka's controllers"));
    };
    let patch = merge_patch_body(&headers, &body)?;
    let obj = typed_get(&api, r, &ns, &name).await?;
    let mut new_scale = scale_of(&obj, scale);
    crate::merge_patch(&mut new_scale, &patch);
    write_scale(&api, r, scale, &ns, obj, &new_scale).await
}

#[cfg(test)]
mod tests {
    use super::*;

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
