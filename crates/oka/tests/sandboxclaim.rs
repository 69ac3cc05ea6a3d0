//! SandboxClaims against a real `oka serve` (as root: real sandboxes), driven with the real
//! kubectl: a claim takes its replicas from the stocked `base` pool through the manager's claim
//! engine, with its labels, annotations, shutdown time and env vars (read back by a command run
//! through envd in each sandbox); `createOnNoStock` makes the sandboxes a pool lacks; a field the
//! local runtime cannot honour completes the claim naming it; deleting a claim leaves its
//! sandboxes running, as the reference does; an `inplaceUpdate` changes the claimed sandboxes'
//! CPU limit live or restarts them on a new root directory; a pool's AutoPausePolicy (mode 1)
//! pauses its claimed sandbox when its probe finds it idle, and a request through the gateway
//! wakes it. scripts/test.sh installs kubectl (`$KUBECTL` names
//! another one).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::{OkaServe, kubectl, kubectl_binary, kubectl_json as json, wait_until};

const OKA: &str = env!("CARGO_BIN_EXE_oka");

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n")
}

/// Whether this machine can run these tests; under CI it must.
fn runnable(test: &str) -> bool {
    let kubectl = Command::new(kubectl_binary())
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if is_root() && kubectl {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{test}: CI runs as root with kubectl");
    eprintln!("SKIPPED {test}: needs root (real sandboxes) and kubectl");
    false
}

/// `oka serve` with the `base` pool of `replicas` (no code-interpreter pool), once its
/// Kubernetes API answers and the pool has `replicas` available sandboxes.
fn serve_with_pool(replicas: usize) -> OkaServe {
    let config =
        format!("defaultPool:\n  replicas: {replicas}\ncodeInterpreterPool:\n  enabled: false\n");
    let serve = OkaServe::start(OKA, &config, &[]);
    wait_until(&serve, "the Kubernetes API", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", serve.kube)).is_ok()
            && serve.state.path().join("kubeconfig").exists()
    });
    wait_until(&serve, "the stocked pool", Duration::from_secs(120), || {
        let set = json(&serve, &["get", "sbs", "base"]);
        set["status"]["availableReplicas"].as_i64() == Some(replicas as i64)
    });
    serve
}

fn wait_completed(serve: &OkaServe, claim: &str) -> Value {
    wait_until(serve, "the claim to complete", Duration::from_secs(150), || {
        json(serve, &["get", "sbc", claim])["status"]["phase"] == "Completed"
    });
    json(serve, &["get", "sbc", claim])
}

/// The sandboxes labelled with the claim's name.
fn claimed_by(serve: &OkaServe, claim: &str) -> Vec<Value> {
    let selector = format!("agents.kruise.io/claim-name={claim}");
    json(serve, &["get", "sbx", "-l", &selector])["items"].as_array().unwrap().clone()
}

/// Runs `sh -c script` in sandbox `id` through the gateway and envd (`process.Process/Start`,
/// Connect JSON), authenticated with the sandbox's access token; the base64 stdout events.
fn run_in_sandbox(serve: &OkaServe, id: &str, token: &str, script: &str) -> String {
    let request = serde_json::json!({
        "process": {"cmd": "/bin/sh", "args": ["-c", script], "envs": {}},
        "stdin": false,
    })
    .to_string();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(request.len()).unwrap().to_be_bytes());
    body.extend_from_slice(request.as_bytes());
    let mut stream = TcpStream::connect(("127.0.0.1", serve.gateway)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: {id}\r\n\
         E2b-Sandbox-Port: 49983\r\nX-Access-Token: {token}\r\n\
         Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut raw = &response[split + 4..];
    let mut payload = Vec::new();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        loop {
            let end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap(), 16);
            let size = size.unwrap();
            if size == 0 {
                break;
            }
            payload.extend_from_slice(&raw[end + 2..end + 2 + size]);
            raw = &raw[end + 4 + size..];
        }
    } else {
        payload = raw.to_vec();
    }
    let mut stdout = String::new();
    let mut rest = payload.as_slice();
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let message: Value = serde_json::from_slice(&rest[5..5 + len]).unwrap_or_default();
        if let Some(data) = message["event"]["data"]["stdout"].as_str() {
            stdout.push_str(data);
        }
        rest = &rest[5 + len..];
    }
    stdout
}

#[test]
fn a_claim_takes_its_replicas_from_the_stocked_pool_with_its_metadata_and_env_vars() {
    if !runnable("a_claim_takes_its_replicas_from_the_stocked_pool") {
        return;
    }
    let serve = serve_with_pool(3);
    let shutdown = "2099-01-01T00:00:00Z";
    let claim = format!(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  name: team-a\n\
         spec:\n  templateName: base\n  replicas: 3\n  createOnNoStock: false\n\
         \x20 shutdownTime: \"{shutdown}\"\n  labels:\n    team: a\n  annotations:\n    note: hello\n\
         \x20 envVars:\n    CLAIM_VAR: hello-claim\n"
    );
    kubectl(&serve, &["apply", "-f", "-"], Some(&claim));
    let done = wait_completed(&serve, "team-a");

    let status = &done["status"];
    assert_eq!(status["claimedReplicas"], 3, "{status}");
    assert_eq!(status["message"], "Successfully claimed 3/3 sandboxes");
    let completed = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Completed")
        .unwrap()
        .clone();
    assert_eq!(completed["status"], "True");
    assert_eq!(completed["reason"], "AllReplicasClaimed");
    // The printer columns show what was claimed.
    let table = kubectl(&serve, &["get", "sbc", "team-a"], None);
    assert!(table.contains("Completed") && table.contains("base"), "{table}");

    let uid = done["metadata"]["uid"].as_str().unwrap().to_owned();
    let sandboxes = claimed_by(&serve, "team-a");
    assert_eq!(sandboxes.len(), 3, "{sandboxes:#?}");
    for sandbox in &sandboxes {
        let labels = &sandbox["metadata"]["labels"];
        let notes = &sandbox["metadata"]["annotations"];
        assert_eq!(labels["team"], "a");
        assert_eq!(labels["agents.kruise.io/sandbox-claimed"], "true");
        assert_eq!(labels["agents.kruise.io/sandbox-pool"], "base", "from the base pool");
        assert_eq!(notes["note"], "hello");
        assert_eq!(notes["agents.kruise.io/owner"], uid.as_str(), "owned by the claim's uid");
        assert_eq!(sandbox["spec"]["shutdownTime"], shutdown);
        assert!(sandbox["metadata"]["ownerReferences"].is_null(), "detached from the pool");
        assert!(notes.get("agents.kruise.io/sandbox-priority").is_none(), "from stock");
        // (The base pool's sandboxes reference their SandboxTemplate: no pod template of their
        // own for the claim's labels to reach.)
        // envVars reached the agent runtime: a command in the sandbox sees them.
        let id = labels["agents.kruise.io/sandbox-id"].as_str().unwrap();
        let token = notes["agents.kruise.io/runtime-access-token"].as_str().unwrap();
        let stdout = run_in_sandbox(&serve, id, token, "echo $CLAIM_VAR");
        assert_eq!(stdout, "aGVsbG8tY2xhaW0K", "stdout \"hello-claim\\n\" from {id}");
    }

    // A field the local runtime cannot honour is refused, naming it; nothing is claimed.
    let refused = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  \
                   name: volumes\nspec:\n  templateName: base\n  dynamicVolumesMount:\n  \
                   - pvName: pv\n    mountPath: /data\n";
    kubectl(&serve, &["apply", "-f", "-"], Some(refused));
    let done = wait_completed(&serve, "volumes");
    assert_eq!(done["status"]["claimedReplicas"], 0);
    let message = done["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("spec.dynamicVolumesMount is not supported"), "{message}");
    assert!(claimed_by(&serve, "volumes").is_empty());

    // Deleting the claim leaves its sandboxes claimed and running, as the reference does.
    kubectl(&serve, &["delete", "sbc", "team-a"], None);
    std::thread::sleep(Duration::from_secs(2));
    let left = claimed_by(&serve, "team-a");
    assert_eq!(left.len(), 3);
    for sandbox in &left {
        assert!(sandbox["metadata"]["deletionTimestamp"].is_null(), "{sandbox}");
        assert_eq!(sandbox["status"]["phase"], "Running");
    }
}

#[test]
fn create_on_no_stock_makes_the_sandboxes_the_pool_lacks() {
    if !runnable("create_on_no_stock_makes_the_sandboxes_the_pool_lacks") {
        return;
    }
    let serve = serve_with_pool(1);
    let claim = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  \
                 name: burst\nspec:\n  templateName: base\n  replicas: 3\n  \
                 waitReadyTimeout: 60s\n  claimTimeout: 2m\n  envVars:\n    \
                 CLAIM_VAR: hello-claim\n";
    kubectl(&serve, &["apply", "-f", "-"], Some(claim));
    let done = wait_completed(&serve, "burst");
    assert_eq!(done["status"]["claimedReplicas"], 3, "{}", done["status"]);
    assert_eq!(done["status"]["message"], "Successfully claimed 3/3 sandboxes");

    let sandboxes = claimed_by(&serve, "burst");
    assert_eq!(sandboxes.len(), 3);
    // The pool had one: the others were made for the claim (the manager marks what it creates).
    let created = sandboxes
        .iter()
        .filter(|s| s["metadata"]["annotations"]["agents.kruise.io/sandbox-priority"] == "100")
        .count();
    assert!(created >= 1, "{sandboxes:#?}");
    for sandbox in &sandboxes {
        assert_eq!(sandbox["status"]["phase"], "Running");
        let id = sandbox["metadata"]["labels"]["agents.kruise.io/sandbox-id"].as_str().unwrap();
        let notes = &sandbox["metadata"]["annotations"];
        let token = notes["agents.kruise.io/runtime-access-token"].as_str().unwrap();
        assert_eq!(run_in_sandbox(&serve, id, token, "echo $CLAIM_VAR"), "aGVsbG8tY2xhaW0K");
    }
}

/// A SandboxSet `name` of one sandbox whose first container is `container` (YAML, indented for
/// the list), applied, once its sandbox is available.
fn apply_pool(serve: &OkaServe, name: &str, container: &str) {
    let set = format!(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: {name}\n\
         spec:\n  replicas: 1\n  template:\n    spec:\n      containers:\n{container}"
    );
    kubectl(serve, &["apply", "-f", "-"], Some(&set));
    wait_until(serve, "the new pool", Duration::from_secs(120), || {
        json(serve, &["get", "sbs", name])["status"]["availableReplicas"].as_i64() == Some(1)
    });
}

/// The `(reason, status)` of condition `type_` of `sandbox`.
fn condition(sandbox: &Value, type_: &str) -> (String, String) {
    let found = sandbox["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_default();
    (found["reason"].as_str().unwrap_or("").into(), found["status"].as_str().unwrap_or("").into())
}

/// The CPU limit the runtime wrote for `sandbox` (`cpu.max`, or v1's quota and period), read
/// from the cgroups its state file names.
fn cgroup_cpu_limit(serve: &OkaServe, sandbox: &Value) -> String {
    let uid = sandbox["metadata"]["uid"].as_str().unwrap();
    let dir = std::fs::read_dir(serve.state.path().join("runtime/sandboxes"))
        .unwrap()
        .flatten()
        .find(|entry| entry.file_name().to_string_lossy().ends_with(uid))
        .unwrap_or_else(|| panic!("no runtime state for {uid}"));
    let state = std::fs::read_to_string(dir.path().join("state.json")).unwrap();
    let state: Value = serde_json::from_str(&state).unwrap();
    let mut paths = Vec::new();
    fn strings(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) if s.starts_with("/sys/fs/cgroup") => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
            Value::Object(m) => m.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    strings(&state, &mut paths);
    paths
        .iter()
        .find_map(|p| {
            let p = std::path::Path::new(p);
            let read =
                |f: &str| std::fs::read_to_string(p.join(f)).ok().map(|s| s.trim().to_owned());
            read("cpu.max").or_else(|| {
                Some(format!("{} {}", read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?))
            })
        })
        .unwrap_or_else(|| panic!("no CPU limit in {paths:?}"))
}

#[test]
fn a_claims_in_place_cpu_update_changes_the_cgroup_limit() {
    if !runnable("a_claims_in_place_cpu_update_changes_the_cgroup_limit") {
        return;
    }
    let root = image_directory("cpu");
    let serve = serve_with_pool(0);
    apply_pool(
        &serve,
        "cpu",
        &format!(
            "      - name: main\n        image: {}\n        resources:\n          requests:\n\
             \x20           cpu: \"1\"\n          limits:\n            cpu: \"1\"\n",
            root.path().display()
        ),
    );
    let member =
        &json(&serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=cpu"])["items"][0];
    assert_eq!(cgroup_cpu_limit(&serve, member), "100000 100000", "one CPU before the claim");
    let claim = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  \
                 name: faster\nspec:\n  templateName: cpu\n  createOnNoStock: false\n  \
                 waitReadyTimeout: 60s\n  inplaceUpdate:\n    resources:\n      requests:\n  \
                 \x20     cpu: 250m\n      limits:\n        cpu: 500m\n";
    kubectl(&serve, &["apply", "-f", "-"], Some(claim));
    let done = wait_completed(&serve, "faster");
    assert_eq!(done["status"]["claimedReplicas"], 1, "{}", done["status"]);
    let sandboxes = claimed_by(&serve, "faster");
    let sandbox = &sandboxes[0];
    assert_eq!(sandbox["metadata"]["name"], member["metadata"]["name"], "the pool's member");
    let resources = &sandbox["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(resources["limits"]["cpu"], "500m");
    assert_eq!(resources["requests"]["cpu"], "250m");
    assert_eq!(condition(sandbox, "InplaceUpdate"), ("Succeeded".into(), "True".into()));
    assert_eq!(cgroup_cpu_limit(&serve, sandbox), "50000 100000", "half a CPU, live");
    // The processes ran on: the agent runtime answers with the claim's token.
    let id = sandbox["metadata"]["labels"]["agents.kruise.io/sandbox-id"].as_str().unwrap();
    let token = sandbox["metadata"]["annotations"]["agents.kruise.io/runtime-access-token"]
        .as_str()
        .unwrap();
    assert_eq!(run_in_sandbox(&serve, id, token, "echo ok"), "b2sK");
}

/// A root filesystem directory for a sandbox: `/bin/sh` and the shared libraries it, the init
/// (`oka`) and the agent runtime (`oka-envd`) load, accounts, and `/oka-image` holding `marker`.
fn image_directory(marker: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let envd = std::path::Path::new(OKA).with_file_name("oka-envd");
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    let mut files = vec![sh.clone()];
    for binary in [std::path::PathBuf::from(OKA), envd, sh.clone()] {
        let out = Command::new("ldd").arg(&binary).output().unwrap();
        for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if word.starts_with('/') {
                files.push(word.into());
            }
        }
    }
    for file in files {
        let target = root.path().join(file.strip_prefix("/").unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&file, &target).unwrap();
    }
    let sh_in_root = root.path().join("bin/sh");
    if !sh_in_root.exists() {
        std::fs::create_dir_all(root.path().join("bin")).unwrap();
        std::fs::copy(&sh, sh_in_root).unwrap();
    }
    for dir in ["etc", "root", "home/user", "tmp", "proc", "dev"] {
        std::fs::create_dir_all(root.path().join(dir)).unwrap();
    }
    std::fs::write(
        root.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(root.path().join("etc/group"), "root:x:0:\nuser:x:1000:\n").unwrap();
    std::fs::write(root.path().join("oka-image"), format!("{marker}\n")).unwrap();
    root
}

#[test]
fn a_claims_in_place_image_update_restarts_the_sandbox_on_that_root() {
    if !runnable("a_claims_in_place_image_update_restarts_the_sandbox_on_that_root") {
        return;
    }
    let image = image_directory("the-new-image");
    let old = image_directory("the-old-image");
    let serve = serve_with_pool(0);
    let pool = format!("      - name: main\n        image: {}\n", old.path().display());
    apply_pool(&serve, "img", &pool);
    let member =
        &json(&serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=img"])["items"][0];
    let claim = format!(
        "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  name: newer\n\
         spec:\n  templateName: img\n  createOnNoStock: false\n  waitReadyTimeout: 60s\n  \
         envVars:\n    CLAIM_VAR: hello-claim\n  inplaceUpdate:\n    image: {}\n",
        image.path().display()
    );
    kubectl(&serve, &["apply", "-f", "-"], Some(&claim));
    let done = wait_completed(&serve, "newer");
    assert_eq!(done["status"]["claimedReplicas"], 1, "{}\n{}", done["status"], serve.log());
    let sandbox = &claimed_by(&serve, "newer")[0];
    assert_eq!(sandbox["metadata"]["name"], member["metadata"]["name"], "the same sandbox");
    let image_path = image.path().to_string_lossy().into_owned();
    assert_eq!(sandbox["spec"]["template"]["spec"]["containers"][0]["image"], image_path.as_str());
    assert_eq!(condition(sandbox, "InplaceUpdate"), ("Succeeded".into(), "True".into()));
    assert_eq!(condition(sandbox, "Ready"), ("PodReady".into(), "True".into()));
    // It runs on the new root, with the claim's `/init` (its env vars) after the restart.
    let id = sandbox["metadata"]["labels"]["agents.kruise.io/sandbox-id"].as_str().unwrap();
    let notes = &sandbox["metadata"]["annotations"];
    let token = notes["agents.kruise.io/runtime-access-token"].as_str().unwrap();
    let stdout = run_in_sandbox(&serve, id, token, "read line < /oka-image; echo $line $CLAIM_VAR");
    assert_eq!(stdout, "dGhlLW5ldy1pbWFnZSBoZWxsby1jbGFpbQo=", "\"the-new-image hello-claim\\n\"");
    // The restart is in the sandbox's Events.
    let events = kubectl(&serve, &["get", "events"], None);
    assert!(
        events.contains("InplaceUpdating") && events.contains("InplaceUpdateSucceeded"),
        "{events}"
    );
}

/// `GET path` on port 49983 of sandbox `id` through the gateway; the status line.
fn get_through_gateway(serve: &OkaServe, id: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", serve.gateway)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: {id}\r\n\
         E2b-Sandbox-Port: 49983\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    String::from_utf8_lossy(&response).lines().next().unwrap_or_default().to_owned()
}

#[test]
fn an_auto_pause_policy_pauses_an_idle_sandbox_and_a_request_wakes_it() {
    if !runnable("an_auto_pause_policy_pauses_an_idle_sandbox_and_a_request_wakes_it") {
        return;
    }
    let root = image_directory("idler");
    let serve = serve_with_pool(0);
    // Mode 1 on the pool, copied to its members: a probe that fails at once (nothing listens
    // on port 1 in the sandbox) finds it idle, and the policy pauses it once it has run 15 s
    // (`minRunningSeconds`, which also keeps it from pausing again at once after the wake).
    let set = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: idler\n\
               spec:\n  replicas: 1\n  probes:\n  - name: closed\n    tcpSocket:\n      port: 1\n\
               \x20   periodSeconds: 5\n    timeoutSeconds: 1\n    failureThreshold: 1\n\
               \x20 autoPausePolicy:\n    pause:\n      probeName: closed\n      status: \"False\"\n\
               \x20     forSeconds: 0\n    minRunningSeconds: 15\n  template:\n    spec:\n\
               \x20     containers:\n      - name: main\n        image: ROOT\n"
        .replace("ROOT", &root.path().display().to_string());
    kubectl(&serve, &["apply", "-f", "-"], Some(&set));
    wait_until(&serve, "the idler pool", Duration::from_secs(120), || {
        json(&serve, &["get", "sbs", "idler"])["status"]["availableReplicas"].as_i64() == Some(1)
    });
    let member =
        &json(&serve, &["get", "sbx", "-l", "agents.kruise.io/sandbox-pool=idler"])["items"][0];
    assert_eq!(member["spec"]["autoPausePolicy"]["pause"]["probeName"], "closed", "{member}");
    // An unclaimed member is never paused by its policy; a claimed one is.
    let claim = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  \
                 name: sleepy\nspec:\n  templateName: idler\n  createOnNoStock: false\n";
    kubectl(&serve, &["apply", "-f", "-"], Some(claim));
    wait_completed(&serve, "sleepy");
    let name = claimed_by(&serve, "sleepy")[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let get = || json(&serve, &["get", "sbx", &name]);
    wait_until(&serve, "the policy's pause", Duration::from_secs(90), || {
        let sandbox = get();
        sandbox["status"]["phase"] == "Paused" && condition(&sandbox, "SandboxPaused").1 == "True"
    });
    let paused = get();
    assert_eq!(paused["spec"]["paused"], true);
    assert_eq!(
        paused["metadata"]["annotations"]["agents.kruise.io/paused-by"],
        "auto-pause-policy"
    );
    assert_eq!(condition(&paused, "AutoPaused"), ("ProbeDriven".into(), "True".into()));

    // A request through the gateway wakes it: the gateway resumes it and the request is served.
    let id = paused["metadata"]["labels"]["agents.kruise.io/sandbox-id"].as_str().unwrap();
    let status = get_through_gateway(&serve, id, "/health");
    assert!(status.starts_with("HTTP/1.1 2"), "{status}\n{}", serve.log());
    let woken = get();
    assert_ne!(woken["spec"]["paused"], true, "{woken}");
    assert!(woken["metadata"]["annotations"].get("agents.kruise.io/paused-by").is_none());
    assert_eq!(woken["status"]["phase"], "Running");
    let events = kubectl(&serve, &["get", "events"], None);
    assert!(events.contains("AutoPaused"), "{events}");
}
