//! The Kubernetes API's server-side apply: the live object and the applied configuration
//! (YAML, as `kubectl apply --server-side` sends it), split at the first NUL byte; the first
//! byte picks `force` and the schema (none, or one of oka's kinds). Applying the result's own
//! configuration again, as the same manager, must succeed and change nothing.
#![no_main]

use std::sync::OnceLock;

use oka_admission::Admission;
use serde_json::Value;

fn admission() -> &'static (Admission, Vec<String>) {
    static ADMISSION: OnceLock<(Admission, Vec<String>)> = OnceLock::new();
    ADMISSION.get_or_init(|| {
        let kinds = oka_api::crds().into_iter().map(|crd| crd.spec.names.kind).collect();
        (Admission::new(), kinds)
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&options, rest)) = data.split_first() else { return };
    let (live, applied) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b"{}"[..], rest),
    };
    let Ok(live) = serde_json::from_slice::<Value>(live) else { return };
    let Ok(applied) = serde_yaml::from_slice::<Value>(applied) else { return };
    let (admission, kinds) = admission();
    let force = options & 1 != 0;
    let schema = kinds
        .get(usize::from(options >> 1) % (kinds.len() + 1))
        .and_then(|kind| admission.schema(kind));
    const NOW: &str = "2026-01-01T00:00:00Z";
    let api_version = "agents.kruise.io/v1alpha1";
    let apply = |live: &Value| {
        oka_kubeapi::ssa::apply(live, &applied, "fuzz", api_version, schema, force, NOW)
    };
    if let Ok(result) = apply(&live) {
        match apply(&result) {
            Ok(again) => assert_eq!(again, result, "applying the same configuration again"),
            Err(conflicts) => panic!("the same manager's apply conflicts: {}", conflicts.message()),
        }
    }
});
