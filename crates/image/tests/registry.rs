//! oka-image against a real registry: Debian's `docker-registry` (distribution 2.8) on
//! loopback, with images built and pushed by the test. Pulls are checked as the runtime uses
//! them: layers stacked by an actual overlay mount.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oka_image::{GcPolicy, ImageStore, ImageStoreConfig, PullError, PullProgress, RegistryAuth};
use support::{Entry, Registry, TestImage, TestLayer, host_arch, index_of};

fn file(path: &str, content: &str) -> Entry {
    Entry::File(path.to_string(), content.as_bytes().to_vec(), 0o644, 0)
}

fn no_progress(_: PullProgress) {}

fn open_store(dir: &Path) -> ImageStore {
    ImageStore::open(dir, ImageStoreConfig::default()).unwrap()
}

/// A base layer, a layer deleting and making opaque, a top layer overriding a file.
fn three_layer_image() -> TestImage {
    let base = TestLayer::build(&[
        Entry::Dir("etc", 0o755),
        file("etc/removed", "gone"),
        file("etc/kept", "kept"),
        Entry::Dir("data", 0o755),
        Entry::Dir("data/dir", 0o700),
        file("data/dir/old1", "1"),
        file("data/dir/old2", "2"),
        Entry::Dir("bin", 0o755),
        Entry::File("bin/tool".into(), b"#!/bin/sh\necho base\n".to_vec(), 0o4755, 0),
        Entry::Hardlink("bin/tool-link", "bin/tool"),
        Entry::Symlink("bin/alias", "tool"),
        Entry::File("home/user/owned".into(), b"mine".to_vec(), 0o600, 1000),
        file("version", "base"),
    ]);
    let middle = TestLayer::build(&[
        Entry::Whiteout("etc/removed"),
        Entry::Dir("data/dir", 0o700),
        Entry::Opaque("data/dir"),
        file("data/dir/new", "new"),
        file("version", "middle"),
    ]);
    let top = TestLayer::build(&[file("version", "top"), file("etc/added", "added")]);
    TestImage::new(vec![base, middle, top], host_arch())
}

/// Mounts `layers` (bottom first) as overlay's lower directories, read-only, at `target`.
struct OverlayMount(std::path::PathBuf);

impl OverlayMount {
    fn new(layers: &[std::path::PathBuf], target: &Path) -> OverlayMount {
        let lower: Vec<String> = layers.iter().rev().map(|l| l.display().to_string()).collect();
        let status = std::process::Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o"])
            .arg(format!("ro,lowerdir={}", lower.join(":")))
            .arg(target)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t overlay failed");
        OverlayMount(target.to_path_buf())
    }
}

impl Drop for OverlayMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_with_whiteouts_and_opaque_dirs_stack_as_overlay_lower_dirs() {
    if !is_root() {
        eprintln!("skipped: overlay mounts, whiteouts and ownership need root (CI runs as root)");
        return;
    }
    let registry = Registry::start(None);
    let image = three_layer_image();
    let digest = registry.push_image("team/app", "v1", &image).await;
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&dir.path().join("store"));
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let pulled = store
        .pull(&format!("{}/team/app:v1", registry.host), &[], &move |p| {
            seen.lock().unwrap().push(p)
        })
        .await
        .unwrap();
    assert_eq!(pulled.digest, digest);
    assert_eq!(pulled.reference, format!("{}/team/app:v1", registry.host));
    assert_eq!(pulled.layers.len(), 3);
    assert_eq!(pulled.config.entrypoint, ["/bin/tool"]);
    assert_eq!(pulled.config.cmd, ["--serve"]);
    assert_eq!(pulled.config.env, ["PATH=/usr/bin:/bin", "MODE=test"]);
    assert_eq!(pulled.config.working_dir.as_deref(), Some("/data"));
    assert_eq!(pulled.config.user.as_deref(), Some("1000:1000"));
    for layer in &pulled.layers {
        let name = layer.file_name().unwrap().to_str().unwrap();
        assert_eq!(name.len(), 16, "short layer names keep overlay's options short: {name}");
    }
    let events = events.lock().unwrap().clone();
    assert!(matches!(events.first(), Some(PullProgress::Resolved { layers: 3, .. })), "{events:?}");
    assert_eq!(
        events.iter().filter(|e| matches!(e, PullProgress::LayerDone { count: 3, .. })).count(),
        3
    );
    assert!(matches!(events.last(), Some(PullProgress::Done { .. })), "{events:?}");
    for (i, layer) in image.layers.iter().enumerate() {
        let complete = PullProgress::LayerBytes {
            index: i + 1,
            count: 3,
            digest: support::sha256(&layer.gz),
            downloaded: layer.gz.len() as u64,
            size: layer.gz.len() as u64,
        };
        assert!(events.contains(&complete), "layer {} reported whole: {events:?}", i + 1);
        let shown = format!(
            "layer {}/3: {:.1} of {:.1} MB",
            i + 1,
            layer.gz.len() as f64 / 1e6,
            layer.gz.len() as f64 / 1e6
        );
        assert_eq!(complete.to_string(), shown);
    }

    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let _mount = OverlayMount::new(&pulled.layers, &root);
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    assert_eq!(read("version"), "top");
    assert_eq!(read("etc/kept"), "kept");
    assert_eq!(read("etc/added"), "added");
    assert!(!root.join("etc/removed").exists(), "the whiteout hides the base layer's file");
    let mut dir_entries: Vec<String> = std::fs::read_dir(root.join("data/dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    dir_entries.sort();
    assert_eq!(dir_entries, ["new"], "the opaque directory hides the base layer's entries");
    let tool = std::fs::metadata(root.join("bin/tool")).unwrap();
    assert_eq!(tool.mode() & 0o7777, 0o4755);
    assert_eq!(tool.nlink(), 2);
    assert_eq!(tool.mtime(), 1_700_000_000);
    assert_eq!(tool.ino(), std::fs::metadata(root.join("bin/tool-link")).unwrap().ino());
    assert_eq!(std::fs::read_link(root.join("bin/alias")).unwrap(), Path::new("tool"));
    assert_eq!(read("bin/alias"), "#!/bin/sh\necho base\n");
    let owned = std::fs::metadata(root.join("home/user/owned")).unwrap();
    assert_eq!((owned.uid(), owned.gid(), owned.mode() & 0o777), (1000, 1000, 0o600));
    assert_eq!(std::fs::metadata(root.join("data/dir")).unwrap().mode() & 0o777, 0o700);
    // Nothing is left half-unpacked.
    assert_eq!(std::fs::read_dir(dir.path().join("store/tmp")).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_image_needs_its_basic_credentials() {
    let registry = Registry::start(Some(("alice", "s3cret")));
    let image = TestImage::new(vec![TestLayer::build(&[file("hello", "private")])], host_arch());
    registry.push_image("private/app", "1", &image).await;
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let reference = format!("{}/private/app:1", registry.host);

    let err = store.pull(&reference, &[], &no_progress).await.unwrap_err();
    assert!(matches!(err, PullError::Unauthorized { .. }), "{err}");
    assert!(!err.retryable());
    assert!(
        err.to_string().contains(&registry.host) && err.to_string().contains("private/app"),
        "{err}"
    );

    let wrong = [RegistryAuth {
        registry: registry.host.clone(),
        username: "alice".into(),
        password: "nope".into(),
    }];
    let err = store.pull(&reference, &wrong, &no_progress).await.unwrap_err();
    assert!(matches!(err, PullError::Unauthorized { .. }), "{err}");

    let secret = format!(
        r#"{{"auths":{{"http://{}/":{{"auth":"{}"}}}}}}"#,
        registry.host,
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "alice:s3cret")
    );
    let auths = RegistryAuth::from_docker_config_json(secret.as_bytes()).unwrap();
    let pulled = store.pull(&reference, &auths, &no_progress).await.unwrap();
    assert_eq!(std::fs::read_to_string(pulled.layers[0].join("hello")).unwrap(), "private");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_list_gives_this_machines_image_and_digests_pin_it() {
    let registry = Registry::start(None);
    let other_arch = if host_arch() == "arm64" { "amd64" } else { "arm64" };
    let ours = TestImage::new(vec![TestLayer::build(&[file("arch", host_arch())])], host_arch());
    let theirs = TestImage::new(vec![TestLayer::build(&[file("arch", other_arch)])], other_arch);
    registry.push_image("multi/app", &theirs.digest(), &theirs).await;
    registry.push_image("multi/app", &ours.digest(), &ours).await;
    let index = index_of(&[(&theirs, other_arch), (&ours, host_arch())]);
    let index_digest =
        registry.push_manifest("multi/app", "latest", support::OCI_INDEX, &index).await;

    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let pulled =
        store.pull(&format!("{}/multi/app", registry.host), &[], &no_progress).await.unwrap();
    assert_eq!(pulled.digest, ours.digest(), "the platform's manifest, not the index");
    assert_eq!(std::fs::read_to_string(pulled.layers[0].join("arch")).unwrap(), host_arch());

    // By digest: the index's, and an image manifest's.
    let by_index = store
        .pull(&format!("{}/multi/app@{index_digest}", registry.host), &[], &no_progress)
        .await
        .unwrap();
    assert_eq!(by_index.digest, ours.digest());
    let by_digest = store
        .pull(&format!("{}/multi/app@{}", registry.host, theirs.digest()), &[], &no_progress)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(by_digest.layers[0].join("arch")).unwrap(), other_arch);

    // A digest the registry does not have.
    let missing = format!("sha256:{}", "ab".repeat(32));
    let err = store
        .pull(&format!("{}/multi/app@{missing}", registry.host), &[], &no_progress)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::NotFound { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_blob_is_refused() {
    let registry = Registry::start(None);
    let layer = TestLayer::build(&[file("data", &"x".repeat(10_000))]);
    let image = TestImage::new(vec![layer], host_arch());
    registry.push_image("bad/app", "1", &image).await;
    // The registry serves what is on its disk: flip bytes of the stored layer.
    let blob = registry.blob_file(&support::sha256(&image.layers[0].gz));
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let err =
        store.pull(&format!("{}/bad/app:1", registry.host), &[], &no_progress).await.unwrap_err();
    assert!(
        matches!(&err, PullError::DigestMismatch { what, .. } if what.starts_with("layer")),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("layers")).unwrap().count(),
        0,
        "no layer under a final name"
    );
    assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    assert!(store.get(&format!("{}/bad/app:1", registry.host)).is_none());

    // A corrupted config: a digest mismatch, by name.
    let image = TestImage::new(vec![TestLayer::build(&[file("a", "b")])], host_arch());
    registry.push_image("bad/config", "1", &image).await;
    let blob = registry.blob_file(&support::sha256(&image.config));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[0] = b' ';
    std::fs::write(&blob, bytes).unwrap();
    let err = store
        .pull(&format!("{}/bad/config:1", registry.host), &[], &no_progress)
        .await
        .unwrap_err();
    assert!(matches!(&err, PullError::DigestMismatch { what, .. } if what == "config"), "{err}");
    assert!(err.to_string().contains("does not match its digest"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_images_are_not_found_and_a_stopped_registry_is_unreachable() {
    let mut registry = Registry::start(None);
    let image = TestImage::new(vec![TestLayer::build(&[file("a", "b")])], host_arch());
    registry.push_image("here/app", "1", &image).await;
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    for reference in
        [format!("{}/here/app:2", registry.host), format!("{}/nowhere/app:1", registry.host)]
    {
        let err = store.pull(&reference, &[], &no_progress).await.unwrap_err();
        assert!(matches!(err, PullError::NotFound { .. }), "{reference}: {err}");
        assert!(!err.retryable());
        assert!(err.to_string().contains(&reference), "{err}");
    }
    let err = store.pull("Bad/Name", &[], &no_progress).await.unwrap_err();
    assert!(matches!(err, PullError::InvalidReference { .. }) && !err.retryable(), "{err}");

    registry.stop();
    let err =
        store.pull(&format!("{}/here/app:1", registry.host), &[], &no_progress).await.unwrap_err();
    assert!(matches!(err, PullError::Unreachable { .. }), "{err}");
    assert!(err.retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_download_once_and_images_share_their_base_layer() {
    let registry = Registry::start(None);
    let base = || TestLayer::build(&[file("base", &"b".repeat(100_000))]);
    let first =
        TestImage::new(vec![base(), TestLayer::build(&[file("app", "first")])], host_arch());
    let second =
        TestImage::new(vec![base(), TestLayer::build(&[file("app", "second")])], host_arch());
    registry.push_image("share/first", "1", &first).await;
    registry.push_image("share/second", "1", &second).await;
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());

    let start = Arc::new(tokio::sync::Barrier::new(8));
    let pulls = (0..8).map(|i| {
        let store = store.clone();
        let start = start.clone();
        let reference = if i % 2 == 0 {
            format!("{}/share/first:1", registry.host)
        } else {
            format!("{}/share/second:1", registry.host)
        };
        tokio::spawn(async move {
            start.wait().await;
            store.pull(&reference, &[], &no_progress).await
        })
    });
    let results: Vec<_> =
        futures::future::join_all(pulls).await.into_iter().map(|r| r.unwrap().unwrap()).collect();
    let base_digest = support::sha256(&first.layers[0].gz);
    let base_gets = registry.get_count(&[
        format!("/v2/share/first/blobs/{base_digest}"),
        format!("/v2/share/second/blobs/{base_digest}"),
    ]);
    assert_eq!(base_gets, 1, "the shared base layer is downloaded once:\n{}", registry.log());
    for (image, repo) in [(&first, "first"), (&second, "second")] {
        let top = support::sha256(&image.layers[1].gz);
        assert_eq!(registry.get_count(&[format!("/v2/share/{repo}/blobs/{top}")]), 1);
        assert_eq!(
            registry.get_count(&[format!("/v2/share/{repo}/manifests/1")]),
            1,
            "one pull per reference"
        );
    }
    assert_eq!(results[0].layers[0], results[1].layers[0], "one directory for the shared layer");
    assert_ne!(results[0].layers[1], results[1].layers[1]);
    assert_eq!(std::fs::read_to_string(results[1].layers[1].join("app")).unwrap(), "second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulled_images_are_found_without_the_registry() {
    let mut registry = Registry::start(None);
    let image = TestImage::new(vec![TestLayer::build(&[file("cached", "yes")])], host_arch());
    let digest = registry.push_image("cache/app", "1", &image).await;
    let dir = tempfile::tempdir().unwrap();
    let reference = format!("{}/cache/app:1", registry.host);
    let pulled = open_store(dir.path()).pull(&reference, &[], &no_progress).await.unwrap();
    registry.stop();
    // A new store over the same directory (a restart), with the registry gone.
    let store = open_store(dir.path());
    assert_eq!(store.get(&reference), Some(pulled.clone()));
    let by_digest = format!("{}/cache/app@{digest}", registry.host);
    assert_eq!(store.get(&by_digest).map(|i| i.layers), Some(pulled.layers.clone()));
    assert_eq!(
        store.pull(&by_digest, &[], &no_progress).await.unwrap().digest,
        digest,
        "a stored digest needs no network"
    );
    assert!(store.get(&format!("{}/cache/app:2", registry.host)).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_unused_images_and_keeps_those_in_use() {
    let registry = Registry::start(None);
    let base = || TestLayer::build(&[file("base", "shared")]);
    let used = TestImage::new(vec![base(), TestLayer::build(&[file("app", "used")])], host_arch());
    let unused =
        TestImage::new(vec![base(), TestLayer::build(&[file("app", "unused")])], host_arch());
    registry.push_image("gc/used", "1", &used).await;
    registry.push_image("gc/unused", "1", &unused).await;
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let used_ref = format!("{}/gc/used:1", registry.host);
    let unused_ref = format!("{}/gc/unused:1", registry.host);
    let kept = store.pull(&used_ref, &[], &no_progress).await.unwrap();
    let gone = store.pull(&unused_ref, &[], &no_progress).await.unwrap();
    let in_use = BTreeSet::from([kept.digest.clone()]);

    // Young images are kept whatever the budget.
    let young = GcPolicy { min_age: Duration::from_secs(3600), max_bytes: 0, max_unused_age: None };
    let report = store.gc(&in_use, &young).unwrap();
    assert!(report.removed_images.is_empty() && report.removed_layers.is_empty(), "{report:?}");

    let policy = GcPolicy { min_age: Duration::ZERO, max_bytes: 0, max_unused_age: None };
    let report = store.gc(&in_use, &policy).unwrap();
    assert_eq!(report.removed_images, std::slice::from_ref(&gone.digest));
    assert_eq!(report.removed_layers, [support::sha256(&unused.layers[1].tar)]);
    assert!(report.freed_bytes >= "unused".len() as u64, "{report:?}");
    assert!(!gone.layers[1].exists());
    assert_eq!(
        std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
        0,
        "removed, not parked"
    );
    assert!(store.get(&unused_ref).is_none());
    assert_eq!(store.get(&used_ref), Some(kept.clone()));
    assert!(
        kept.layers.iter().all(|l| l.is_dir()),
        "the in-use image's layers, the shared base included, stay"
    );
    // Pulled again, it comes back.
    let again = store.pull(&unused_ref, &[], &no_progress).await.unwrap();
    assert_eq!(std::fs::read_to_string(again.layers[1].join("app")).unwrap(), "unused");
}
