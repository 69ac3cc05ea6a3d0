//! `oka-image`: sandboxes from any OCI image. Image references with Docker's naming rules
//! (`reference`), a distribution API v2 client with anonymous, Basic and Bearer
//! authentication (`client`, `auth`), a content-addressed store of verified content and
//! unpacked layers that overlayfs stacks as lower directories (`store`, `unpack`), pulls that
//! run once however many callers ask, and garbage collection by a policy (`gc`).
//!
//! The caller (the runtime's image step) pulls a reference, gets a `PulledImage` (its layers
//! bottom first and its run config), and mounts the layers; `get` answers from the store
//! without network. Images built on this machine are recorded with `import_local` under
//! `oka.local/…` references (`local`) and answered the same way. Unpacking keeps ownership and writes overlay whiteouts (character devices)
//! and `trusted.` xattrs, so it needs root; unprivileged, layers without whiteouts still
//! unpack, owned by the caller.

mod auth;
mod client;
mod error;
mod gc;
mod local;
pub mod manifest;
pub mod reference;
mod store;
mod unpack;

pub use auth::{Challenge, RegistryAuth, normalize_registry, parse_challenge};
pub use error::{ImageError, PullError};
pub use gc::{GcPlan, GcPolicy, GcReport, plan_gc};
pub use local::{LOCAL_REGISTRY, layer_digest, local_reference};
pub use reference::{Reference, ReferenceError};
pub use store::{ImageConfig, ImageStore, ImageStoreConfig, PullProgress, PulledImage};
pub use unpack::{UnpackError, Unpacked, unpack_layer, unpack_tar};

#[cfg(test)]
mod tests {
    /// The runtime spawns pulls: the store is shared across tasks and a pull is `Send`.
    #[test]
    fn a_pull_can_be_spawned() {
        fn assert_send<T: Send>(_: &T) {}
        fn assert_shared<T: Send + Sync + Clone + 'static>() {}
        assert_shared::<crate::ImageStore>();
        let dir = tempfile::tempdir().unwrap();
        let store =
            crate::ImageStore::open(dir.path(), crate::ImageStoreConfig::default()).unwrap();
        let pull = store.pull("python", &[], &|_| {});
        assert_send(&pull);
    }
}
