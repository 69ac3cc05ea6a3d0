//! Label selectors (oka-store's parser, as `labelSelector` and the controllers use it) and
//! field selectors (the Kubernetes API's `fieldSelector`). A label selector that parses must
//! print as text that parses to the same selector, and match as it did.
#![no_main]

use std::collections::BTreeMap;

use oka_kubeapi::listing::FieldSelector;
use oka_store::Selector;
use serde_json::json;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let labels: BTreeMap<String, String> =
        [("app", "web"), ("tier", ""), ("agents.kruise.io/pool", "a-1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    if let Ok(selector) = text.parse::<Selector>() {
        let printed = selector.to_string();
        match printed.parse::<Selector>() {
            Ok(again) => {
                assert_eq!(again, selector, "{text:?} printed as {printed:?}");
                assert_eq!(again.matches(Some(&labels)), selector.matches(Some(&labels)));
            }
            Err(e) => panic!("{text:?} printed as {printed:?}, which does not parse: {e}"),
        }
    }
    let fields = [
        ("metadata.name".to_owned(), "/metadata/name".to_owned()),
        ("metadata.namespace".to_owned(), "/metadata/namespace".to_owned()),
        ("status.phase".to_owned(), "/status/phase".to_owned()),
    ];
    if let Ok(selector) = FieldSelector::parse(text, &fields) {
        let obj =
            json!({"metadata": {"name": "a", "namespace": "default"}, "status": {"phase": 1}});
        let _ = selector.matches(&obj);
        if selector.only_metadata() {
            assert_eq!(selector.matches_name("default", "a"), selector.matches(&obj));
        }
    }
});
