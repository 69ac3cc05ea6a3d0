//! The configuration of `oka serve` and of the cluster components (`oka controller`, `oka
//! manager`, `oka gateway`, `oka node`): an optional YAML file whose every field has a default,
//! so no file is needed for `oka serve`.
//!
//! ```yaml
//! # /etc/oka/config.yaml (every field optional)
//! stateDir: /var/lib/oka        # store, lock and sandbox state
//! log:
//!   format: text                # text | json
//!   filter: info                # a tracing filter, e.g. "info,oka_store=debug"
//! store:
//!   watchHistory: 10000         # changes kept in memory for watches to resume from
//! controllers:
//!   sandboxClaimWorkers: 4      # concurrent reconciles of SandboxClaims
//!   sandboxWorkers: 8           # concurrent reconciles of Sandboxes
//!   sandboxSetWorkers: 2        # concurrent reconciles of SandboxSets
//!   poolAutoscalerWorkers: 5    # concurrent reconciles of PoolAutoscalers
//!   poolAutoscaler:
//!     samplingInterval: 15s     # how often a capacity policy samples its pool (5s to 30s)
//!     observationWindow: 60s    # how far back samples are averaged (30s to 5m, at least the interval)
//!     defaultTolerance: 10%     # the tolerance of a capacity policy that sets none
//!     scaleUpSettleTimeout: 5m  # how long a scale-up's sandboxes are not counted as demand, at most
//! runtime:
//!   enabled: true               # run sandboxes on this machine (needs root)
//!   autoInstall: true           # install CRIU >= 4.2, nftables and debootstrap in the background when missing (Debian)
//! api:
//!   listen: 127.0.0.1:8080      # the E2B-compatible REST API
//!   adminKey: null              # e2b_ + 40 hex; by default generated once into <stateDir>/admin-key
//!   adminKeyFile: null          # oka manager: a file holding the admin key (a mounted Secret)
//!   minTimeout: 0s              # the shortest sandbox timeout accepted (E2B: 0; the reference: 30s)
//!   trafficAccessTokenValidity: 876000h  # a refreshed traffic access token's life (5m to 100 years)
//! gateway:
//!   listen: 127.0.0.1:8081      # traffic to ports inside sandboxes (E2B_SANDBOX_URL)
//!   domain: null                # `{port}-{sandboxID}.{domain}` hosts; null: routed by header/path only
//!   idleTimeout: 15m            # a proxied connection with no traffic for this long is closed
//!   wakeTimeout: 60s            # how long a request to a paused sandbox waits for it to resume
//!   auth:                       # who may send traffic to a sandbox (README, "Gateway auth")
//!     mode: none                # none | accessToken (x-access-token = the envd token) | jwt
//!     jwt:                      # mode jwt: traffic JWTs of an OIDC identity provider
//!       discoveryUrl: null      # https://.../.well-known/openid-configuration (required)
//!       caFile: null            # PEM CA bundle trusted for discovery and the keys (required)
//!       clockSkew: 1m           # allowed on exp, nbf and iat
//! kubeApi:
//!   enabled: true               # the Kubernetes-compatible API, for kubectl (<stateDir>/kubeconfig)
//!   listen: 127.0.0.1:6444      # HTTPS with a CA made once (<stateDir>/kube-ca.crt)
//! defaultPool:                  # created once when missing, never overwritten
//!   enabled: true
//!   namespace: default
//!   name: base
//!   replicas: 2
//!   maxStarting: 32             # sandboxes of the pool starting at once (its scaleStrategy.maxUnavailable)
//!   cpu: "1"
//!   memory: 512Mi
//!   outbound: true              # its sandboxes reach the internet (as E2B's) when nftables is here; false: loopback only
//! templates:                    # the roots of the default pools (Debian, built on first start)
//!   dir: null                   # null: <stateDir>/templates; may be a shared cache
//!   mirror: null                # the Debian archive; null: the one this machine's apt uses
//!   buildTimeLimit: 1h          # the most one E2B SDK template build may take
//!   images: {}                  # default template -> OCI image it runs on instead of a built root,
//!                               # e.g. base: registry.example.com/oka/base:1
//!   imagePullSecrets: []        # Secrets (kubernetes.io/dockerconfigjson) in the pools' namespaces
//! images:                       # OCI images that templates name by reference
//!   dir: null                   # null: <stateDir>/images (content-addressed layers, shared)
//!   insecureRegistries: []      # host[:port] spoken to over plain HTTP (loopback always is)
//!   mirrors: {}                 # registry -> mirror URL tried first, e.g. docker.io: http://127.0.0.1:5000
//!   gc:
//!     budget: 20Gi              # unpacked layers are kept under this size, least recently used go first
//!     minAge: 2m                # an image used more recently is never removed
//!     maxUnusedAge: null        # an image unused this long is removed whatever the size; null: never
//!     period: 5m                # how often unused images are collected
//! tracing:                      # OpenTelemetry traces of API requests and reconciles
//!   mode: none                  # none | otel (OTLP/gRPC) | otel-http (OTLP/HTTP) | std | file
//!   endpoint: localhost:4317    # the collector; no scheme: https://, or http:// with insecure
//!   samplingRatio: 1.0          # the share of requests traced, 0 to 1
//!   insecure: false             # plain text to the collector
//!   file: null                  # where mode `file` appends spans (mode 0600)
//! quota:                        # API-key quotas (flags --quota-* override these)
//!   redisAddr: null             # host:port of a shared Redis; null: the embedded ledger
//!   redisDb: 0
//!   redisOperationTimeout: 50ms # an admission's bound; over it, the create fails open
//!   redisBreakerMaxFailures: 3  # consecutive Redis failures that open the circuit breaker
//!   redisBreakerOpenDuration: 30s
//!   antiDriftInterval: 5m       # how often the counters are checked against the store
//!   antiDriftGrace: 10m         # how long a count no sandbox holds is kept before release
//! codeInterpreterPool:          # the E2B code interpreter's template; created once when missing,
//!   enabled: true               # and only when oka-interpreter is installed beside oka
//!   namespace: default
//!   name: code-interpreter-v1
//!   replicas: 1
//!   maxStarting: 32             # sandboxes of the pool starting at once (its scaleStrategy.maxUnavailable)
//!   cpu: "1"
//!   memory: 1Gi
//!   outbound: true              # as defaultPool's
//! cluster:                      # the cluster components only
//!   kubeconfig: null            # null: $KUBECONFIG, ~/.kube/config, or the Pod's service account
//!   namespace: sandbox-system   # the controllers' Lease and the SandboxNodes
//!   relayTokenFile: null        # the node relay's shared token (required on a cluster)
//!   nodeLostAfter: 40s          # a node whose heartbeat stands still this long is lost
//!   defaultRuntime: pod         # pod | node: where a sandbox runs when neither its annotation
//!                               # agents.kruise.io/runtime nor runtimeClassName oka-node says
//!   pods:                       # the Pod runtime (in the leading oka controller)
//!     envdImage: oka-envd:<version>  # the image whose /oka-envd is copied into every Pod
//!   leaderElection:
//!     leaseName: oka-controller
//!     leaseDuration: 10s        # a standby leads at most this plus retryPeriod after a leader dies
//!     renewDeadline: 7s         # a leader that cannot renew this long stops
//!     retryPeriod: 2s
//!   webhook:                    # oka controller's admission webhooks (HTTPS, every replica)
//!     enabled: true
//!     listen: 0.0.0.0:9443      # the Service `serviceName` (port 443) targets this port
//!     secretName: oka-webhook-certs   # CA and serving certificate, made by the first replica
//!     serviceName: oka-webhook  # the certificate is for <serviceName>.<namespace>.svc
//!     mutatingConfiguration: oka-mutating-webhook     # caBundle written into their webhooks
//!     validatingConfiguration: oka-validating-webhook # that point at the Service
//!     allowedPodDeleters: null  # null: [system:serviceaccount:<namespace>:oka-controller]
//!     resyncPeriod: 1m          # besides on each change (watched), the Secret and caBundles checked
//!   node:                       # oka node
//!     name: null                # null: the host name
//!     relayListen: 0.0.0.0:4990
//!     relayAddress: null        # what the others dial; null: host name and relay port
//!     labels: {}                # matched by templates' nodeSelector and node affinity
//!     capacity: {}              # cpu, memory, sandboxes; unnamed: not limited
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The whole configuration of `oka serve`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Config {
    /// Where the store, the instance lock and (later) sandbox state live.
    pub state_dir: PathBuf,
    /// Logging.
    pub log: LogConfig,
    /// The embedded store.
    pub store: StoreConfig,
    /// The controllers.
    pub controllers: ControllersConfig,
    /// The local node runtime.
    pub runtime: RuntimeConfig,
    /// The E2B-compatible REST API.
    pub api: ApiConfig,
    /// The traffic gateway to ports inside sandboxes.
    pub gateway: GatewayConfig,
    /// The Kubernetes-compatible API.
    pub kube_api: KubeApiConfig,
    /// The warm pool `oka serve` creates when it is missing.
    pub default_pool: DefaultPoolConfig,
    /// The code interpreter pool (`code-interpreter-v1`, the template `e2b_code_interpreter`
    /// creates from) `oka serve` creates when it is missing.
    pub code_interpreter_pool: CodeInterpreterPoolConfig,
    /// The default pools' template roots.
    pub templates: TemplatesConfig,
    /// OpenTelemetry traces.
    pub tracing: TracingConfig,
    /// OCI images.
    pub images: ImagesConfig,
    /// Prometheus metrics (`/metrics` on the API listener).
    pub metrics: MetricsConfig,
    /// API-key quotas.
    pub quota: QuotaConfig,
    /// The cluster components (`oka controller`, `oka manager`, `oka gateway`, `oka node`).
    pub cluster: ClusterConfig,
}

/// Settings of the cluster components; `oka serve` does not use them, and says so at start.
///
/// Each component serves `/metrics`, `/healthz` and `/readyz` on `api.listen` (the manager
/// serves the E2B API there too); the gateway serves traffic on `gateway.listen`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// A kubeconfig file; `None` uses `$KUBECONFIG`, `~/.kube/config`, or the Pod's service
    /// account, as kubectl does.
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of oka's own objects on the cluster: the controllers' Lease, the
    /// SandboxNodes, the API keys.
    pub namespace: String,
    /// The file holding the node relay's shared token (the node agents and everything that
    /// dials them read the same one).
    pub relay_token_file: Option<PathBuf>,
    /// Leader election of `oka controller`.
    pub leader_election: LeaderElectionConfig,
    /// How long a node's heartbeat may stand still before it is lost (Go duration).
    #[serde(deserialize_with = "go_duration")]
    pub node_lost_after: Duration,
    /// `oka node`.
    pub node: NodeConfig,
    /// The admission webhooks `oka controller` serves.
    pub webhook: WebhookConfig,
    /// Where a sandbox runs when neither its annotation `agents.kruise.io/runtime` nor its
    /// template's `runtimeClassName: oka-node` says (`pod` or `node`;
    /// [`oka_api::runtime_choice`]).
    #[serde(deserialize_with = "sandbox_runtime")]
    pub default_runtime: oka_api::runtime_choice::SandboxRuntime,
    /// The Pod runtime.
    pub pods: PodsConfig,
}

/// The admission webhooks every `oka controller` replica serves over HTTPS, with a
/// self-signed CA kept in a Secret and written into oka's webhook configurations.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct WebhookConfig {
    /// Whether to serve them (and keep the certificate and the configurations' CA).
    pub enabled: bool,
    /// Where the HTTPS server listens.
    pub listen: std::net::SocketAddr,
    /// The Secret (in `cluster.namespace`) holding the CA and the serving certificate.
    pub secret_name: String,
    /// The Service the API server calls the webhooks through (in `cluster.namespace`).
    pub service_name: String,
    /// The `MutatingWebhookConfiguration` to write the CA into.
    pub mutating_configuration: String,
    /// The `ValidatingWebhookConfiguration` to write the CA into.
    pub validating_configuration: String,
    /// Users whose deletions and evictions of a live sandbox's Pod are allowed; `None`: the
    /// controller's ServiceAccount, `system:serviceaccount:<namespace>:oka-controller`.
    pub allowed_pod_deleters: Option<Vec<String>>,
    /// How often the Secret and the configurations' CA are checked again, besides on every
    /// change of them, which is watched (Go duration).
    #[serde(deserialize_with = "go_duration")]
    pub resync_period: Duration,
}

impl WebhookConfig {
    /// The users whose deletions of a live sandbox's Pod are allowed, the controller's
    /// ServiceAccount in `namespace` unless configured.
    pub fn pod_deleters(&self, namespace: &str) -> Vec<String> {
        self.allowed_pod_deleters
            .clone()
            .unwrap_or_else(|| vec![format!("system:serviceaccount:{namespace}:oka-controller")])
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            enabled: true,
            listen: std::net::SocketAddr::from(([0, 0, 0, 0], 9443)),
            secret_name: "oka-webhook-certs".to_owned(),
            service_name: "oka-webhook".to_owned(),
            mutating_configuration: "oka-mutating-webhook".to_owned(),
            validating_configuration: "oka-validating-webhook".to_owned(),
            allowed_pod_deleters: None,
            resync_period: Duration::from_secs(60),
        }
    }
}

/// The Pod runtime: sandboxes as ordinary Pods, run by the leading `oka controller`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct PodsConfig {
    /// The image holding the static `/oka-envd` that an init container copies into every Pod
    /// whose template does not run envd itself (default `oka-envd:<oka's version>`).
    pub envd_image: String,
}

impl Default for PodsConfig {
    fn default() -> Self {
        PodsConfig { envd_image: format!("oka-envd:{}", env!("CARGO_PKG_VERSION")) }
    }
}

/// `pod` or `node`.
fn sandbox_runtime<'de, D>(d: D) -> Result<oka_api::runtime_choice::SandboxRuntime, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let text = String::deserialize(d)?;
    oka_api::runtime_choice::SandboxRuntime::parse(&text).ok_or_else(|| {
        serde::de::Error::custom(format!("{text:?} is not a runtime: use pod or node"))
    })
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            kubeconfig: None,
            namespace: "sandbox-system".to_owned(),
            relay_token_file: None,
            leader_election: LeaderElectionConfig::default(),
            node_lost_after: Duration::from_secs(oka_api::sandboxnode::NODE_LOST_AFTER_SECONDS),
            node: NodeConfig::default(),
            webhook: WebhookConfig::default(),
            default_runtime: oka_api::runtime_choice::SandboxRuntime::Pod,
            pods: PodsConfig::default(),
        }
    }
}

/// Leader election on a `coordination.k8s.io` Lease. The defaults are shorter than
/// client-go's (15 s, 10 s, 2 s) so that a standby leads within 15 s of the leader's death
/// (at most the lease duration plus a retry period and its jitter after the last renewal).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct LeaderElectionConfig {
    /// The Lease's name (in `cluster.namespace`).
    pub lease_name: String,
    /// How long a leader's lease lasts without renewal (Go duration).
    #[serde(deserialize_with = "go_duration")]
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up leading (Go duration).
    #[serde(deserialize_with = "go_duration")]
    pub renew_deadline: Duration,
    /// How often candidates try, and the leader renews (Go duration).
    #[serde(deserialize_with = "go_duration")]
    pub retry_period: Duration,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            lease_name: "oka-controller".to_owned(),
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(7),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The node agent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NodeConfig {
    /// The node's name (its SandboxNode's); `None`: the host name.
    pub name: Option<String>,
    /// Where the relay listens.
    pub relay_listen: std::net::SocketAddr,
    /// The relay address the gateway and the manager dial (`host:port`); `None`: the host
    /// name and the relay's port.
    pub relay_address: Option<String>,
    /// The labels of the node's SandboxNode, which templates' `nodeSelector` and affinity
    /// match.
    pub labels: std::collections::BTreeMap<String, String>,
    /// What the node offers sandboxes (`cpu`, `memory`, `sandboxes`); `None` for `cpu` and
    /// `memory` offers the machine's.
    pub capacity: std::collections::BTreeMap<String, String>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            name: None,
            relay_listen: std::net::SocketAddr::from(([0, 0, 0, 0], 4990)),
            relay_address: None,
            labels: std::collections::BTreeMap::new(),
            capacity: std::collections::BTreeMap::new(),
        }
    }
}

/// Trace settings (the reference's `--tracing-*` flags).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct TracingConfig {
    /// `none`, `otel`, `otel-http`, `std` or `file`.
    pub mode: String,
    /// The collector's address.
    pub endpoint: String,
    /// The share of requests traced, in `[0, 1]`.
    pub sampling_ratio: f64,
    /// Plain text to a collector given without a scheme.
    pub insecure: bool,
    /// The file of mode `file`.
    pub file: Option<PathBuf>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        let defaults = oka_telemetry::export::TracingSettings::default();
        TracingConfig {
            mode: defaults.mode.to_string(),
            endpoint: defaults.endpoint,
            sampling_ratio: defaults.sampling_ratio,
            insecure: defaults.insecure,
            file: None,
        }
    }
}

impl TracingConfig {
    /// The settings of the tracer provider.
    ///
    /// # Errors
    ///
    /// An unknown mode.
    pub fn settings(&self) -> anyhow::Result<oka_telemetry::export::TracingSettings> {
        Ok(oka_telemetry::export::TracingSettings {
            mode: self.mode.parse()?,
            endpoint: self.endpoint.clone(),
            sampling_ratio: self.sampling_ratio,
            insecure: self.insecure,
            file: self.file.clone(),
            service_name: "oka".to_owned(),
        })
    }
}

/// Metrics settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Sandbox label keys exported by `sandbox_labels` as `label_<key>` (the reference's
    /// `--metric-labels-allowlist`); none by default, so a label's values never multiply the
    /// series unasked.
    pub sandbox_labels: Vec<String>,
}

/// API-key quota settings (the reference's `--quota-*` flags).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct QuotaConfig {
    /// `host:port` of the Redis the managers share; `None`: the embedded ledger. The
    /// credentials come from `QUOTA_REDIS_USERNAME` and `QUOTA_REDIS_PASSWORD`.
    pub redis_addr: Option<String>,
    /// The Redis database.
    pub redis_db: i64,
    /// The bound of an admission's Redis call (more than 0).
    #[serde(deserialize_with = "go_duration")]
    pub redis_operation_timeout: Duration,
    /// Consecutive Redis failures that open the circuit breaker.
    pub redis_breaker_max_failures: u32,
    /// How long the breaker stays open.
    #[serde(deserialize_with = "go_duration")]
    pub redis_breaker_open_duration: Duration,
    /// Between two anti-drift passes.
    #[serde(deserialize_with = "go_duration")]
    pub anti_drift_interval: Duration,
    /// How long an entry no live sandbox holds is kept before it is released.
    #[serde(deserialize_with = "go_duration")]
    pub anti_drift_grace: Duration,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        QuotaConfig {
            redis_addr: None,
            redis_db: 0,
            redis_operation_timeout: Duration::from_millis(50),
            redis_breaker_max_failures: 3,
            redis_breaker_open_duration: Duration::from_secs(30),
            anti_drift_interval: Duration::from_secs(300),
            anti_drift_grace: Duration::from_secs(600),
        }
    }
}

/// E2B API settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ApiConfig {
    /// The address the API listens on.
    pub listen: std::net::SocketAddr,
    /// The admin API key; `None` generates one into `<stateDir>/admin-key` on first start.
    pub admin_key: Option<String>,
    /// A file holding the admin API key (`oka manager`, when `admin_key` is not set): a
    /// mounted Secret keeps the key out of the config file.
    pub admin_key_file: Option<PathBuf>,
    /// The shortest sandbox timeout a create, `set_timeout`, `connect` or resume accepts (Go
    /// duration, whole seconds). 0, as E2B; `30s` is the reference's minimum.
    #[serde(deserialize_with = "go_duration")]
    pub min_timeout: Duration,
    /// How long a traffic access token from `POST /sandboxes/{id}/traffic-access-token` is
    /// valid (Go duration, 5m to 876000h; the reference's `--traffic-access-token-validity`).
    #[serde(deserialize_with = "token_validity")]
    pub traffic_access_token_validity: Duration,
}

/// The longest traffic access token validity, 100 years (the reference's maximum and default).
pub const MAX_TRAFFIC_TOKEN_VALIDITY: Duration = Duration::from_secs(876_000 * 3600);

/// A Go duration within the reference's traffic token validity range, 5 min to 100 years.
fn token_validity<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
    let value = go_duration(de)?;
    if !(Duration::from_secs(300)..=MAX_TRAFFIC_TOKEN_VALIDITY).contains(&value) {
        return Err(serde::de::Error::custom(format!(
            "trafficAccessTokenValidity must be between 5m and 876000h, not {value:?}"
        )));
    }
    Ok(value)
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_key: None,
            admin_key_file: None,
            min_timeout: Duration::ZERO,
            traffic_access_token_validity: MAX_TRAFFIC_TOKEN_VALIDITY,
        }
    }
}

/// Kubernetes-compatible API settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct KubeApiConfig {
    /// Whether to serve it.
    pub enabled: bool,
    /// The address it listens on (HTTPS, with a CA generated once into the state directory;
    /// the admin key is its bearer token).
    pub listen: std::net::SocketAddr,
}

impl Default for KubeApiConfig {
    fn default() -> Self {
        KubeApiConfig { enabled: true, listen: std::net::SocketAddr::from(([127, 0, 0, 1], 6444)) }
    }
}

/// Traffic gateway settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// The address the gateway listens on.
    pub listen: std::net::SocketAddr,
    /// The domain of `{port}-{sandboxID}.{domain}` hosts, also returned to the SDK as the
    /// sandbox's `domain`; `None` routes by the `E2b-Sandbox-*` headers and `/kruise/` paths.
    pub domain: Option<String>,
    /// A proxied connection with no traffic for this long is closed (Go duration, e.g. `1h`).
    #[serde(deserialize_with = "go_duration")]
    pub idle_timeout: Duration,
    /// How long a request to a paused sandbox waits for it to resume (Go duration).
    #[serde(deserialize_with = "go_duration")]
    pub wake_timeout: Duration,
    /// Who may send traffic to a sandbox.
    pub auth: GatewayAuthConfig,
}

/// The gateway's auth mode (`oka_gateway::auth` has the rule), checked when the file is read:
/// mode `jwt` needs `jwt.discoveryUrl` (an absolute `https` URL) and `jwt.caFile`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields, try_from = "RawGatewayAuth")]
pub struct GatewayAuthConfig {
    /// `none`, `accessToken` or `jwt`.
    pub mode: GatewayAuthMode,
    /// The identity provider of mode `jwt`.
    pub jwt: JwtConfig,
}

/// [`GatewayAuthConfig`] as written, before its check.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct RawGatewayAuth {
    mode: GatewayAuthMode,
    jwt: JwtConfig,
}

impl TryFrom<RawGatewayAuth> for GatewayAuthConfig {
    type Error = String;

    fn try_from(raw: RawGatewayAuth) -> Result<Self, String> {
        if raw.mode == GatewayAuthMode::Jwt {
            let Some(url) = raw.jwt.discovery_url.as_deref() else {
                return Err("gateway.auth.jwt.discoveryUrl is required with mode jwt".into());
            };
            oka_gateway::oidc::check_discovery_url(url)
                .map_err(|e| format!("gateway.auth.jwt.discoveryUrl: {e}"))?;
            if raw.jwt.ca_file.is_none() {
                return Err("gateway.auth.jwt.caFile is required with mode jwt".into());
            }
        }
        Ok(GatewayAuthConfig { mode: raw.mode, jwt: raw.jwt })
    }
}

/// `gateway.auth.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GatewayAuthMode {
    /// Only oka's own traffic tokens are checked.
    #[default]
    None,
    /// `x-access-token` must be the sandbox's agent runtime token (401 otherwise).
    AccessToken,
    /// Traffic JWTs verified against an OIDC provider's keys.
    Jwt,
}

impl From<GatewayAuthMode> for oka_gateway::AuthMode {
    fn from(mode: GatewayAuthMode) -> Self {
        match mode {
            GatewayAuthMode::None => oka_gateway::AuthMode::None,
            GatewayAuthMode::AccessToken => oka_gateway::AuthMode::AccessToken,
            GatewayAuthMode::Jwt => oka_gateway::AuthMode::Jwt,
        }
    }
}

/// `gateway.auth.jwt`: the identity provider whose keys sign traffic JWTs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct JwtConfig {
    /// The OIDC discovery document (`https` only).
    pub discovery_url: Option<String>,
    /// A PEM bundle of the CAs trusted for discovery and the key set; on a cluster, mount the
    /// reference's CA ConfigMap as this file.
    pub ca_file: Option<PathBuf>,
    /// Allowed clock difference on `exp`, `nbf` and `iat` (Go duration).
    #[serde(deserialize_with = "go_duration")]
    pub clock_skew: Duration,
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig { discovery_url: None, ca_file: None, clock_skew: Duration::from_secs(60) }
    }
}

impl JwtConfig {
    /// The loader's options (mode `jwt`, checked at load: both fields are there).
    pub fn oidc_options(&self) -> Option<oka_gateway::oidc::OidcOptions> {
        let mut options =
            oka_gateway::oidc::OidcOptions::new(self.discovery_url.clone()?, self.ca_file.clone()?);
        options.clock_skew = self.clock_skew;
        Some(options)
    }
}

/// Reads a Go duration string (`30s`, `1h30m`) into a [`Duration`].
fn go_duration<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(de)?;
    oka_api::parse_go_duration(&text).map_err(serde::de::Error::custom)
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 8081)),
            domain: None,
            idle_timeout: Duration::from_secs(900),
            wake_timeout: Duration::from_secs(60),
            auth: GatewayAuthConfig::default(),
        }
    }
}

/// Local runtime settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Run sandboxes on this machine. Needs root; without it `oka serve` runs the store and
    /// the controllers that need no runtime, and says so.
    pub enabled: bool,
    /// Provide what the optional features need when it is missing, in the background with
    /// progress in the log: CRIU >= 4.2 (hibernation, snapshots, forks), built by the
    /// embedded `scripts/install-criu.sh` on Debian when `$OKA_CRIU` names no binary, Debian's
    /// `nftables` and `iproute2` (outbound networking, egress policies), and debootstrap (with
    /// apt-get) when a default template's root must be built. `false`: only say at start which
    /// features are off and how to turn them on.
    pub auto_install: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig { enabled: true, auto_install: true }
    }
}

/// How many sandboxes of a pool `oka serve` creates may be starting at once. The local runtime
/// starts as many sandboxes at a time as there are CPUs (`LocalConfig::max_parallel_starts`), so
/// more Sandbox objects than this only wait; and writing them all at once, when a burst of
/// claims empties the pool, takes the store and the CPU from the claims (~10 % fewer claims per
/// second in the serve bench).
pub const DEFAULT_MAX_STARTING: u32 = 32;

/// The default warm pool: a SandboxTemplate and a SandboxSet of the same name.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct DefaultPoolConfig {
    /// Create the pool when it is missing.
    pub enabled: bool,
    /// Its namespace.
    pub namespace: String,
    /// The name of both the template and the set.
    pub name: String,
    /// Warm sandboxes to keep.
    pub replicas: i32,
    /// CPU limit of each sandbox (a Kubernetes quantity).
    pub cpu: String,
    /// Memory limit of each sandbox (a Kubernetes quantity).
    pub memory: String,
    /// How many of the pool's sandboxes may be starting at once, at least 1 (the SandboxSet's
    /// `scaleStrategy.maxUnavailable`; see [`DEFAULT_MAX_STARTING`]).
    pub max_starting: u32,
    /// Its sandboxes get outbound networking (the template annotation
    /// `agents.kruise.io/network: outbound`), as E2B's sandboxes have the internet unless
    /// created with `allow_internet_access: false`; `oka serve` applies it only when outbound
    /// networking is available (nftables) when it creates the pool. Never the host's listeners
    /// nor other sandboxes (the runtime's firewall). On by default, as in E2B; `false` keeps
    /// the pool's sandboxes on their own loopback. Outbound sandboxes pause, hibernate,
    /// snapshot and fork like any other (each fork with an address of its own).
    pub outbound: bool,
}

impl Default for DefaultPoolConfig {
    fn default() -> Self {
        DefaultPoolConfig {
            enabled: true,
            namespace: "default".to_owned(),
            name: "base".to_owned(),
            replicas: 2,
            cpu: "1".to_owned(),
            memory: "512Mi".to_owned(),
            max_starting: DEFAULT_MAX_STARTING,
            outbound: true,
        }
    }
}

/// The code interpreter pool: like [`DefaultPoolConfig`], with its own defaults. Its sandboxes
/// run `oka-interpreter` (E2B's code interpreter API on port 49999) on the root of the default
/// template `code-interpreter-v1`, which has the Jupyter kernels ([`crate::templates`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct CodeInterpreterPoolConfig {
    /// Create the pool when it is missing (and `oka-interpreter` is installed).
    pub enabled: bool,
    /// Its namespace.
    pub namespace: String,
    /// The name of both the template and the set.
    pub name: String,
    /// Warm sandboxes to keep.
    pub replicas: i32,
    /// CPU limit of each sandbox (a Kubernetes quantity).
    pub cpu: String,
    /// Memory limit of each sandbox (a Kubernetes quantity).
    pub memory: String,
    /// How many of the pool's sandboxes may be starting at once, at least 1 (the SandboxSet's
    /// `scaleStrategy.maxUnavailable`; see [`DEFAULT_MAX_STARTING`]).
    pub max_starting: u32,
    /// Outbound networking for its sandboxes, as [`DefaultPoolConfig::outbound`] (E2B's code
    /// interpreter sandboxes `pip install` from the internet).
    pub outbound: bool,
}

impl Default for CodeInterpreterPoolConfig {
    fn default() -> Self {
        CodeInterpreterPoolConfig {
            enabled: true,
            namespace: "default".to_owned(),
            name: "code-interpreter-v1".to_owned(),
            replicas: 1,
            cpu: "1".to_owned(),
            memory: "1Gi".to_owned(),
            max_starting: DEFAULT_MAX_STARTING,
            outbound: true,
        }
    }
}

impl CodeInterpreterPoolConfig {
    /// The same settings as a pool of [`crate::pool::ensure_pool`].
    pub fn pool(&self) -> DefaultPoolConfig {
        DefaultPoolConfig {
            enabled: self.enabled,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            replicas: self.replicas,
            cpu: self.cpu.clone(),
            memory: self.memory.clone(),
            max_starting: self.max_starting,
            outbound: self.outbound,
        }
    }
}

/// Where the default pools' template roots (`base`, `code-interpreter-v1`: [`crate::templates`])
/// are found, and built when missing.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct TemplatesConfig {
    /// The directory of the built roots; `None`: `<stateDir>/templates`. A directory shared by
    /// several installations (`/var/cache/oka/templates`) is fine: builds take a lock there.
    pub dir: Option<PathBuf>,
    /// The Debian archive to build from; `None`: the one this machine's apt sources use.
    pub mirror: Option<String>,
    /// The most one E2B SDK template build may take, its base's pull included (Go duration;
    /// default 1h).
    #[serde(deserialize_with = "go_duration")]
    pub build_time_limit: Duration,
    /// Default templates (by their name: `base`, `code-interpreter-v1`) that run on an OCI image
    /// instead of a root built here: the default SandboxTemplate names the image, which the
    /// image store pulls as for any template, and no root is built for it. Checked when the
    /// file is read: a name that is no default template, or a value that is no pullable image
    /// reference, is refused naming `templates.images.<name>`.
    #[serde(deserialize_with = "template_images")]
    pub images: std::collections::BTreeMap<String, String>,
    /// Secrets (type `kubernetes.io/dockerconfigjson`, in each default pool's namespace) the
    /// default templates on an image pull with: their pod templates' `imagePullSecrets`.
    #[serde(deserialize_with = "secret_names")]
    pub image_pull_secrets: Vec<String>,
}

impl Default for TemplatesConfig {
    fn default() -> Self {
        Self {
            dir: None,
            mirror: None,
            build_time_limit: Duration::from_secs(3600),
            images: std::collections::BTreeMap::new(),
            image_pull_secrets: Vec::new(),
        }
    }
}

impl TemplatesConfig {
    /// The directory of the built roots for state directory `state_dir`.
    pub fn dir(&self, state_dir: &Path) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| state_dir.join("templates"))
    }

    /// The OCI image the default template `name` runs on, when `templates.images` names one.
    pub fn image(&self, name: &str) -> Option<&str> {
        self.images.get(name).map(String::as_str)
    }
}

/// `templates.images`: each key a default template, each value an image reference a registry
/// can serve ([`check_template_image`]).
fn template_images<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    let map = std::collections::BTreeMap::<String, String>::deserialize(de)?;
    for (name, reference) in &map {
        check_template_image(name, reference).map_err(serde::de::Error::custom)?;
    }
    Ok(map)
}

/// `templates.imagePullSecrets`: each a Secret's name (a lowercase RFC 1123 subdomain), so the
/// default templates naming them are valid.
fn secret_names<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Vec<String>, D::Error> {
    let names = Vec::<String>::deserialize(de)?;
    let label = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    for name in &names {
        if name.len() > 253 || !name.split('.').all(label) {
            return Err(serde::de::Error::custom(format!(
                "templates.imagePullSecrets: {name:?} is not a Secret's name: lowercase letters, \
                 digits, '-' and '.', starting and ending with a letter or digit"
            )));
        }
    }
    Ok(names)
}

/// Why `templates.images.<name>: <reference>` cannot work, if it cannot: `name` must be a
/// default template, and `reference` an image reference of a registry (a directory is a root,
/// not an image; `oka.local` images exist only in the store that built them).
pub fn check_template_image(name: &str, reference: &str) -> Result<(), String> {
    use crate::templates::definition;
    if definition::find(name).is_none() {
        let names: Vec<&str> = definition::ALL.iter().map(|d| d.name).collect();
        return Err(format!(
            "templates.images.{name}: {name:?} is not a default template; there are: {}",
            names.join(", ")
        ));
    }
    if reference.starts_with('/') {
        return Err(format!(
            "templates.images.{name}: {reference:?} is a directory, not an image reference: name \
             an image in a registry (registry.example.com/oka/{name}:1)"
        ));
    }
    let parsed = oka_image::Reference::parse(reference).map_err(|e| {
        format!(
            "templates.images.{name}: {reference:?} is not an image reference ({e}): use \
             registry/repository:tag or registry/repository@sha256:digest"
        )
    })?;
    if parsed.registry == oka_image::LOCAL_REGISTRY {
        return Err(format!(
            "templates.images.{name}: {reference:?} is an image built on one machine \
             ({}), which no registry serves: push it to a registry and name that",
            oka_image::LOCAL_REGISTRY
        ));
    }
    Ok(())
}

/// Logging settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct LogConfig {
    /// Human-readable lines or one JSON object per line.
    pub format: LogFormat,
    /// A `tracing` filter directive; `RUST_LOG` overrides it.
    pub filter: String,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Embedded store settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct StoreConfig {
    /// How many recent changes are kept in memory for watches to resume from; a watch that
    /// falls further behind is told to relist.
    pub watch_history: usize,
}

/// Controller settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ControllersConfig {
    /// Concurrent reconciles of SandboxClaims.
    pub sandbox_claim_workers: usize,
    /// Concurrent reconciles of Sandboxes.
    pub sandbox_workers: usize,
    /// Concurrent reconciles of SandboxSets.
    pub sandbox_set_workers: usize,
    /// Concurrent reconciles of PoolAutoscalers.
    pub pool_autoscaler_workers: usize,
    /// The PoolAutoscaler controller's settings.
    pub pool_autoscaler: PoolAutoscalerConfig,
    /// The most pauses and resumes an AutoPausePolicy makes of one sandbox in an hour (the
    /// proposal's `--auto-pause-max-actions-per-hour`); 0: no limit.
    pub auto_pause_max_actions_per_hour: u32,
}

/// The PoolAutoscaler controller's settings (the proposal's controller flags).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct PoolAutoscalerConfig {
    /// How often a capacity policy samples its pool; clamped to 5 s..=30 s.
    #[serde(deserialize_with = "go_duration")]
    pub sampling_interval: Duration,
    /// How far back samples are averaged; clamped to 30 s..=5 min and to at least the
    /// sampling interval.
    #[serde(deserialize_with = "go_duration")]
    pub observation_window: Duration,
    /// The tolerance of a capacity policy that sets none: a count or a percentage.
    pub default_tolerance: String,
    /// How long a scale-up's sandboxes are kept from counting as demand, at most.
    #[serde(deserialize_with = "go_duration")]
    pub scale_up_settle_timeout: Duration,
}

impl Default for PoolAutoscalerConfig {
    fn default() -> Self {
        PoolAutoscalerConfig {
            sampling_interval: Duration::from_secs(15),
            observation_window: Duration::from_secs(60),
            default_tolerance: oka_api::poolautoscaler::DEFAULT_TOLERANCE.to_owned(),
            scale_up_settle_timeout: Duration::from_secs(300),
        }
    }
}

impl PoolAutoscalerConfig {
    /// The controller's settings, with the intervals clamped to their allowed ranges and the
    /// zone of cron policies that name none the process's (`TZ`, else `/etc/localtime`).
    pub fn settings(&self) -> oka_controller::poolautoscaler::Settings {
        oka_controller::poolautoscaler::Settings::from_flags(
            self.sampling_interval,
            self.observation_window,
            &self.default_tolerance,
            self.scale_up_settle_timeout,
        )
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: default_state_dir(),
            log: LogConfig::default(),
            store: StoreConfig::default(),
            controllers: ControllersConfig::default(),
            runtime: RuntimeConfig::default(),
            api: ApiConfig::default(),
            gateway: GatewayConfig::default(),
            kube_api: KubeApiConfig::default(),
            default_pool: DefaultPoolConfig::default(),
            code_interpreter_pool: CodeInterpreterPoolConfig::default(),
            templates: TemplatesConfig::default(),
            tracing: TracingConfig::default(),
            images: ImagesConfig::default(),
            metrics: MetricsConfig::default(),
            quota: QuotaConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { format: LogFormat::Text, filter: "info".to_owned() }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { watch_history: 10_000 }
    }
}

impl Default for ControllersConfig {
    fn default() -> Self {
        ControllersConfig {
            sandbox_claim_workers: 4,
            sandbox_workers: 8,
            sandbox_set_workers: 2,
            pool_autoscaler_workers: 5,
            pool_autoscaler: PoolAutoscalerConfig::default(),
            auto_pause_max_actions_per_hour:
                oka_controller::sandbox::DEFAULT_AUTO_PAUSE_MAX_ACTIONS_PER_HOUR,
        }
    }
}

/// `/var/lib/oka` for root; otherwise `$XDG_STATE_HOME/oka`, else `~/.local/state/oka`.
fn default_state_dir() -> PathBuf {
    let is_root = std::env::var_os("USER").is_some_and(|u| u == "root")
        || std::env::var_os("HOME").is_some_and(|h| h == "/root");
    if is_root {
        return PathBuf::from("/var/lib/oka");
    }
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(dir).join("oka");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/state/oka"),
        None => PathBuf::from("/var/lib/oka"),
    }
}

/// Where OCI images are kept and how they are pulled and collected.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ImagesConfig {
    /// The image store's directory; `None`: `<stateDir>/images`.
    pub dir: Option<PathBuf>,
    /// Registries (`host[:port]`) spoken to over plain HTTP; loopback ones always are.
    #[serde(deserialize_with = "registries")]
    pub insecure_registries: Vec<String>,
    /// Registry → mirror base URL (`http://` or `https://`), tried before the registry.
    #[serde(deserialize_with = "mirrors")]
    pub mirrors: std::collections::BTreeMap<String, String>,
    /// Garbage collection of unused images.
    pub gc: ImageGcConfig,
}

impl ImagesConfig {
    /// The store's directory for state directory `state_dir`.
    pub fn dir(&self, state_dir: &Path) -> PathBuf {
        self.dir.clone().unwrap_or_else(|| state_dir.join("images"))
    }
}

/// The image garbage collection policy.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ImageGcConfig {
    /// The size (bytes of unpacked layers) the store is brought under; a Kubernetes quantity
    /// (`20Gi`).
    #[serde(deserialize_with = "byte_quantity")]
    pub budget: u64,
    /// An image used more recently than this is never removed.
    #[serde(deserialize_with = "min_age")]
    pub min_age: Duration,
    /// An image unused for this long is removed whatever the store's size; `None`: never.
    #[serde(deserialize_with = "optional_go_duration")]
    pub max_unused_age: Option<Duration>,
    /// How often the collection runs (at least 1s).
    #[serde(deserialize_with = "positive_go_duration")]
    pub period: Duration,
}

impl Default for ImageGcConfig {
    fn default() -> Self {
        ImageGcConfig {
            budget: 20 << 30,
            min_age: Duration::from_secs(120),
            max_unused_age: None,
            period: Duration::from_secs(300),
        }
    }
}

fn byte_quantity<'de, D: serde::Deserializer<'de>>(de: D) -> Result<u64, D::Error> {
    let text = match serde_yaml::Value::deserialize(de)? {
        serde_yaml::Value::String(s) => s,
        serde_yaml::Value::Number(n) => n.to_string(),
        other => {
            return Err(serde::de::Error::custom(format!(
                "budget {other:?} is not a size: use a quantity such as 20Gi"
            )));
        }
    };
    let invalid = |reason: &str| {
        serde::de::Error::custom(format!(
            "budget {text:?} is not a size ({reason}): use a quantity such as 20Gi"
        ))
    };
    let amount = oka_api::quantity::parse(&text).map_err(|e| invalid(e.reason()))?;
    amount.scaled(1, 1, oka_api::quantity::Rounding::Up).map_err(|e| invalid(e.reason()))
}

fn optional_go_duration<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<Option<Duration>, D::Error> {
    match Option::<String>::deserialize(de)? {
        None => Ok(None),
        Some(text) => oka_api::parse_go_duration(&text)
            .map(Some)
            .map_err(|e| serde::de::Error::custom(format!("maxUnusedAge: {e}"))),
    }
}

fn min_age<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(de)?;
    oka_api::parse_go_duration(&text).map_err(|e| serde::de::Error::custom(format!("minAge: {e}")))
}

fn positive_go_duration<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
    let duration = go_duration(de)?;
    if duration < Duration::from_secs(1) {
        return Err(serde::de::Error::custom(format!(
            "period {duration:?} is too short: use at least 1s"
        )));
    }
    Ok(duration)
}

fn registries<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Vec<String>, D::Error> {
    let list = Vec::<String>::deserialize(de)?;
    for registry in &list {
        if registry.is_empty() || registry.contains("://") || registry.contains('/') {
            return Err(serde::de::Error::custom(format!(
                "insecureRegistries: {registry:?} is not a registry: use host or host:port, \
                 without a scheme or path"
            )));
        }
    }
    Ok(list)
}

fn mirrors<'de, D: serde::Deserializer<'de>>(
    de: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    let map = std::collections::BTreeMap::<String, String>::deserialize(de)?;
    for (registry, url) in &map {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(serde::de::Error::custom(format!(
                "mirrors: the mirror of {registry:?} is {url:?}: use an http:// or https:// URL"
            )));
        }
    }
    Ok(map)
}

/// Why a configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}", path = .0.display(), source = .1)]
    Read(PathBuf, #[source] std::io::Error),
    /// The file is not valid configuration.
    #[error("invalid config file {path}: {source}", path = .0.display(), source = .1)]
    Parse(PathBuf, #[source] serde_yaml::Error),
}

impl Config {
    /// Reads the configuration from `path`, or the defaults when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_owned(), e))?;
        Config::parse(&text).map_err(|e| ConfigError::Parse(path.to_owned(), e))
    }

    /// Parses a configuration document; an empty document gives the defaults.
    pub fn parse(text: &str) -> Result<Config, serde_yaml::Error> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        serde_yaml::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_autoscaler_intervals_are_clamped_to_their_ranges() {
        let config = Config::parse(
            "controllers:\n  poolAutoscaler:\n    samplingInterval: 1s\n    observationWindow: 10m\n    defaultTolerance: \"2\"\n",
        )
        .unwrap();
        let settings = config.controllers.pool_autoscaler.settings();
        assert_eq!(settings.sampling_interval, Duration::from_secs(5));
        assert_eq!(settings.observation_window, Duration::from_secs(300));
        assert_eq!(format!("{:?}", settings.default_tolerance), "Int(2)");
        let defaults = PoolAutoscalerConfig::default().settings();
        assert_eq!(defaults.sampling_interval, Duration::from_secs(15));
        assert_eq!(defaults.observation_window, Duration::from_secs(60));
    }

    #[test]
    fn the_cluster_runtime_settings_parse_and_default_to_pods() {
        use oka_api::runtime_choice::SandboxRuntime;
        let defaults = Config::default().cluster;
        assert_eq!(defaults.default_runtime, SandboxRuntime::Pod);
        assert_eq!(defaults.pods.envd_image, format!("oka-envd:{}", env!("CARGO_PKG_VERSION")));
        let config = Config::parse(
            "cluster:\n  defaultRuntime: node\n  pods:\n    envdImage: registry.example/oka-envd:1\n",
        )
        .unwrap();
        assert_eq!(config.cluster.default_runtime, SandboxRuntime::Node);
        assert_eq!(config.cluster.pods.envd_image, "registry.example/oka-envd:1");
        let err = Config::parse("cluster:\n  defaultRuntime: vm\n").unwrap_err().to_string();
        assert!(err.contains("use pod or node"), "{err}");
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        assert_eq!(Config::parse("# nothing\n").unwrap(), Config::default());
    }

    #[test]
    fn documented_example_parses() {
        let doc = include_str!("config.rs")
            .lines()
            .skip_while(|l| !l.starts_with("//! ```yaml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| l.trim_start_matches("//!").strip_prefix(' ').unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let config = Config::parse(&doc).unwrap();
        assert_eq!(config.state_dir, PathBuf::from("/var/lib/oka"));
        assert_eq!(config.log.format, LogFormat::Text);
        assert_eq!(config.store.watch_history, 10_000);
        assert_eq!(config.controllers, ControllersConfig::default());
        assert_eq!(config.runtime, RuntimeConfig::default());
        assert_eq!(config.api, ApiConfig::default());
        assert_eq!(config.gateway, GatewayConfig::default());
        assert_eq!(config.default_pool, DefaultPoolConfig::default());
        assert_eq!(config.code_interpreter_pool, CodeInterpreterPoolConfig::default());
        assert_eq!(config.cluster.webhook, WebhookConfig::default());
    }

    #[test]
    fn a_partial_code_interpreter_pool_keeps_its_own_defaults() {
        let config = Config::parse("codeInterpreterPool:\n  replicas: 3\n").unwrap();
        assert_eq!(config.code_interpreter_pool.replicas, 3);
        assert_eq!(config.code_interpreter_pool.name, "code-interpreter-v1");
        assert_eq!(config.default_pool, DefaultPoolConfig::default());
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let config = Config::parse("log:\n  format: json\n").unwrap();
        assert_eq!(config.log.format, LogFormat::Json);
        assert_eq!(config.log.filter, "info");
        assert_eq!(config.store, StoreConfig::default());
    }

    #[test]
    fn the_gateway_auth_mode_is_checked_when_read() {
        assert_eq!(Config::default().gateway.auth.mode, GatewayAuthMode::None);
        let config = Config::parse("gateway:\n  auth:\n    mode: accessToken\n").unwrap();
        assert_eq!(config.gateway.auth.mode, GatewayAuthMode::AccessToken);
        let config = Config::parse(
            "gateway:\n  auth:\n    mode: jwt\n    jwt:\n      discoveryUrl: https://idp.example/.well-known/openid-configuration\n      caFile: /etc/oka/idp-ca.crt\n      clockSkew: 30s\n",
        )
        .unwrap();
        let options = config.gateway.auth.jwt.oidc_options().unwrap();
        assert_eq!(options.ca_file, PathBuf::from("/etc/oka/idp-ca.crt"));
        assert_eq!(options.clock_skew, Duration::from_secs(30));
        for (doc, want) in [
            ("gateway:\n  auth:\n    mode: jwt\n", "gateway.auth.jwt.discoveryUrl is required"),
            (
                "gateway:\n  auth:\n    mode: jwt\n    jwt:\n      discoveryUrl: http://idp/x\n      caFile: /ca\n",
                "gateway.auth.jwt.discoveryUrl: the discovery URL must be an absolute HTTPS URL",
            ),
            (
                "gateway:\n  auth:\n    mode: jwt\n    jwt:\n      discoveryUrl: https://idp/x\n",
                "gateway.auth.jwt.caFile is required",
            ),
            ("gateway:\n  auth:\n    mode: uuid\n", "unknown variant `uuid`"),
            ("gateway:\n  auth:\n    jwt:\n      clockSkew: soon\n", "soon"),
            ("api:\n  trafficAccessTokenValidity: 1m\n", "between 5m and 876000h"),
        ] {
            let err = Config::parse(doc).unwrap_err().to_string();
            assert!(err.contains(want), "{doc}: {err}");
        }
        let config = Config::parse("api:\n  trafficAccessTokenValidity: 1h\n").unwrap();
        assert_eq!(config.api.traffic_access_token_validity, Duration::from_secs(3600));
    }

    #[test]
    fn gateway_durations_are_go_durations() {
        let config = Config::parse("gateway:\n  wakeTimeout: 1m30s\n").unwrap();
        assert_eq!(config.gateway.wake_timeout, Duration::from_secs(90));
        let err = Config::parse("gateway:\n  idleTimeout: soon\n").unwrap_err().to_string();
        assert!(err.contains("soon"), "{err}");
    }

    #[test]
    fn images_settings_parse_and_errors_name_the_key() {
        let defaults = Config::default().images;
        assert_eq!(defaults.dir(Path::new("/var/lib/oka")), PathBuf::from("/var/lib/oka/images"));
        assert_eq!(defaults.gc.budget, 20 << 30);
        let config = Config::parse(
            "images:\n  dir: /srv/images\n  insecureRegistries: [registry.lan:5000]\n  mirrors:\n    docker.io: http://127.0.0.1:5000\n  gc:\n    budget: 512Mi\n    minAge: 10s\n    maxUnusedAge: 24h\n    period: 1m\n",
        )
        .unwrap();
        assert_eq!(config.images.dir(Path::new("/x")), PathBuf::from("/srv/images"));
        assert_eq!(config.images.insecure_registries, ["registry.lan:5000"]);
        assert_eq!(config.images.mirrors["docker.io"], "http://127.0.0.1:5000");
        assert_eq!(config.images.gc.budget, 512 << 20);
        assert_eq!(config.images.gc.max_unused_age, Some(Duration::from_secs(86_400)));
        assert_eq!(config.images.gc.period, Duration::from_secs(60));
        for (doc, want) in [
            ("images:\n  gc:\n    budget: lots\n", ["images.gc", "budget", "lots"]),
            ("images:\n  gc:\n    period: 0s\n", ["images.gc", "period", "at least 1s"]),
            ("images:\n  gc:\n    minAge: soon\n", ["images.gc", "minAge", "soon"]),
            ("images:\n  gc:\n    maxUnusedAge: x\n", ["images.gc", "maxUnusedAge", "x"]),
            (
                "images:\n  insecureRegistries: [\"http://x\"]\n",
                ["images", "insecureRegistries", "http://x"],
            ),
            (
                "images:\n  mirrors:\n    docker.io: 127.0.0.1:5000\n",
                ["images", "mirrors", "http://"],
            ),
            ("images:\n  pullTimeout: 1m\n", ["images", "pullTimeout", "unknown field"]),
        ] {
            let err = Config::parse(doc).unwrap_err().to_string();
            assert!(want.iter().all(|w| err.contains(w)), "{doc}: {err}");
        }
    }

    #[test]
    fn template_images_parse_and_what_cannot_work_is_refused_naming_the_setting() {
        assert!(Config::default().templates.images.is_empty());
        let config = Config::parse(
            "templates:\n  images:\n    base: 127.0.0.1:5000/oka/base:1\n    code-interpreter-v1: registry.example.com/oka/ci@sha256:0123456789012345678901234567890123456789012345678901234567890123\n  imagePullSecrets: [registry-login]\n",
        )
        .unwrap();
        assert_eq!(config.templates.image("base"), Some("127.0.0.1:5000/oka/base:1"));
        assert!(config.templates.image("code-interpreter-v1").unwrap().contains("@sha256:"));
        assert_eq!(config.templates.image_pull_secrets, ["registry-login"]);
        for (doc, want) in [
            (
                "templates:\n  images:\n    my-app: registry/x:1\n",
                ["templates.images.my-app", "not a default template", "base, code-interpreter-v1"],
            ),
            (
                "templates:\n  images:\n    base: /srv/roots/base\n",
                ["templates.images.base", "/srv/roots/base", "is a directory"],
            ),
            (
                "templates:\n  images:\n    base: Registry/Oka/Base:1\n",
                ["templates.images.base", "Registry/Oka/Base:1", "not an image reference"],
            ),
            (
                "templates:\n  images:\n    base: \"\"\n",
                ["templates.images.base", "not an image reference", "registry/repository"],
            ),
            (
                "templates:\n  images:\n    base: oka.local/default/base:abc\n",
                ["templates.images.base", "oka.local", "push it to a registry"],
            ),
            (
                "templates:\n  imagePullSecrets: [Registry_Login]\n",
                ["templates.imagePullSecrets", "Registry_Login", "not a Secret's name"],
            ),
        ] {
            let err = Config::parse(doc).unwrap_err().to_string();
            assert!(want.iter().all(|w| err.contains(w)), "{doc}: {err}");
        }
    }

    #[test]
    fn unknown_fields_are_refused_with_their_name() {
        let err = Config::parse("stateDirectory: /x\n").unwrap_err().to_string();
        assert!(err.contains("stateDirectory"), "{err}");
    }
}
