//! Helpers shared by the tests and benchmarks that start a real `oka serve`: a free loopback
//! port, and the removal of the sandboxes a run leaves behind.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::Path;

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Sandboxes outlive `oka serve` by design: deletes what one left in `state` with a runtime of
/// our own on the same state directory (and the cgroup name `oka serve` derives from it), then
/// that runtime's own cgroups.
/// `init` is the init binary to name in the runtime's config (the `oka` binary).
pub fn remove_sandboxes(state: &Path, init: &str) {
    use oka_runtime::Runtime as _;
    use oka_runtime::local::{LocalConfig, LocalRuntime};
    let Ok(canonical) = std::fs::canonicalize(state) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut config = LocalConfig::new(state.join("runtime"), init);
        config.cgroup_name = format!(
            "oka-{:08x}",
            oka_controller::revision::fnv1_32(canonical.as_os_str().as_encoded_bytes())
        );
        let Ok(runtime) = LocalRuntime::open(config).await else { return };
        for sandbox in runtime.list().await.unwrap_or_default() {
            let _ = runtime.delete(&sandbox.id).await;
        }
        runtime.remove_cgroups();
    });
}
