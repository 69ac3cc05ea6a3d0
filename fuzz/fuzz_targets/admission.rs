//! Admission of oka's kinds (pruning, structural schema, defaults, CEL rules, the webhooks'
//! checks) on any object. The first byte picks the kind, the operation and the field
//! validation; the rest is the object and, for an update, the old object after a NUL byte.
#![no_main]

use std::sync::OnceLock;

use oka_admission::{Admission, FieldValidation, Operation};
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
    let (obj, old) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let Ok(mut obj) = serde_json::from_slice::<Value>(obj) else { return };
    let old = match old.map(serde_json::from_slice::<Value>) {
        None => None,
        Some(Ok(old)) => Some(old),
        Some(Err(_)) => return,
    };
    let (admission, kinds) = admission();
    let kind = &kinds[usize::from(options) % kinds.len()];
    let operation = if old.is_some() { Operation::Update } else { Operation::Create };
    let validation = match (options >> 4) % 3 {
        0 => FieldValidation::Ignore,
        1 => FieldValidation::Warn,
        _ => FieldValidation::Strict,
    };
    if options & 0x80 != 0 {
        let _ = admission.admit_subresource(kind, &mut obj, old.as_ref(), validation);
    } else {
        let _ = admission.admit(kind, operation, &mut obj, old.as_ref(), validation);
    }
});
