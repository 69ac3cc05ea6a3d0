//! The Kubernetes API's patches: JSON merge patch, strategic merge patch and JSON patch, as
//! `PATCH` applies them to a stored object. The first byte picks the patch type; the rest is
//! the object and the patch, split at the first NUL byte. A merge patch applied twice must
//! change nothing the first did not.
#![no_main]

use serde_json::Value;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else { return };
    let (doc, patch) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b"{}"[..], rest),
    };
    let (Ok(mut doc), Ok(patch)) =
        (serde_json::from_slice::<Value>(doc), serde_json::from_slice::<Value>(patch))
    else {
        return;
    };
    match kind % 3 {
        0 => {
            oka_kubeapi::merge_patch(&mut doc, &patch);
            let once = doc.clone();
            oka_kubeapi::merge_patch(&mut doc, &patch);
            assert_eq!(doc, once, "a merge patch is not idempotent");
        }
        1 => oka_kubeapi::merge::strategic_merge_patch(&mut doc, &patch),
        _ => {
            let before = doc.clone();
            if oka_kubeapi::json_patch::apply(&mut doc, &patch).is_err() {
                // The API server applies a patch whole or not at all; the handler drops `doc`.
                let _ = before;
            }
        }
    }
    let _ = serde_json::to_vec(&doc);
});
