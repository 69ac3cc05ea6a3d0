//! Test support for oka-image: a real registry (Debian's `docker-registry`, distribution 2.8)
//! on a free loopback port with its own storage and optional htpasswd auth, images built here
//! (layer tars, gzipped, a config, a manifest, an index) and pushed with the registry's upload
//! API. Shared by the tests and the pull bench.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use flate2::write::GzEncoder;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest as _, Sha256};

/// The registry binary the test script installs.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A running registry.
pub struct Registry {
    child: Option<Child>,
    /// Its root (config, storage, log).
    pub dir: tempfile::TempDir,
    /// `127.0.0.1:<port>`.
    pub host: String,
    /// Basic credentials it requires, if any.
    pub credentials: Option<(String, String)>,
}

/// A free loopback port (bound, then released for the child to take).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl Registry {
    /// Starts a registry; with `credentials`, it wants them (htpasswd, bcrypt by `htpasswd -B`).
    pub fn start(credentials: Option<(&str, &str)>) -> Registry {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} is missing: run scripts/test.sh as root (it installs Debian's docker-registry and apache2-utils)"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let mut auth = String::new();
        if let Some((user, pass)) = credentials {
            let htpasswd = dir.path().join("htpasswd");
            let status = Command::new("htpasswd")
                .args(["-B", "-b", "-c"])
                .arg(&htpasswd)
                .args([user, pass])
                .stderr(Stdio::null())
                .status()
                .expect("htpasswd (apache2-utils, installed by scripts/test.sh)");
            assert!(status.success());
            auth = format!(
                "auth:\n  htpasswd:\n    realm: oka-test\n    path: {}\n",
                htpasswd.display()
            );
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\n  formatter: text\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  maintenance:\n    uploadpurging:\n      enabled: false\nhttp:\n  addr: {host}\n  secret: oka-test\n{auth}",
            dir.path().join("data").display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let mut registry = Registry {
            child: None,
            dir,
            host,
            credentials: credentials.map(|(u, p)| (u.to_string(), p.to_string())),
        };
        registry.spawn();
        registry
    }

    fn spawn(&mut self) {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&self.host).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not listen on {}: {}",
                self.host,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Restarts it with `auth` (YAML under `auth:`) instead of its current authentication;
    /// its storage stays.
    pub fn restart_with_auth(&mut self, auth_yaml: &str) {
        self.stop();
        let path = self.dir.path().join("config.yml");
        let config = std::fs::read_to_string(&path).unwrap();
        let config = config.split("auth:\n").next().unwrap().to_string();
        std::fs::write(&path, format!("{config}auth:\n{auth_yaml}")).unwrap();
        self.spawn();
    }

    /// Stops it (its storage stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The registry's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// The registry's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// How many successful GETs of any of `paths` the access log has. The registry writes a
    /// request's line after its response, so this waits for a first one, then a moment more
    /// for any late duplicate.
    pub fn get_count(&self, paths: &[String]) -> usize {
        let count = || {
            let log = self.log();
            paths
                .iter()
                .map(|path| log.matches(&format!("\"GET {path} HTTP/1.1\" 200")).count())
                .sum::<usize>()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while count() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        count()
    }

    /// The file a blob is stored in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join(format!("data/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }

    fn authorization(&self) -> Option<String> {
        self.credentials.as_ref().map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        })
    }

    /// Pushes a blob (monolithic upload: POST, then PUT with the digest).
    pub async fn push_blob(&self, repository: &str, bytes: &[u8]) -> String {
        let digest = sha256(bytes);
        let client = http_client();
        let url = format!("http://{}/v2/{repository}/blobs/uploads/", self.host);
        let response = send(&client, "POST", &url, self.authorization(), None, Bytes::new()).await;
        assert_eq!(response.0, 202, "start upload: {}", response.2);
        let location = response.1.expect("upload Location");
        let location = if location.starts_with("http") {
            location
        } else {
            format!("http://{}{location}", self.host)
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let put = format!("{location}{sep}digest={digest}");
        let response =
            send(&client, "PUT", &put, self.authorization(), None, Bytes::copy_from_slice(bytes))
                .await;
        assert_eq!(response.0, 201, "finish upload: {}", response.2);
        digest
    }

    /// Pushes a manifest under `tag` (a tag or digest); returns its digest.
    pub async fn push_manifest(
        &self,
        repository: &str,
        tag: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> String {
        let client = http_client();
        let url = format!("http://{}/v2/{repository}/manifests/{tag}", self.host);
        let response = send(
            &client,
            "PUT",
            &url,
            self.authorization(),
            Some(media_type),
            Bytes::copy_from_slice(bytes),
        )
        .await;
        assert_eq!(response.0, 201, "push manifest: {}", response.2);
        sha256(bytes)
    }

    /// Pushes an image: its layers, config and manifest; returns the manifest digest.
    pub async fn push_image(&self, repository: &str, tag: &str, image: &TestImage) -> String {
        for layer in &image.layers {
            self.push_blob(repository, &layer.gz).await;
        }
        self.push_blob(repository, &image.config).await;
        self.push_manifest(repository, tag, OCI_MANIFEST, &image.manifest).await
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// OCI manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI index media type.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

fn http_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    method: &str,
    url: &str,
    authorization: Option<String>,
    content_type: Option<&str>,
    body: Bytes,
) -> (u16, Option<String>, String) {
    let mut request =
        http::Request::builder().method(method).uri(url).header("content-length", body.len());
    if let Some(a) = authorization {
        request = request.header("authorization", a);
    }
    if let Some(c) = content_type {
        request = request.header("content-type", c);
    }
    let response = client.request(request.body(Full::new(body)).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let location = response.headers().get("location").map(|v| v.to_str().unwrap().to_string());
    let text = String::from_utf8_lossy(&response.into_body().collect().await.unwrap().to_bytes())
        .into_owned();
    (status, location, text)
}

/// `sha256:<hex>`.
pub fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// One entry of a test layer.
pub enum Entry {
    /// A directory.
    Dir(&'static str, u32),
    /// A file with content, mode, owner.
    File(String, Vec<u8>, u32, u64),
    /// A symlink → target.
    Symlink(&'static str, &'static str),
    /// A hardlink → target (earlier in the layer).
    Hardlink(&'static str, &'static str),
    /// A whiteout of the path (`dir/.wh.name`).
    Whiteout(&'static str),
    /// An opaque marker in the directory.
    Opaque(&'static str),
}

/// A layer as pushed.
pub struct TestLayer {
    /// The uncompressed tar.
    pub tar: Vec<u8>,
    /// Gzipped.
    pub gz: Vec<u8>,
}

impl TestLayer {
    /// Builds a layer from entries (gzip at `level`).
    pub fn build(entries: &[Entry]) -> TestLayer {
        TestLayer::build_with(entries, flate2::Compression::fast())
    }

    /// Builds with a given gzip level.
    pub fn build_with(entries: &[Entry], level: flate2::Compression) -> TestLayer {
        let mut builder = tar::Builder::new(Vec::new());
        let header = |kind: tar::EntryType, size: u64, mode: u32| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(size);
            h.set_mode(mode);
            h.set_mtime(1_700_000_000);
            h
        };
        for entry in entries {
            match entry {
                Entry::Dir(path, mode) => builder
                    .append_data(
                        &mut header(tar::EntryType::Directory, 0, *mode),
                        path,
                        std::io::empty(),
                    )
                    .unwrap(),
                Entry::File(path, content, mode, owner) => {
                    let mut h = header(tar::EntryType::Regular, content.len() as u64, *mode);
                    h.set_uid(*owner);
                    h.set_gid(*owner);
                    builder.append_data(&mut h, path, &content[..]).unwrap()
                }
                Entry::Symlink(path, target) => builder
                    .append_link(&mut header(tar::EntryType::Symlink, 0, 0o777), path, target)
                    .unwrap(),
                Entry::Hardlink(path, target) => builder
                    .append_link(&mut header(tar::EntryType::Link, 0, 0o644), path, target)
                    .unwrap(),
                Entry::Whiteout(path) => {
                    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
                    let wh = if dir.is_empty() {
                        format!(".wh.{name}")
                    } else {
                        format!("{dir}/.wh.{name}")
                    };
                    builder
                        .append_data(
                            &mut header(tar::EntryType::Regular, 0, 0o600),
                            wh,
                            std::io::empty(),
                        )
                        .unwrap()
                }
                Entry::Opaque(dir) => builder
                    .append_data(
                        &mut header(tar::EntryType::Regular, 0, 0o600),
                        format!("{dir}/.wh..wh..opq"),
                        std::io::empty(),
                    )
                    .unwrap(),
            }
        }
        let tar = builder.into_inner().unwrap();
        let mut gz = GzEncoder::new(Vec::new(), level);
        gz.write_all(&tar).unwrap();
        TestLayer { gz: gz.finish().unwrap(), tar }
    }
}

/// An image as pushed.
pub struct TestImage {
    /// Bottom first.
    pub layers: Vec<TestLayer>,
    /// The config JSON.
    pub config: Vec<u8>,
    /// The manifest JSON.
    pub manifest: Vec<u8>,
}

impl TestImage {
    /// An image of these layers, with `Entrypoint`, `Cmd`, `Env`, `WorkingDir`, `User`.
    pub fn new(layers: Vec<TestLayer>, architecture: &str) -> TestImage {
        let diff_ids: Vec<String> = layers.iter().map(|l| sha256(&l.tar)).collect();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": architecture,
            "os": "linux",
            "config": {
                "Entrypoint": ["/bin/tool"],
                "Cmd": ["--serve"],
                "Env": ["PATH=/usr/bin:/bin", "MODE=test"],
                "WorkingDir": "/data",
                "User": "1000:1000"
            },
            "rootfs": { "type": "layers", "diff_ids": diff_ids }
        }))
        .unwrap();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256(&config),
                "size": config.len()
            },
            "layers": layers.iter().map(|l| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": sha256(&l.gz),
                "size": l.gz.len()
            })).collect::<Vec<_>>()
        }))
        .unwrap();
        TestImage { layers, config, manifest }
    }

    /// The manifest's digest.
    pub fn digest(&self) -> String {
        sha256(&self.manifest)
    }
}

/// An OCI index over `(manifest, architecture)` pairs.
pub fn index_of(images: &[(&TestImage, &str)]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": images.iter().map(|(image, arch)| serde_json::json!({
            "mediaType": OCI_MANIFEST,
            "digest": image.digest(),
            "size": image.manifest.len(),
            "platform": { "os": "linux", "architecture": arch }
        })).collect::<Vec<_>>()
    }))
    .unwrap()
}

/// This machine's architecture as OCI names it.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
