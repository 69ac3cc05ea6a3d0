//! Volumes and the rest of the pod template through `oka serve` (as root: real sandboxes) and
//! kubectl: a SandboxSet whose members mount a ConfigMap (an item, with its mode) read-only and
//! an emptyDir, and take a variable from a Secret, is applied with its objects; a claimed member
//! shows all of it to a process started through envd. A template that names oka's runtime and
//! asks for what it cannot honour is refused by the API with each field's path; one that does
//! not name it is stored and its sandbox says, in Ready and an Event, which fields it cannot
//! honour.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use support::{
    OkaServe, kubectl, kubectl_binary, kubectl_json as json, run_in_sandbox, wait_until,
};

const OKA: &str = env!("CARGO_BIN_EXE_oka");

fn runnable(test: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    let kubectl = Command::new(kubectl_binary())
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if root && kubectl {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{test}: CI runs as root with kubectl");
    eprintln!("SKIPPED {test}: needs root and kubectl (scripts/test.sh)");
    false
}

fn serve() -> OkaServe {
    let config = "defaultPool:\n  enabled: false\ncodeInterpreterPool:\n  enabled: false\n";
    let serve = OkaServe::start(OKA, config, &[]);
    wait_until(&serve, "the Kubernetes API", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", serve.kube)).is_ok()
            && serve.state.path().join("kubeconfig").exists()
    });
    serve
}

/// kubectl `args` with `stdin`, expected to fail; its stderr.
fn kubectl_fails(serve: &OkaServe, args: &[&str], stdin: &str) -> String {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(serve.state.path().join("kubeconfig"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "kubectl {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const OBJECTS: &str = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
data:
  app.conf: |
    level=debug
  unused: x
---
apiVersion: v1
kind: Secret
metadata:
  name: app-secret
stringData:
  token: s3cr3t
";

/// The pool, its members on the directory root `{root}`.
const POOL: &str = "\
apiVersion: agents.kruise.io/v1alpha1
kind: SandboxSet
metadata:
  name: configured
spec:
  replicas: 1
  template:
    spec:
      volumes:
      - name: config
        configMap:
          name: app-config
          items:
          - key: app.conf
            path: conf/app.conf
            mode: 0444
      - name: scratch
        emptyDir: {}
      containers:
      - name: main
        image: {root}
        command: [/bin/sh, -c, 'echo \"$TOKEN\" > /scratch/token; exec sleep 100000']
        env:
        - name: TOKEN
          valueFrom:
            secretKeyRef:
              name: app-secret
              key: token
        volumeMounts:
        - name: config
          mountPath: /etc/app
          readOnly: true
        - name: scratch
          mountPath: /scratch
";

#[test]
fn a_pool_mounts_a_config_map_and_an_empty_dir_and_takes_env_from_a_secret() {
    if !runnable("a_pool_mounts_a_config_map_and_an_empty_dir_and_takes_env_from_a_secret") {
        return;
    }
    let serve = serve();
    kubectl(&serve, &["apply", "-f", "-"], Some(OBJECTS));
    let root = support::host_root();
    let pool = POOL.replace("{root}", root.path().to_str().unwrap());
    kubectl(&serve, &["apply", "-f", "-"], Some(&pool));
    wait_until(&serve, "the pool", Duration::from_secs(120), || {
        json(&serve, &["get", "sbs", "configured"])["status"]["availableReplicas"].as_i64()
            == Some(1)
    });
    let claim = "apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxClaim\nmetadata:\n  name: mine\n\
                 spec:\n  templateName: configured\n  createOnNoStock: false\n";
    kubectl(&serve, &["apply", "-f", "-"], Some(claim));
    wait_until(&serve, "the claim", Duration::from_secs(120), || {
        json(&serve, &["get", "sbc", "mine"])["status"]["phase"] == "Completed"
    });
    let claimed = json(&serve, &["get", "sbx", "-l", "agents.kruise.io/claim-name=mine"]);
    let sandbox = &claimed["items"][0];
    let id = sandbox["metadata"]["labels"]["agents.kruise.io/sandbox-id"].as_str().unwrap();
    let token = sandbox["metadata"]["annotations"]["agents.kruise.io/runtime-access-token"]
        .as_str()
        .unwrap();
    let script = "cat /etc/app/conf/app.conf; stat -c %a /etc/app/conf/app.conf; ls /etc/app; \
                  cat /scratch/token; \
                  echo x > /etc/app/new 2>/dev/null || echo config-read-only; \
                  echo kept > /scratch/mine && cat /scratch/mine";
    assert_eq!(
        run_in_sandbox(&serve, id, token, script),
        "level=debug\n444\nconf\ns3cr3t\nconfig-read-only\nkept\n"
    );
}

#[test]
fn what_oka_cannot_honour_is_refused_by_path() {
    if !runnable("what_oka_cannot_honour_is_refused_by_path") {
        return;
    }
    let serve = serve();
    let template = |marker: &str| {
        format!(
            "apiVersion: agents.kruise.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: nfs\nspec:\n  \
             template:\n    metadata:\n      annotations:\n        {marker}\n    spec:\n      \
             volumes:\n      - name: data\n        nfs:\n          server: nfs.invalid\n          \
             path: /x\n      containers:\n      - name: main\n        command: [sleep, '1000']\n        \
             volumeMounts:\n        - name: data\n          mountPath: /data\n"
        )
    };
    let refused =
        kubectl_fails(&serve, &["apply", "-f", "-"], &template("agents.kruise.io/runtime: node"));
    assert!(
        refused.contains(
            "spec.template.spec.volumes[0].nfs: Forbidden: not supported by oka's runtime: use \
             emptyDir, hostPath, configMap or secret"
        ),
        "{refused}"
    );
    // Not naming a runtime, it could run as a Pod: stored, and refused where it runs.
    kubectl(&serve, &["apply", "-f", "-"], Some(&template("example.com/any: x")));
    wait_until(&serve, "UnsupportedByRuntime", Duration::from_secs(60), || {
        let sandbox = json(&serve, &["get", "sbx", "nfs"]);
        sandbox["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["reason"] == "UnsupportedByRuntime")
    });
    let events = json(&serve, &["get", "events"]);
    let event = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["involvedObject"]["name"] == "nfs" && e["reason"] == "UnsupportedByRuntime")
        .unwrap_or_else(|| panic!("{events:#}"));
    assert_eq!(
        event["message"],
        "spec.template.spec.volumes[0].nfs: not supported by oka's runtime: use emptyDir, \
         hostPath, configMap or secret"
    );
    assert_eq!(event["type"], "Warning");
}
