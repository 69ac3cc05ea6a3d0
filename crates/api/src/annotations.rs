//! Well-known annotation keys (and a few of their values), exactly as the reference writes them,
//! plus the oka extensions (marked).

/// Claim / scale-down lock (a UUID); non-empty means the sandbox is not claimable.
pub const LOCK: &str = "agents.kruise.io/lock";
/// Who claimed (claim UID or API-key user), or [`OWNER_MANAGER_SCALE_DOWN`] while a pool deletes.
pub const OWNER: &str = "agents.kruise.io/owner";
/// The [`OWNER`] a SandboxSet writes before deleting a member on scale-down.
pub const OWNER_MANAGER_SCALE_DOWN: &str = "__manager_scale_down";
/// RFC 3339 claim time.
pub const CLAIM_TIMESTAMP: &str = "agents.kruise.io/claim-timestamp";
/// The clone source (sandbox-manager).
pub const RESTORE_FROM: &str = "agents.kruise.io/restore-from";
/// JSON `{envVars, accessToken, skipRefresh}` replayed to the runtime's `/init` on re-init.
pub const INIT_RUNTIME_REQUEST: &str = "agents.kruise.io/init-runtime-request";
/// On Checkpoints and TrafficPolicies: the referenced sandbox's ID.
pub const SANDBOX_ID: &str = "agents.kruise.io/sandbox-id";
/// Memberlist peers (proxy).
pub const MEMBERLIST_URL: &str = "agents.kruise.io/memberlist-url";
/// `"true"`: the sandbox supports reuse (return to its pool). Preserved on pool creation.
pub const CLEANUP_ENABLED: &str = "agents.kruise.io/cleanup-enabled";
/// `"true"`: return the sandbox to its pool now (needs [`CLEANUP_ENABLED`]).
pub const CLEANUP: &str = "agents.kruise.io/cleanup";
/// Go duration: keep a sandbox whose reuse failed for this long (via `shutdownTime`). Preserved on
/// pool creation.
pub const CLEANUP_RETAIN_ON_FAILURE: &str = "agents.kruise.io/cleanup-retain-on-failure";
/// oka extension: accepted alias of [`CLEANUP_ENABLED`] (the reuse spec's name).
pub const REUSE_ENABLED: &str = "agents.kruise.io/reuse-enabled";
/// oka extension: accepted alias of [`CLEANUP`] (the reuse spec's name).
pub const REUSE: &str = "agents.kruise.io/reuse";
/// JSON `{"labels":[keys],"annotations":[keys]}` of metadata a claim added; removed on reuse.
pub const UPDATED_METADATA_IN_CLAIM: &str = "agents.kruise.io/updated-metadata-in-claim";
/// Agent runtime base URL override (default `http://<podIP>:49983`).
pub const RUNTIME_URL: &str = "agents.kruise.io/runtime-url";
/// Legacy name of [`RUNTIME_URL`].
pub const ENVD_URL: &str = "e2b.agents.kruise.io/envd-url";
/// oka extension: RFC 3339 time of a restart asked for (`okactl restart sandbox`): the sandbox
/// controller ends the sandbox's processes and starts its command again, on the same files,
/// once per new value. oka's way of the reference's ContainerRecreateRequest.
pub const RESTART_REQUESTED_AT: &str = "agents.kruise.io/restart-requested-at";
/// oka extension: the [`RESTART_REQUESTED_AT`] value the sandbox controller last acted on.
pub const RESTARTED_AT: &str = "agents.kruise.io/restarted-at";
/// Agent runtime access token.
pub const RUNTIME_ACCESS_TOKEN: &str = "agents.kruise.io/runtime-access-token";
/// Legacy name of [`RUNTIME_ACCESS_TOKEN`].
pub const ENVD_ACCESS_TOKEN: &str = "e2b.agents.kruise.io/envd-access-token";
/// Write-once stamp [`RUNTIME_TLS_PORT_VALUE`]: the runtime speaks HTTPS on that port.
pub const RUNTIME_TLS_PORT: &str = "agents.kruise.io/runtime-tls-port";
/// The value of [`RUNTIME_TLS_PORT`].
pub const RUNTIME_TLS_PORT_VALUE: &str = "49984";
/// Paused retention: a Go duration or [`RESERVE_FOREVER`].
pub const RESERVE_PAUSED_SANDBOX_DURATION: &str =
    "agents.kruise.io/reserve-paused-sandbox-duration";
/// [`RESERVE_PAUSED_SANDBOX_DURATION`] value meaning 100 years.
pub const RESERVE_FOREVER: &str = "forever";
/// `"true"` on a stale auto-materialised SandboxTemplate.
pub const CLEANUP_CANDIDATE: &str = "agents.kruise.io/cleanup-candidate";
/// Integer priority; > 0 is high priority (the manager sets `"100"`).
pub const SANDBOX_PRIORITY: &str = "agents.kruise.io/sandbox-priority";
/// Set once: hash of the template without labels, annotations, images and resources.
pub const HASH_IMMUTABLE_PART: &str = "sandbox.agents.kruise.io/hash-immutable-part";
/// Deprecated, unused.
pub const HASH_WITHOUT_IMAGE_RESOURCES: &str =
    "sandbox.agents.kruise.io/hash-without-image-resources";
/// JSON `[]CsiMountConfig` re-mounted after resume and upgrade.
pub const CSI_VOLUME_CONFIG: &str = "e2b.agents.kruise.io/csi-volume-config";
/// `"true"`: SandboxUpdateOps phase-1 trigger for a paused sandbox.
pub const UPGRADE_RESUME_TRIGGER: &str = "agents.kruise.io/upgrade-resume-trigger";
/// W3C `traceparent` of the request that caused the change.
pub const TRACE_CONTEXT: &str = "agents.kruise.io/trace-context";
/// On pods: JSON state of an in-place update.
pub const INPLACE_UPDATE_STATE: &str = "agents.kruise.io/inplace-update-state";
/// Created-by marker (also a label); see [`crate::labels::CREATED_BY`].
pub const CREATED_BY: &str = "agents.kruise.io/created-by";
/// JSON `{accessTokenExpiration: RFC3339}`.
pub const TOKEN_STATUS: &str = "security.agents.kruise.io/token-status";
/// Presence opts in to ID-token issuance.
pub const AGENT_NAME: &str = "security.agents.kruise.io/agent-name";
/// Exactly `"true"` enables the traffic access token.
pub const ENABLE_JWT_AUTH: &str = "security.agents.kruise.io/enable-jwt-auth";
/// Traffic-proxy probe rewrite.
pub const HEALTH_PROBE_REWRITE: &str = "networking.agents.kruise.io/health-probe-rewrite";
/// Traffic-proxy sidecar marker.
pub const SIDECAR_PROXY: &str = "networking.agents.kruise.io/sidecar-proxy";
/// oka extension: who paused the sandbox; [`PAUSED_BY_AUTO_PAUSE_POLICY`] when the auto-pause
/// policy did.
pub const PAUSED_BY: &str = "agents.kruise.io/paused-by";
/// The [`PAUSED_BY`] value written by the auto-pause policy.
pub const PAUSED_BY_AUTO_PAUSE_POLICY: &str = "auto-pause-policy";
/// The [`PAUSED_BY`] value written by the E2B pause API (an explicit pause: the gateway wakes
/// it only when the sandbox's `auto-resume` says so, and the auto-pause policy does not own it).
pub const PAUSED_BY_API: &str = "api";
/// oka extension: RFC 3339 (UTC, seconds) time of the last request routed to the sandbox.
pub const LAST_ACTIVITY_TIME: &str = "agents.kruise.io/last-activity-time";
/// oka extension: `"true"` or `"false"`: whether a request through the gateway to this paused
/// sandbox resumes it (E2B's `autoResume: {enabled}` at create, recorded by the manager).
/// Absent: only sandboxes the timer or the auto-pause policy paused are resumed (see
/// `oka-gateway`'s `wake` module).
pub const AUTO_RESUME: &str = "agents.kruise.io/auto-resume";
/// oka extension: `"filesystem"` when the sandbox's timeout pause keeps only its files (E2B's
/// `autoPauseMemory: false`: the processes end and start again at the resume, the pause strategy
/// `Stop`); absent or `"full"`: the pause keeps the memory. An explicit pause may ask for the
/// other kind; the resume after it restores the pause strategy this records.
pub const AUTO_PAUSE_MEMORY: &str = "agents.kruise.io/auto-pause-memory";
/// oka extension, on a Checkpoint: the name E2B's `create_snapshot(name=...)` gave the snapshot;
/// the API lists it in `names` and a create may name the snapshot by it.
pub const SNAPSHOT_NAME: &str = "agents.kruise.io/snapshot-name";
/// oka extension: the E2B metadata whose keys are not Kubernetes qualified names (`"user id"`,
/// `a:b`, longer than 63 characters), as one JSON object; the API shows its entries as metadata
/// like any other (E2B accepts any key, annotations do not).
pub const E2B_METADATA: &str = "agents.kruise.io/e2b-metadata";
/// oka extension: lowercase hex SHA-256 of the sandbox's traffic access token. The gateway
/// checks the `e2b-traffic-access-token` header against it on sandboxes with
/// [`ENABLE_JWT_AUTH`] `"true"` (E2B's `network.allowPublicTraffic: false`); the token itself
/// is only in the create response, as in the reference.
pub const TRAFFIC_ACCESS_TOKEN_SHA256: &str =
    "security.agents.kruise.io/traffic-access-token-sha256";
/// oka extension: RFC 3339 time after which the token of [`TRAFFIC_ACCESS_TOKEN_SHA256`] no
/// longer passes the gateway (written by the refresh route,
/// `POST /sandboxes/{id}/traffic-access-token`); absent, it does not expire.
pub const TRAFFIC_ACCESS_TOKEN_EXPIRATION: &str =
    "security.agents.kruise.io/traffic-access-token-expiration";
/// oka extension, on a pod template's metadata: the sandbox's network, [`NETWORK_LOOPBACK`]
/// (the default when absent: only its own loopback) or [`NETWORK_OUTBOUND`] (a veth pair and NAT
/// to the host's networks). Claims cannot set it (its prefix is reserved).
pub const NETWORK: &str = "agents.kruise.io/network";
/// [`NETWORK`] value: loopback only.
pub const NETWORK_LOOPBACK: &str = "loopback";
/// [`NETWORK`] value: outbound access through a veth pair and NAT.
pub const NETWORK_OUTBOUND: &str = "outbound";
/// oka extension, on a pod template's metadata: [`USER_NAMESPACE_HOST`] (the default when absent:
/// sandbox root is host root with a reduced capability set) or [`USER_NAMESPACE_REMAPPED`]
/// (a user namespace of its own: sandbox root is an unprivileged host id). Claims cannot set it.
pub const USER_NAMESPACE: &str = "agents.kruise.io/user-namespace";
/// [`USER_NAMESPACE`] value: no user namespace.
pub const USER_NAMESPACE_HOST: &str = "host";
/// [`USER_NAMESPACE`] value: a user namespace with root mapped to an unprivileged host range.
pub const USER_NAMESPACE_REMAPPED: &str = "remapped";

/// oka extension, on a Sandbox (or its pod template's metadata): which runtime runs it on a
/// cluster, [`RUNTIME_POD`] or [`RUNTIME_NODE`]; the rule is [`crate::runtime_choice`].
pub const RUNTIME: &str = "agents.kruise.io/runtime";
/// [`RUNTIME`] value: an ordinary Pod (the kubelet, the cluster's scheduler).
pub const RUNTIME_POD: &str = "pod";
/// [`RUNTIME`] value: oka's node agent (`oka node`).
pub const RUNTIME_NODE: &str = "node";
/// The pod template `runtimeClassName` that means oka's node agent (it is never passed to a
/// Pod).
pub const NODE_RUNTIME_CLASS: &str = "oka-node";

/// Prefixes stripped when claim annotations are copied to the pod template.
pub const RESERVED_PREFIXES: &[&str] = &["agents.kruise.io/", "e2b.agents.kruise.io/"];

/// The `agents.kruise.io/*` keys a SandboxSet keeps when copying template metadata onto a new
/// sandbox (every other `agents.kruise.io/*` key is dropped).
pub const PRESERVED_ON_CREATION: &[&str] = &[CLEANUP_ENABLED, CLEANUP_RETAIN_ON_FAILURE];

/// Annotations removed when a sandbox is returned to its pool (plus the user keys listed in
/// [`UPDATED_METADATA_IN_CLAIM`]): the reference's list, plus oka's [`REUSE`] alias.
pub const CLEARED_ON_RECYCLE: &[&str] = &[
    CLAIM_TIMESTAMP,
    LOCK,
    OWNER,
    INIT_RUNTIME_REQUEST,
    RUNTIME_ACCESS_TOKEN,
    CLEANUP,
    CLEANUP_RETAIN_ON_FAILURE,
    CSI_VOLUME_CONFIG,
    SANDBOX_PRIORITY,
    ENVD_ACCESS_TOKEN,
    ENVD_URL,
    RUNTIME_URL,
    TOKEN_STATUS,
    UPDATED_METADATA_IN_CLAIM,
    // oka: the alias trigger, so it cannot fire again on the returned sandbox.
    REUSE,
    // oka: the claim's E2B lifecycle.
    AUTO_RESUME,
    AUTO_PAUSE_MEMORY,
    // oka: the claim's traffic token (a refresh writes these outside the claim's metadata).
    TRAFFIC_ACCESS_TOKEN_SHA256,
    TRAFFIC_ACCESS_TOKEN_EXPIRATION,
];

/// Whether `key` starts with one of [`RESERVED_PREFIXES`].
pub fn is_reserved(key: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Kubernetes' pod annotation limiting what a pod sends, bits per second as a quantity (`10M`),
/// as the CNI bandwidth plugin reads it; on a sandbox's pod template.
pub const EGRESS_BANDWIDTH: &str = "kubernetes.io/egress-bandwidth";
/// Kubernetes' pod annotation limiting what a pod receives (see [`EGRESS_BANDWIDTH`]).
pub const INGRESS_BANDWIDTH: &str = "kubernetes.io/ingress-bandwidth";
