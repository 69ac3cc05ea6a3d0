//! Admission of the reference samples and of objects that break each kind of rule.

use serde_json::{Value, json};

use super::*;

const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../api/tests/reference/samples");

fn sample(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{SAMPLES}/{name}")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn messages(e: AdmissionError) -> Vec<String> {
    match e {
        AdmissionError::Invalid(errors) => {
            errors.iter().map(|e| format!("{}: {}", e.field, e.body())).collect()
        }
        other => panic!("not invalid: {other:?}"),
    }
}

#[test]
fn the_reference_samples_are_admitted_strictly() {
    let admission = Admission::new();
    for entry in std::fs::read_dir(SAMPLES).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut obj: Value = serde::Deserialize::deserialize(doc).unwrap();
            if obj.is_null() {
                continue;
            }
            let kind = obj["kind"].as_str().unwrap().to_owned();
            let admitted =
                admission.admit(&kind, Operation::Create, &mut obj, None, FieldValidation::Strict);
            let admitted = admitted.unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
            // The one warning: a volume claim template the sample mounts nowhere (the
            // reference's newest webhook refuses that; see `webhooks`).
            let unmounted = |w: &String| w.starts_with("spec.volumeClaimTemplates[0]");
            assert!(admitted.warnings.iter().all(unmounted), "{}: {admitted:?}", path.display());
        }
    }
}

#[test]
fn unknown_fields_are_pruned_warned_or_refused() {
    let admission = Admission::new();
    let mut obj = sample("sandboxset-desktop.yaml");
    obj["spec"]["replicass"] = json!(3);
    obj["metadata"]["labelz"] = json!({"a": "b"});
    let mut strict = obj.clone();
    let e = admission.admit(
        "SandboxSet",
        Operation::Create,
        &mut strict,
        None,
        FieldValidation::Strict,
    );
    assert_eq!(
        e.unwrap_err().to_string(),
        "strict decoding error: unknown field \"metadata.labelz\", unknown field \"spec.replicass\""
    );
    let admitted = admission
        .admit("SandboxSet", Operation::Create, &mut obj, None, FieldValidation::Warn)
        .unwrap();
    assert_eq!(
        admitted.warnings,
        ["unknown field \"metadata.labelz\"", "unknown field \"spec.replicass\""]
    );
    assert!(obj["spec"].get("replicass").is_none());
    assert!(obj["metadata"].get("labelz").is_none());
}

#[test]
fn defaults_fill_absent_fields() {
    let admission = Admission::new();
    let mut obj = json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "SandboxSet",
        "metadata": {"name": "p"},
        "spec": {
            "replicas": 1,
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
            "probes": [{"name": "alive", "activity": {}}],
            "autoPausePolicy": {"pause": {"probeName": "alive"}},
        },
    });
    admission
        .admit("SandboxSet", Operation::Create, &mut obj, None, FieldValidation::Strict)
        .unwrap();
    let policy = &obj["spec"]["autoPausePolicy"];
    assert_eq!(policy["minPausedSeconds"], 30);
    assert_eq!(policy["minRunningSeconds"], 60);
    assert_eq!(policy["pause"]["status"], "False");
}

#[test]
fn schema_errors_read_as_the_api_server_writes_them() {
    let admission = Admission::new();
    let mut obj = json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "SandboxSet",
        "metadata": {"name": "Bad_Name", "labels": {"ok": "bad value!"}},
        "spec": {
            "replicas": "three",
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
            "probes": [{"name": "alive", "activity": {}}],
            "autoPausePolicy": {"pause": {"probeName": "alive", "status": "Maybe", "forSeconds": -1}},
        },
    });
    let e =
        admission.admit("SandboxSet", Operation::Create, &mut obj, None, FieldValidation::Strict);
    let messages = messages(e.unwrap_err());
    let expected = [
        "metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        "spec.autoPausePolicy.pause.forSeconds: Invalid value: -1: spec.autoPausePolicy.pause.forSeconds in body should be greater than or equal to 0",
        "spec.autoPausePolicy.pause.status: Unsupported value: \"Maybe\": supported values: \"True\", \"False\"",
        "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"",
    ];
    for line in expected {
        assert!(messages.iter().any(|m| m == line), "missing {line}\nin {messages:#?}");
    }
    assert!(
        messages.iter().any(|m| m.starts_with("metadata.labels: Invalid value: \"bad value!\": a valid label")),
        "{messages:#?}"
    );
    let mut nameless = json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxClaim", "metadata": {}, "spec": {}});
    let e = admission.admit(
        "SandboxClaim",
        Operation::Create,
        &mut nameless,
        None,
        FieldValidation::Strict,
    );
    let messages = self::messages(e.unwrap_err());
    assert!(
        messages.contains(
            &"metadata.name: Required value: name or generateName is required".to_owned()
        ),
        "{messages:#?}"
    );
}

/// One admission for the rule tests: building one generates and compiles every CRD.
fn shared() -> &'static Admission {
    static SHARED: std::sync::LazyLock<Admission> = std::sync::LazyLock::new(Admission::new);
    &SHARED
}

/// The field errors admission refuses `obj` with, as `path: body` lines.
fn refused(kind: &str, mut obj: Value, old: Option<&Value>) -> Vec<String> {
    let operation = if old.is_some() { Operation::Update } else { Operation::Create };
    let e = shared().admit(kind, operation, &mut obj, old, FieldValidation::Strict);
    messages(e.unwrap_err())
}

fn admitted(kind: &str, mut obj: Value, old: Option<&Value>) {
    let operation = if old.is_some() { Operation::Update } else { Operation::Create };
    let result = shared().admit(kind, operation, &mut obj, old, FieldValidation::Strict);
    assert_eq!(result, Ok(Admitted::default()), "{obj:#}");
}

fn autoscaler(spec: Value) -> Value {
    json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "PoolAutoscaler",
        "metadata": {"name": "scaler"},
        "spec": spec,
    })
}

fn target() -> Value {
    json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet", "name": "pool"})
}

#[test]
fn pool_autoscaler_rules_refuse_bad_specs() {
    admitted(
        "PoolAutoscaler",
        autoscaler(json!({"maxReplicas": 3, "scaleTargetRef": target()})),
        None,
    );
    let cases = [
        (
            json!({"minReplicas": 4, "maxReplicas": 3, "scaleTargetRef": target()}),
            "spec: Invalid value: \"object\": minReplicas must be less than or equal to maxReplicas",
        ),
        (
            json!({
                "maxReplicas": 3,
                "scaleTargetRef": target(),
                "cronPolicies": [{"name": "night", "schedule": "0 0 * * *", "targetReplicas": 1}],
                "capacityPolicy": {"targetAvailable": 2},
            }),
            "spec: Invalid value: \"object\": cron and capacity policies are mutually exclusive",
        ),
        (
            json!({"maxReplicas": 3, "scaleTargetRef": {"kind": "Deployment", "name": "pool"}}),
            "spec.scaleTargetRef: Invalid value: \"object\": kind must be SandboxSet",
        ),
        (
            json!({"maxReplicas": 3, "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "SandboxSet", "name": "pool"}}),
            "spec.scaleTargetRef: Invalid value: \"object\": apiVersion must be in group agents.kruise.io",
        ),
    ];
    for (spec, expected) in cases {
        assert_eq!(refused("PoolAutoscaler", autoscaler(spec), None), [expected]);
    }
    // An empty cron list leaves the capacity policy alone.
    let spec = json!({
        "maxReplicas": 3,
        "scaleTargetRef": target(),
        "cronPolicies": [],
        "capacityPolicy": {"targetAvailable": "10%"},
    });
    admitted("PoolAutoscaler", autoscaler(spec), None);
}

#[test]
fn pool_autoscaler_webhook_checks_schedules_zones_and_amounts() {
    let with = |extra: Value| {
        let mut spec = json!({"maxReplicas": 3, "scaleTargetRef": target()});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        autoscaler(spec)
    };
    let good = json!({"cronPolicies": [
        {"name": "morning", "schedule": "0 8 * * MON-FRI", "timeZone": "Asia/Shanghai", "targetReplicas": 3},
        {"name": "weekly", "schedule": "@weekly", "targetReplicas": 1},
    ]});
    admitted("PoolAutoscaler", with(good), None);
    admitted(
        "PoolAutoscaler",
        with(json!({"capacityPolicy": {"targetAvailable": "70%", "tolerance": 2}})),
        None,
    );
    let cases = [
        (
            json!({"cronPolicies": [{"name": "p", "schedule": "0 8 * *", "targetReplicas": 1}]}),
            "admission webhook \"v-pas.kb.io\" denied the request: spec.cronPolicies[0].schedule: Invalid value: \"0 8 * *\": expected 5 fields (minute hour day-of-month month day-of-week), found 4",
        ),
        (
            json!({"cronPolicies": [{"name": "p", "schedule": "@every 5m", "targetReplicas": 1}]}),
            "admission webhook \"v-pas.kb.io\" denied the request: spec.cronPolicies[0].schedule: Invalid value: \"@every 5m\": unknown macro \"@every 5m\": use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly",
        ),
        (
            json!({"cronPolicies": [{"name": "p", "schedule": "0 8 * * *", "timeZone": "Mars/Olympus", "targetReplicas": 1}]}),
            "admission webhook \"v-pas.kb.io\" denied the request: spec.cronPolicies[0].timeZone: Invalid value: \"Mars/Olympus\": unknown time zone",
        ),
        (
            json!({"capacityPolicy": {"targetAvailable": "120%"}}),
            "admission webhook \"v-pas.kb.io\" denied the request: spec.capacityPolicy.targetAvailable: Invalid value: \"120%\": must be a count >= 0 or a percentage from 0% to 100%",
        ),
        (
            json!({"capacityPolicy": {"targetAvailable": 1, "tolerance": -1}}),
            "admission webhook \"v-pas.kb.io\" denied the request: spec.capacityPolicy.tolerance: Invalid value: -1: must be a count >= 0 or a percentage from 0% to 100%",
        ),
    ];
    for (extra, expected) in cases {
        let mut obj = with(extra);
        let error = shared()
            .admit("PoolAutoscaler", Operation::Create, &mut obj, None, FieldValidation::Strict)
            .unwrap_err();
        assert_eq!(error.to_string(), expected);
    }
}

#[test]
fn one_pool_autoscaler_per_sandbox_set() {
    use crate::webhooks::pool_autoscaler_against_others;
    let named = |name: &str, target: &str| {
        let mut pa = autoscaler(
            json!({"maxReplicas": 3, "scaleTargetRef": {"kind": "SandboxSet", "name": target}}),
        );
        pa["metadata"]["name"] = json!(name);
        pa
    };
    let others = [named("first", "pool"), named("other", "desk")];
    let denial = pool_autoscaler_against_others(&named("second", "pool"), None, &others).unwrap();
    assert_eq!(
        denial.message(),
        "admission webhook \"v-pas.kb.io\" denied the request: spec.scaleTargetRef.name: Invalid value: \"pool\": PoolAutoscaler first already targets this SandboxSet"
    );
    assert!(pool_autoscaler_against_others(&named("second", "free"), None, &others).is_none());
    // The stored object itself is no conflict; an update that keeps the target is not checked.
    assert!(pool_autoscaler_against_others(&named("first", "pool"), None, &others).is_none());
    let old = named("other", "pool");
    assert!(pool_autoscaler_against_others(&named("other", "pool"), Some(&old), &others).is_none());
    assert!(
        pool_autoscaler_against_others(
            &named("other", "pool"),
            Some(&named("other", "desk")),
            &others
        )
        .is_some()
    );
}

#[test]
fn sandbox_claim_durations_must_be_at_least_a_second() {
    let mut claim = sample("sandboxclaim.yaml");
    claim["spec"]["claimTimeout"] = json!("500ms");
    claim["spec"]["waitReadyTimeout"] = json!("0s");
    assert_eq!(
        refused("SandboxClaim", claim, None),
        [
            "spec.claimTimeout: Invalid value: \"string\": claimTimeout must be at least 1 second",
            "spec.waitReadyTimeout: Invalid value: \"string\": waitReadyTimeout must be at least 1 second",
        ]
    );
}

#[test]
fn sandbox_claim_replicas_are_immutable_on_update_only() {
    let stored = sample("sandboxclaim.yaml");
    admitted("SandboxClaim", stored.clone(), None);
    let mut unchanged = stored.clone();
    unchanged["spec"]["labels"]["project"] = json!("other");
    admitted("SandboxClaim", unchanged, Some(&stored));
    let mut changed = stored.clone();
    changed["spec"]["replicas"] = json!(4);
    assert_eq!(
        refused("SandboxClaim", changed.clone(), Some(&stored)),
        ["spec.replicas: Invalid value: \"integer\": replicas is immutable"]
    );
    // Setting replicas where the stored object had none is no transition: nothing to compare.
    let mut without = stored.clone();
    without["spec"].as_object_mut().unwrap().remove("replicas");
    admitted("SandboxClaim", changed, Some(&without));
}

/// A `kind` object (Sandbox, SandboxSet or SandboxTemplate) with these probes and pause
/// policy.
fn with_probes(kind: &str, probes: Value, policy: Value) -> Value {
    let mut spec = json!({
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
        "probes": probes,
        "autoPausePolicy": policy,
    });
    if kind == "SandboxSet" {
        spec["replicas"] = json!(1);
    }
    json!({"apiVersion": "agents.kruise.io/v1alpha1", "kind": kind, "metadata": {"name": "s"}, "spec": spec})
}

#[test]
fn probe_and_pause_rules_refuse_bad_specs_of_every_kind_that_has_them() {
    let pause = |name: &str| json!({"pause": {"probeName": name}});
    let resume =
        |name: &str| json!({"pause": {"probeName": "alive"}, "resume": {"probeName": name}});
    let alive = json!({"name": "alive", "activity": {}});
    let cases = [
        (
            json!([{"name": "alive", "activity": {}, "exec": {"command": ["true"]}}]),
            pause("alive"),
            "spec.probes[0]: Invalid value: \"object\": exactly one of exec, httpGet, tcpSocket or activity must be set",
        ),
        (
            json!([alive, {"name": "none"}]),
            pause("alive"),
            "spec.probes[1]: Invalid value: \"object\": exactly one of exec, httpGet, tcpSocket or activity must be set",
        ),
        (
            json!([{"name": "alive", "activity": {}, "timeoutSeconds": 20, "periodSeconds": 10}]),
            pause("alive"),
            "spec.probes[0]: Invalid value: \"object\": timeoutSeconds must not exceed periodSeconds",
        ),
        (
            json!([alive]),
            pause("missing"),
            "spec: Invalid value: \"object\": autoPausePolicy.pause.probeName must name an entry of probes",
        ),
        (
            json!([alive, {"name": "local", "httpGet": {"port": 8080}}]),
            resume("local"),
            "spec: Invalid value: \"object\": autoPausePolicy.resume.probeName must name an external probe (activity, or httpGet/tcpSocket with a host)",
        ),
    ];
    for kind in ["Sandbox", "SandboxSet", "SandboxTemplate"] {
        admitted(kind, with_probes(kind, json!([alive]), pause("alive")), None);
        let external =
            json!([alive, {"name": "remote", "httpGet": {"port": 8080, "host": "10.0.0.1"}}]);
        admitted(kind, with_probes(kind, external, resume("remote")), None);
        for (probes, policy, expected) in &cases {
            let obj = with_probes(kind, probes.clone(), policy.clone());
            assert_eq!(refused(kind, obj, None), [*expected], "{kind}");
        }
    }
}

#[test]
fn schema_errors_keep_rules_from_running() {
    let spec = json!({"minReplicas": 4, "maxReplicas": "three", "scaleTargetRef": target()});
    assert_eq!(
        refused("PoolAutoscaler", autoscaler(spec), None),
        [
            "spec.maxReplicas: Invalid value: \"string\": spec.maxReplicas in body must be of type integer: \"string\"",
            "<nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
        ]
    );
}

#[test]
fn updates_ratchet_rules_on_unchanged_values() {
    // Stored before the rule existed: an update that leaves the spec alone is admitted.
    let spec =
        json!({"minReplicas": 4, "maxReplicas": 3, "scaleTargetRef": target(), "suspend": false});
    let stored = autoscaler(spec);
    let mut relabelled = stored.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    admitted("PoolAutoscaler", relabelled, Some(&stored));
    let mut changed = stored.clone();
    changed["spec"]["maxReplicas"] = json!(2);
    assert_eq!(
        refused("PoolAutoscaler", changed, Some(&stored)),
        ["spec: Invalid value: \"object\": minReplicas must be less than or equal to maxReplicas"]
    );
}

#[test]
fn admission_defaults_pool_templates_and_subresource_writes_do_not() {
    let admission = Admission::new();
    let mut obj = sample("sandboxset-desktop.yaml");
    let sent = obj.clone();
    admission
        .admit("SandboxSet", Operation::Create, &mut obj, None, FieldValidation::Strict)
        .unwrap();
    let pod = &obj["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], json!(false));
    assert_eq!(pod["restartPolicy"], json!("Always"));
    assert_eq!(pod["containers"][0]["terminationMessagePath"], json!("/dev/termination-log"));
    assert_eq!(obj["spec"]["updateStrategy"]["maxUnavailable"], json!("20%"));
    // Admitting the stored object again (an update that changes nothing) changes nothing.
    let stored = obj.clone();
    admission
        .admit("SandboxSet", Operation::Update, &mut obj, Some(&stored), FieldValidation::Strict)
        .unwrap();
    assert_eq!(obj, stored);
    // A scale write leaves a template that was never defaulted as it is.
    let mut scaled = sent.clone();
    scaled["spec"]["replicas"] = json!(7);
    admission
        .admit_subresource("SandboxSet", &mut scaled, Some(&sent), FieldValidation::Ignore)
        .unwrap();
    assert_eq!(scaled["spec"]["template"], sent["spec"]["template"]);
    assert!(scaled["spec"].get("updateStrategy").is_none());
}

fn template_naming_oka(marker: Value, volumes: Value) -> Value {
    json!({
        "metadata": marker,
        "spec": {
            "volumes": volumes,
            "containers": [{
                "name": "main", "image": "debian:12",
                "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
                "ports": [{"containerPort": 80, "hostPort": 8080}],
            }],
        },
    })
}

#[test]
fn a_template_naming_oka_runtime_is_refused_what_it_cannot_honour() {
    let annotated = json!({"annotations": {"agents.kruise.io/runtime": "node"}});
    let nfs = json!([{"name": "data", "nfs": {"server": "nfs.example", "path": "/x"}}]);
    let sandbox = json!({
        "apiVersion": "agents.kruise.io/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": "s", "namespace": "default"},
        "spec": {"template": template_naming_oka(annotated.clone(), nfs.clone())},
    });
    assert_eq!(
        refused("Sandbox", sandbox, None),
        [
            "spec.template.spec.volumes[0].nfs: Forbidden: not supported by oka's runtime: use \
             emptyDir, hostPath, configMap or secret",
            "spec.template.spec.containers[0].lifecycle: Forbidden: not supported by oka's runtime",
            "spec.template.spec.containers[0].ports[0].hostPort: Forbidden: not supported by oka's \
             runtime: a sandbox's ports are reached through oka",
        ]
    );
    let mut set = json!({
        "apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet",
        "metadata": {"name": "pool", "namespace": "default"},
        "spec": {"replicas": 1, "template": template_naming_oka(json!({}), json!([]))},
    });
    set["spec"]["template"]["spec"]["runtimeClassName"] = json!("oka-node");
    let e = shared()
        .admit("SandboxSet", Operation::Create, &mut set, None, FieldValidation::Strict)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "admission webhook \"v-sbs.kb.io\" denied the request: [spec.template.spec.containers[0].\
         lifecycle: Forbidden: not supported by oka's runtime, spec.template.spec.containers[0].\
         ports[0].hostPort: Forbidden: not supported by oka's runtime: a sandbox's ports are \
         reached through oka]"
    );
}

#[test]
fn a_template_that_may_run_as_a_pod_is_left_to_the_runtime_that_runs_it() {
    let nfs = json!([{"name": "data", "nfs": {"server": "nfs.example", "path": "/x"}}]);
    admitted(
        "Sandbox",
        json!({
            "apiVersion": "agents.kruise.io/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "default"},
            "spec": {"template": template_naming_oka(json!({}), nfs.clone())},
        }),
        None,
    );
    // The object's own annotation wins over the template's.
    admitted(
        "Sandbox",
        json!({
            "apiVersion": "agents.kruise.io/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "default",
                         "annotations": {"agents.kruise.io/runtime": "pod"}},
            "spec": {"template": template_naming_oka(
                json!({"annotations": {"agents.kruise.io/runtime": "node"}}), nfs)},
        }),
        None,
    );
}

fn traffic_policy(spec: Value) -> Value {
    json!({
        "apiVersion": "agents.kruise.io/v1alpha1",
        "kind": "TrafficPolicy",
        "metadata": {"name": "tp", "namespace": "default"},
        "spec": spec,
    })
}

/// The TrafficPolicy CRD's CEL rules refuse with the reference's messages.
#[test]
fn traffic_policy_rules_are_the_crds() {
    let selector = json!({"matchLabels": {"agents.kruise.io/sandbox-name": "s1"}});
    let cases = [
        (
            json!({"selector": selector}),
            "spec: Invalid value: \"object\": at least one of ingress or egress must be specified",
        ),
        (
            json!({"selector": selector, "egress": {"rules": [{"action": "allow", "to": [{"cidr": "10.0.0.0/8", "fqdn": "a.example"}]}]}}),
            "spec.egress.rules[0].to[0]: Invalid value: \"object\": exactly one of cidr, fqdn, service, or workload must be set",
        ),
        (
            json!({"selector": selector, "egress": {"rules": [{"action": "allow", "ports": [{"protocol": "TCP", "endPort": 80}]}]}}),
            "spec.egress.rules[0].ports[0]: Invalid value: \"object\": endPort requires port to be set",
        ),
        (
            json!({"selector": selector, "egress": {"rules": [{"action": "allow", "ports": [{"protocol": "TCP", "port": 90, "endPort": 80}]}]}}),
            "spec.egress.rules[0].ports[0]: Invalid value: \"object\": endPort must be greater than or equal to port",
        ),
    ];
    for (spec, expected) in cases {
        // A missing `port` also fails the second port rule's evaluation, as on a cluster.
        assert_eq!(refused("TrafficPolicy", traffic_policy(spec), None)[0], expected);
    }
    let mut good = traffic_policy(json!({
        "selector": selector,
        "egress": {"rules": [
            {"action": "allow", "to": [{"fqdn": "a.example"}], "ports": [{"protocol": "TCP", "port": 443}]},
            {"action": "reject"},
        ]},
    }));
    admitted("TrafficPolicy", good.clone(), None);
    shared()
        .admit("TrafficPolicy", Operation::Create, &mut good, None, FieldValidation::Strict)
        .unwrap();
    assert_eq!(good["spec"]["priority"], 1000, "the schema default applies");
}
