//! The Kubernetes API's protobuf request bodies (`application/vnd.kubernetes.protobuf`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(value) = oka_kubeapi::protobuf::decode(data) {
        assert!(value.is_object(), "a body decodes to an object, not {value}");
    }
});
