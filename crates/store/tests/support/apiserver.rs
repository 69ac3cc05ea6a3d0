//! A real Kubernetes API server for tests, so the kube-rs backend is checked against the
//! server's own semantics rather than our reading of them.
//!
//! [`ApiServer::start`] runs Debian's `etcd` and `apiextensions-apiserver` (built once per
//! machine by `scripts/build-apiserver.sh`; runtime-feasibility.md §9) on free loopback ports in
//! a temporary directory: it makes a CA, a serving certificate for `127.0.0.1`, and an X.509 v3
//! client certificate in the `system:masters` group (which the server's delegated authorizer
//! always allows), writes one kubeconfig that both the server (for its delegated authentication
//! and authorization) and the tests use, installs the given CRDs and waits until they are
//! Established and served. Dropping the [`ApiServer`] kills both processes and deletes the
//! directory; they are also started with a parent-death signal, so a test process killed by
//! a timeout leaves nothing running.
//!
//! The server is CRD-only: it has no core API (`/api` is 404), so there are no Namespaces,
//! Events, Secrets or Leases, no garbage collector (owner cascade never happens), and no
//! namespace lifecycle: objects can be created in any namespace without creating it first.
//!
//! Where the binaries are looked for: `$OKA_APISERVER`, else
//! `/var/cache/oka/apiserver/apiextensions-apiserver`; `$OKA_ETCD`, else `etcd` on `PATH`, else
//! `/usr/bin/etcd`. When one is missing, [`ApiServer::start`] returns `None` after printing why
//! (the caller skips the test), except as root: `scripts/test.sh` builds both there, so a
//! missing binary is a failure.

// Test support panics on failure: in a test, a panic is the failure report.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Where `scripts/build-apiserver.sh` leaves the binary.
pub const DEFAULT_APISERVER: &str = "/var/cache/oka/apiserver/apiextensions-apiserver";

/// How long the server may take to serve, and CRDs to become Established.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Admission plugins that need the core API or webhooks this server does not have.
const DISABLED_ADMISSION: &str = "NamespaceLifecycle,MutatingAdmissionPolicy,\
     MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook";

/// A stand-in CRD for the built-in `coordination.k8s.io/v1` Lease, which this server lacks:
/// kind `Lease`, namespaced, its `spec` kept as sent. The requests and resourceVersion
/// preconditions are a real cluster's; the built-in type's server-side validation and
/// defaulting are not. Groups under `k8s.io` are protected, so it carries the annotation
/// `api-approved.kubernetes.io: "unapproved, test stand-in for the built-in Lease"`.
pub fn lease_stand_in() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "leases.coordination.k8s.io",
            "annotations": {
                "api-approved.kubernetes.io": "unapproved, test stand-in for the built-in Lease",
            },
        },
        "spec": {
            "group": "coordination.k8s.io",
            "scope": "Namespaced",
            "names": {
                "plural": "leases",
                "singular": "lease",
                "kind": "Lease",
                "listKind": "LeaseList",
            },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            }],
        },
    }))
    .unwrap()
}

/// A running etcd + apiextensions-apiserver pair; stopped on drop.
pub struct ApiServer {
    dir: tempfile::TempDir,
    etcd: Child,
    /// `None` until etcd listens.
    apiserver: Option<Child>,
    url: String,
    kubeconfig: PathBuf,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").field("url", &self.url).finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Starts a server with `crds` installed and Established, or returns `None` (after saying
    /// why on stderr) when the binaries are not built and this is not root.
    ///
    /// # Panics
    ///
    /// When the binaries are missing as root, or the server does not come up.
    pub async fn start(crds: &[CustomResourceDefinition]) -> Option<ApiServer> {
        let (apiserver, etcd) = match (apiserver_binary(), etcd_binary()) {
            (Ok(a), Ok(e)) => (a, e),
            (a, e) => {
                let why = [a.err(), e.err()].into_iter().flatten().collect::<Vec<_>>().join("; ");
                assert!(
                    !is_root(),
                    "{why}: as root (as CI runs), scripts/test.sh builds them with \
                     scripts/build-apiserver.sh; run it"
                );
                eprintln!(
                    "skipped: no real Kubernetes API server ({why}); build one with \
                     `sudo scripts/build-apiserver.sh`"
                );
                return None;
            }
        };
        // Free ports are picked, then released, then bound by the servers: another process may
        // take one in between, so a failed start is retried with new ports.
        let mut attempt = 1;
        let server = loop {
            match Self::spawn(&apiserver, &etcd).await {
                Ok(server) => break server,
                Err(e) if attempt < 3 => {
                    eprintln!("apiserver harness: start failed ({e}); retrying with new ports");
                    attempt += 1;
                }
                Err(e) => panic!("the test API server did not start: {e}"),
            }
        };
        server.install_crds(crds).await;
        Some(server)
    }

    /// Starts etcd and the API server and waits until the server answers.
    async fn spawn(apiserver: &Path, etcd: &Path) -> Result<ApiServer, String> {
        let dir = tempfile::Builder::new().prefix("oka-apiserver-").tempdir().unwrap();
        let d = dir.path();
        let (client_port, peer_port, secure_port) = (free_port(), free_port(), free_port());
        write_certificates(d);

        let etcd_child = spawn_logged(
            Command::new(etcd).args([
                "--name=test".to_owned(),
                format!("--data-dir={}", d.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=test=http://127.0.0.1:{peer_port}"),
                "--log-level=warn".to_owned(),
                "--logger=zap".to_owned(),
            ]),
            &d.join("etcd.log"),
        );
        let url = format!("https://127.0.0.1:{secure_port}");
        let kubeconfig = d.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &url, d);
        // From here on, dropping `server` stops whatever runs.
        let mut server = ApiServer { etcd: etcd_child, apiserver: None, url, kubeconfig, dir };
        wait_for_port(client_port, &mut server.etcd, &server.dir.path().join("etcd.log"))?;

        let kc = server.kubeconfig.display().to_string();
        let d = server.dir.path();
        server.apiserver = Some(spawn_logged(
            Command::new(apiserver).args([
                format!("--etcd-servers=http://127.0.0.1:{client_port}"),
                format!("--secure-port={secure_port}"),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--cert-dir={}", d.join("serving").display()),
                format!("--tls-cert-file={}", d.join("server.crt").display()),
                format!("--tls-private-key-file={}", d.join("server.key").display()),
                format!("--client-ca-file={}", d.join("ca.crt").display()),
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--authentication-skip-lookup".to_owned(),
                format!("--disable-admission-plugins={DISABLED_ADMISSION}"),
                // Priority and fairness watches FlowSchemas, which this server does not serve.
                "--enable-priority-and-fairness=false".to_owned(),
            ]),
            &d.join("apiserver.log"),
        ));
        server.wait_until_serving().await?;
        Ok(server)
    }

    /// The server's URL, `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig for the server, authenticated as a `system:masters` member.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory holding the certificates, the kubeconfig and both servers' logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new client of the server. Make one per tokio runtime: a client's connection pool
    /// lives on the runtime that made it.
    pub async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await;
        Client::try_from(config.unwrap()).unwrap()
    }

    /// The last lines of the API server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        tail(&self.dir.path().join("apiserver.log"))
    }

    async fn wait_until_serving(&mut self) -> Result<(), String> {
        let client = self.client().await;
        let crds: Api<CustomResourceDefinition> = Api::all(client);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            let exited = self.apiserver.as_mut().and_then(|c| c.try_wait().unwrap());
            if let Some(status) = exited {
                return Err(format!(
                    "apiextensions-apiserver exited ({status}):\n{}",
                    self.log_tail()
                ));
            }
            match crds.list(&ListParams::default().limit(1)).await {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("not serving after {READY_TIMEOUT:?} ({last}):\n{}", self.log_tail()))
    }

    /// Creates `crds` and waits until each is Established and its first version is served.
    async fn install_crds(&self, crds: &[CustomResourceDefinition]) {
        let client = self.client().await;
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in crds {
            match api.create(&PostParams::default(), crd).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!(
                    "creating CRD {}: {e}\n{}",
                    crd.metadata.name.as_deref().unwrap_or_default(),
                    self.log_tail()
                ),
            }
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let version = &crd.spec.versions[0].name;
            let gvk = GroupVersionKind::gvk(&crd.spec.group, version, &crd.spec.names.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
            let objects: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            loop {
                let established = api.get(&name).await.ok().is_some_and(|c| {
                    c.status
                        .and_then(|s| s.conditions)
                        .into_iter()
                        .flatten()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
                if established && objects.list(&ListParams::default().limit(1)).await.is_ok() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "CRD {name} not Established and served within {READY_TIMEOUT:?}\n{}",
                    self.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for child in self.apiserver.iter_mut().chain([&mut self.etcd]) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The API server binary, or why there is none.
fn apiserver_binary() -> Result<PathBuf, String> {
    let path = std::env::var_os("OKA_APISERVER")
        .map_or_else(|| PathBuf::from(DEFAULT_APISERVER), PathBuf::from);
    if path.is_file() { Ok(path) } else { Err(format!("{} is not built", path.display())) }
}

/// The etcd binary, or why there is none.
fn etcd_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("OKA_ETCD") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("OKA_ETCD={} does not exist", path.display()))
        };
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("etcd"))
        .chain([PathBuf::from("/usr/bin/etcd")])
        .find(|p| p.is_file());
    on_path.ok_or_else(|| "etcd is not installed (Debian: etcd-server)".to_owned())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            .is_some_and(|euid| euid == "0")
    })
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Spawns `command` with its output in `log`, killed with SIGKILL if the thread that started
/// it dies (through util-linux `setpriv`, when there is one).
fn spawn_logged(command: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
    let mut cmd = if Path::new("/usr/bin/setpriv").is_file() {
        let mut c = Command::new("/usr/bin/setpriv");
        c.arg("--pdeathsig=KILL").arg("--").arg(&program).args(&args);
        c
    } else {
        let mut c = Command::new(&program);
        c.args(&args);
        c
    };
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()))
}

/// Waits until something accepts connections on `port`, or `child` exits.
fn wait_for_port(port: u16, child: &mut Child, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("etcd exited ({status}):\n{}", tail(log)));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("etcd does not listen on {addr} after {READY_TIMEOUT:?}:\n{}", tail(log)))
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<_> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Writes `ca.crt`, `server.{crt,key}` (for 127.0.0.1 and localhost) and `client.{crt,key}`
/// (CN `oka-test`, O `system:masters`) into `dir`. rcgen writes X.509 v3, which rustls needs.
fn write_certificates(dir: &Path) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, "oka-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate().unwrap();
    let mut server =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    server.distinguished_name.push(DnType::CommonName, "oka-test-apiserver");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server.signed_by(&server_key, &issuer).unwrap();

    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client.distinguished_name.push(DnType::CommonName, "oka-test");
    client.distinguished_name.push(DnType::OrganizationName, "system:masters");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = client.signed_by(&client_key, &issuer).unwrap();

    for (name, text) in [
        ("ca.crt", ca_cert.pem()),
        ("server.crt", server_cert.pem()),
        ("server.key", server_key.serialize_pem()),
        ("client.crt", client_cert.pem()),
        ("client.key", client_key.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// A kubeconfig (JSON, which is YAML) for `url`, with the files [`write_certificates`] made.
fn write_kubeconfig(path: &Path, url: &str, dir: &Path) {
    let file = |name: &str| dir.join(name).display().to_string();
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {
            "server": url,
            "certificate-authority": file("ca.crt"),
        }}],
        "users": [{"name": "test", "user": {
            "client-certificate": file("client.crt"),
            "client-key": file("client.key"),
        }}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "current-context": "test",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}
