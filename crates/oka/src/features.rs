//! The optional features at `oka serve`'s start: probed once (the runtime's prober), told in
//! one log line each, exported as `oka_feature_available{feature}`, and enforced on the E2B
//! API, so a request that needs a feature that is off is answered at once with an error naming
//! it and how to turn it on.
//!
//! The rule of which request needs which feature lives in the pure model
//! ([`oka_runtime_api::features`]); [`requirement`] maps the API's routes onto it. A hibernating
//! pause is refused by the runtime with the same [`FeatureOff`] message, which the Sandbox's
//! `SandboxPaused` condition carries and the pause answers at once.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use oka_runtime_api::features::{Availability, Feature, FeatureOff, Features, Probes};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tracing::{info, warn};

/// `feature`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeatureLabels {
    feature: &'static str,
}

/// Decides the features from `probes`, logs one line per feature and registers
/// `oka_feature_available{feature}` (1 on, 0 off).
pub fn announce(probes: &Probes, registry: &mut oka_metrics::Registry) -> Arc<Features> {
    let features = oka_runtime_api::features::plan(probes);
    for (feature, line) in Feature::ALL.into_iter().zip(features.summary()) {
        match features.get(feature) {
            Availability::Available(_) => info!(feature = feature.name(), "{line}"),
            Availability::Off { .. } => warn!(feature = feature.name(), "{line}"),
        }
    }
    let gauge = Family::<FeatureLabels, Gauge>::default();
    for feature in Feature::ALL {
        let on = i64::from(features.is_available(feature));
        gauge.get_or_create(&FeatureLabels { feature: feature.name() }).set(on);
    }
    registry.register(
        "oka_feature_available",
        "1 when an optional feature of this machine is on (hibernate: CRIU; outbound-network: ip and nft; code-interpreter: oka-interpreter and a Jupyter kernel), 0 when off (the start-up log says why and how to turn it on)",
        gauge,
    );
    Arc::new(features)
}

/// The feature an E2B API request needs, from its method and path: a snapshot or a fork of a
/// sandbox (CRIU) needs [`Feature::Hibernate`]. The Kruise-prefixed paths are the same.
pub fn requirement(method: &axum::http::Method, path: &str) -> Option<Feature> {
    if method != axum::http::Method::POST {
        return None;
    }
    let path = path.strip_prefix(oka_manager::api::KRUISE_PREFIX).unwrap_or(path);
    let rest = path.strip_prefix("/sandboxes/")?;
    let (id, verb) = rest.split_once('/')?;
    (!id.is_empty() && matches!(verb, "snapshots" | "fork")).then_some(Feature::Hibernate)
}

/// Middleware over the E2B API: a request that needs a feature that is off is answered 501
/// (the API's answer for an operation this deployment does not offer) with [`FeatureOff`]'s
/// message. Feature availability is no secret (it is on `/metrics`), so this answers before
/// the API key is checked.
pub async fn guard(
    State(features): State<Arc<Features>>,
    request: Request,
    next: Next,
) -> Response {
    let needed = requirement(request.method(), request.uri().path());
    match needed.map(|feature| features.require(feature)) {
        Some(Err(off)) => refuse(&off),
        _ => next.run(request).await,
    }
}

fn refuse(off: &FeatureOff) -> Response {
    oka_manager::api::ApiError::NotImplemented(off.to_string()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_and_forks_need_hibernation() {
        let post = axum::http::Method::POST;
        assert_eq!(requirement(&post, "/sandboxes/abc/snapshots"), Some(Feature::Hibernate));
        assert_eq!(requirement(&post, "/sandboxes/abc/fork"), Some(Feature::Hibernate));
        assert_eq!(
            requirement(&post, "/kruise/api/sandboxes/abc/snapshots"),
            Some(Feature::Hibernate)
        );
        assert_eq!(requirement(&post, "/sandboxes/abc/pause"), None);
        assert_eq!(requirement(&post, "/sandboxes"), None);
        assert_eq!(requirement(&axum::http::Method::GET, "/snapshots"), None);
        assert_eq!(requirement(&axum::http::Method::GET, "/sandboxes/abc/snapshots"), None);
    }
}
