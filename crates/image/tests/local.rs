//! Locally built images: a layer directory imported under an `oka.local/…` reference is found
//! offline by `get` and `pull`, stacks on a directory outside the store and on other images'
//! layers, keeps its whiteouts, and survives GC until it is removed; GC never touches the
//! directories outside the store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::Duration;

use oka_image::{GcPolicy, ImageConfig, ImageStore, ImageStoreConfig, PullError, local_reference};

fn aggressive() -> GcPolicy {
    GcPolicy { min_age: Duration::ZERO, max_bytes: 0, max_unused_age: Some(Duration::ZERO) }
}

fn config(user: &str) -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/usr/bin:/bin".into(), "GREETING=hi".into()],
        working_dir: Some("/app".into()),
        user: Some(user.into()),
        cmd: vec!["/bin/bash".into()],
        ..ImageConfig::default()
    }
}

fn write(path: &Path, content: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test]
async fn a_built_layer_on_a_template_root_is_an_offline_image_that_gc_keeps() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("base-root");
    write(&base.join("etc/os-release"), "ID=debian\n", 0o644);
    write(&base.join("old/gone"), "x", 0o644);
    let store_dir = root.path().join("images");
    let store = ImageStore::open(&store_dir, ImageStoreConfig::default()).unwrap();

    let layer = store.staging_dir("build").unwrap();
    write(&layer.join("app/run.sh"), "#!/bin/sh\necho hi\n", 0o750);
    let root_user = rustix::process::geteuid().is_root();
    if root_user {
        // A whiteout, as overlay writes it into an upper directory.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            layer.join("old"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            0,
        )
        .unwrap();
    }
    let reference = local_reference("default", "my-tpl", "b-1");
    let image = store
        .import_local(&reference, std::slice::from_ref(&base), Some(&layer), config("user"))
        .unwrap();
    assert!(!layer.exists(), "the layer was moved into the store");
    assert_eq!(image.layers.len(), 2);
    assert_eq!(image.layers[0], base, "the template root is the bottom of the stack");
    assert!(image.layers[1].starts_with(store_dir.join("layers")));
    let run = image.layers[1].join("app/run.sh");
    assert_eq!(std::fs::metadata(&run).unwrap().mode() & 0o7777, 0o750);
    if root_user {
        let old = std::fs::symlink_metadata(image.layers[1].join("old")).unwrap();
        assert_eq!(old.rdev(), 0, "the whiteout is kept as it was");
    }
    assert_eq!(image.config, config("user"));

    // Offline: a fresh store on the same directory finds it; `pull` answers from the store.
    let reopened = ImageStore::open(&store_dir, ImageStoreConfig::default()).unwrap();
    assert_eq!(reopened.get(&reference).unwrap(), image);
    let pulled = reopened.pull(&reference, &[], &|_| {}).await.unwrap();
    assert_eq!(pulled.digest, image.digest);
    let missing = local_reference("default", "my-tpl", "never-built");
    match reopened.pull(&missing, &[], &|_| {}).await {
        Err(PullError::NotFound { registry, .. }) => assert_eq!(registry, "oka.local"),
        other => panic!("expected NotFound, got {other:?}"),
    }

    // A second build on top of the first one's image shares its layers.
    let layer2 = reopened.staging_dir("build").unwrap();
    write(&layer2.join("app/more"), "more", 0o644);
    let second_ref = local_reference("default", "my-tpl", "b-2");
    let second =
        reopened.import_local(&second_ref, &image.layers, Some(&layer2), config("root")).unwrap();
    assert_eq!(second.layers[..2], image.layers[..]);
    assert_eq!(second.layers.len(), 3);

    // GC with the most aggressive policy and nothing in use keeps both built images.
    let report = reopened.gc(&BTreeSet::new(), &aggressive()).unwrap();
    assert!(report.removed_images.is_empty(), "{report:?}");
    assert!(reopened.get(&reference).is_some() && reopened.get(&second_ref).is_some());

    // Once the first is removed, its layers stay while the second uses them.
    reopened.remove_local(&reference).unwrap();
    assert!(reopened.get(&reference).is_none());
    reopened.gc(&BTreeSet::new(), &aggressive()).unwrap();
    assert!(reopened.get(&second_ref).is_some(), "the second build's layers are all kept");
    // Once both are gone GC removes their layers, never the template root.
    reopened.remove_local(&second_ref).unwrap();
    let report = reopened.gc(&BTreeSet::new(), &aggressive()).unwrap();
    assert_eq!(report.removed_layers.len(), 2, "{report:?}");
    assert!(std::fs::read_dir(store_dir.join("layers")).unwrap().next().is_none());
    assert_eq!(std::fs::read_to_string(base.join("etc/os-release")).unwrap(), "ID=debian\n");
}

#[test]
fn the_same_content_is_one_layer_and_bad_stacks_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("base-root");
    std::fs::create_dir_all(&base).unwrap();
    let store = ImageStore::open(&root.path().join("images"), ImageStoreConfig::default()).unwrap();
    let build = |tag: &str| {
        let layer = store.staging_dir("build").unwrap();
        write(&layer.join("f"), "same", 0o644);
        store
            .import_local(
                &local_reference("ns", "t", tag),
                std::slice::from_ref(&base),
                Some(&layer),
                ImageConfig::default(),
            )
            .unwrap()
    };
    let (a, b) = (build("one"), build("two"));
    assert_eq!(a.layers, b.layers);
    assert_eq!(a.digest, b.digest, "the same base, content and config is the same image");
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0,
        "nothing staged is left"
    );

    // Not a local reference.
    let err = store.import_local("python:3", &[], None, ImageConfig::default()).unwrap_err();
    assert!(err.to_string().contains("oka.local/"), "{err}");
    // A directory outside the store above a store layer.
    let err = store
        .import_local(
            &local_reference("ns", "t", "bad"),
            &[a.layers[1].clone(), base.clone()],
            None,
            ImageConfig::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("bottom"), "{err}");
    // A relative or missing directory.
    let err = store
        .import_local(
            &local_reference("ns", "t", "bad"),
            &[root.path().join("missing")],
            None,
            ImageConfig::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("absolute directory"), "{err}");
}
