//! Tags: `POST /templates/tags`, `DELETE /templates/tags`, `GET /templates/{id}/tags`, and a
//! create's `templateID` of the form `name:tag`. A tag names one build of a template; the
//! template's pool serves its latest successful build.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use jiff::Timestamp;
use oka_store::Store;
use serde::Deserialize;

use super::records::{BuildStatus, TagRecord};
use super::{Builds, bad_request, builds, namespace_of, plan};
use crate::api::sandboxes::parse_json;
use crate::api::{ApiError, AppState, User};

type AppStateRef<S> = State<Arc<AppState<S>>>;

/// A create's `templateID` of the form `name:tag` (the SDKs' `Sandbox.create("name:tag")`):
/// `name` when the tag names the build its pool serves (the template's latest successful
/// build); 400 naming both builds when it names an older one, since a pool serves one build;
/// 400 when the tag is unknown. `None` for any other `templateID`.
pub(crate) fn resolve_tagged<S>(
    state: &AppState<S>,
    user: &User,
    template_id: &str,
) -> Result<Option<String>, ApiError> {
    let Some((name, tag)) = template_id.split_once(':') else { return Ok(None) };
    let Some(builds) = state.template_builds.as_ref() else { return Ok(None) };
    let namespace = namespace_of(user);
    if plan::check_name(name).is_err() || !builds.knows(&namespace, name) {
        return Ok(None);
    }
    let tagged = builds.with_tags(&namespace, name, |tags| Ok(tags.get(tag).cloned()))?;
    let Some(tagged) = tagged else {
        return Err(ApiError::BadRequest(format!("tag {tag:?} of template {name} not found")));
    };
    match latest_ready(builds, &namespace, name) {
        Some(serving) if serving == tagged.build_id => Ok(Some(name.to_owned())),
        serving => Err(ApiError::BadRequest(format!(
            "tag {tag:?} of template {name} names build {}, but its pool serves {}: oka serves a \
             template's latest build only (build it again, or create from {name:?})",
            tagged.build_id,
            serving.map_or_else(|| "no build".to_owned(), |b| format!("build {b}"))
        ))),
    }
}

/// `POST /templates/tags` (`AssignTemplateTagsRequest`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignTags {
    target: String,
    tags: Vec<String>,
}

/// `DELETE /templates/tags` (`DeleteTemplateTagsRequest`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveTags {
    name: String,
    tags: Vec<String>,
}

fn check_tags(tags: &[String]) -> Result<(), ApiError> {
    if tags.is_empty() {
        return Err(ApiError::BadRequest("tags: at least one tag is required".into()));
    }
    tags.iter().try_for_each(|t| plan::check_tag(t)).map_err(bad_request)
}

/// The latest successful build of a template.
pub(super) fn latest_ready(builds: &Builds, namespace: &str, template: &str) -> Option<String> {
    builds
        .lock()
        .records
        .values()
        .filter(|r| r.namespace == namespace && r.template_id == template)
        .filter(|r| r.status == BuildStatus::Ready)
        .max_by_key(|r| r.finished_at)
        .map(|r| r.build_id.clone())
}

pub(super) async fn assign_tags<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let builds = builds(&state)?;
    let request: AssignTags = parse_json(&body)?;
    let (name, tag) = plan::split_name(&request.target).map_err(bad_request)?;
    check_tags(&request.tags)?;
    let namespace = namespace_of(&user);
    if !builds.knows(&namespace, name) {
        return Err(ApiError::NotFound(format!("Template not found: {name}")));
    }
    let latest = latest_ready(builds, &namespace, name);
    let build_id = builds.with_tags(&namespace, name, |tags| {
        let source = match tag {
            Some(tag) => tags.get(tag).map(|t| t.build_id.clone()).ok_or_else(|| {
                ApiError::NotFound(format!("tag {tag:?} of template {name} not found"))
            })?,
            None => tags.get(plan::DEFAULT_TAG).map(|t| t.build_id.clone()).or(latest).ok_or_else(
                || ApiError::NotFound(format!("template {name} has no successful build to tag")),
            )?,
        };
        let now = Timestamp::now();
        for new in &request.tags {
            tags.insert(new.clone(), TagRecord { build_id: source.clone(), created_at: now });
        }
        Ok(source)
    })?;
    let body = serde_json::json!({ "tags": request.tags, "buildID": build_id });
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

pub(super) async fn remove_tags<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let builds = builds(&state)?;
    let request: RemoveTags = parse_json(&body)?;
    plan::check_name(&request.name).map_err(bad_request)?;
    check_tags(&request.tags)?;
    let namespace = namespace_of(&user);
    if !builds.knows(&namespace, &request.name) {
        return Err(ApiError::NotFound(format!("Template not found: {}", request.name)));
    }
    builds.with_tags(&namespace, &request.name, |tags| {
        if let Some(missing) = request.tags.iter().find(|t| !tags.contains_key(*t)) {
            return Err(ApiError::NotFound(format!(
                "tag {missing:?} of template {} not found",
                request.name
            )));
        }
        for tag in &request.tags {
            tags.remove(tag);
        }
        Ok(())
    })?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(super) async fn list_tags<S: Store>(
    State(state): AppStateRef<S>,
    Extension(user): Extension<User>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let builds = builds(&state)?;
    plan::check_name(&id).map_err(bad_request)?;
    let namespace = namespace_of(&user);
    if !builds.knows(&namespace, &id) {
        return Err(ApiError::NotFound(format!("Template not found: {id}")));
    }
    let listed = builds.with_tags(&namespace, &id, |tags| {
        Ok(tags
            .iter()
            .map(|(tag, t)| {
                serde_json::json!({
                    "tag": tag, "buildID": t.build_id, "createdAt": t.created_at.to_string(),
                })
            })
            .collect::<Vec<_>>())
    })?;
    Ok(axum::Json(listed).into_response())
}
