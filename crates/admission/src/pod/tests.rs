//! Table tests: one template per rule, with the API server's exact messages.

use serde_json::{Value, json};

use super::*;

/// The messages for a template whose spec is `spec` plus one valid container `c` (merged
/// with `container`).
#[track_caller]
fn check(spec: Value, container: Value, expected: &[&str]) {
    let mut c = json!({"name": "main", "image": "busybox"});
    for (k, v) in container.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([c]);
    }
    check_template(json!({"spec": spec}), expected);
}

#[track_caller]
fn check_template(template: Value, expected: &[&str]) {
    let got: Vec<String> = validate_template(&template, "spec.template", &[])
        .iter()
        .map(|e| format!("{}: {}", e.field, e.body()))
        .collect();
    assert_eq!(got, expected, "{template}");
}

const C: &str = "spec.template.spec.containers[0]";

#[test]
fn a_minimal_template_is_valid() {
    check(json!({}), json!({}), &[]);
}

#[test]
fn containers_need_names_images_and_unique_names() {
    check(json!({"containers": []}), json!({}), &["spec.template.spec.containers: Required value"]);
    check(
        json!({"containers": [{"name": "a.b"}, {"name": "Main", "image": "x"}, {"name": "Main", "image": "x"}]}),
        json!({}),
        &[
            "spec.template.spec.containers[0].name: Invalid value: \"a.b\": must not contain dots",
            "spec.template.spec.containers[0].image: Required value",
            "spec.template.spec.containers[1].name: Invalid value: \"Main\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            "spec.template.spec.containers[2].name: Invalid value: \"Main\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            "spec.template.spec.containers[2].name: Duplicate value: \"Main\"",
        ],
    );
    check(
        json!({"initContainers": [{"name": "main", "image": "x"}]}),
        json!({}),
        &["spec.template.spec.initContainers[0].name: Duplicate value: \"main\""],
    );
}

#[test]
fn ports_follow_the_api_servers_rules() {
    check(
        json!({}),
        json!({"ports": [
            {"containerPort": 70000},
            {"containerPort": 0, "hostPort": -1, "protocol": "HTTP", "name": "Web--"},
            {"containerPort": 80, "name": "http"},
            {"containerPort": 81, "name": "http"},
            {"containerPort": 82, "name": "1234567890123456"},
        ]}),
        &[
            &format!(
                "{C}.ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"
            ),
            &format!(
                "{C}.ports[1].name: Invalid value: \"Web--\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"
            ),
            &format!(
                "{C}.ports[1].name: Invalid value: \"Web--\": must not contain consecutive hyphens"
            ),
            &format!(
                "{C}.ports[1].name: Invalid value: \"Web--\": must not begin or end with a hyphen"
            ),
            &format!("{C}.ports[1].containerPort: Required value"),
            &format!(
                "{C}.ports[1].hostPort: Invalid value: -1: must be between 1 and 65535, inclusive"
            ),
            &format!(
                "{C}.ports[1].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\""
            ),
            &format!("{C}.ports[3].name: Duplicate value: \"http\""),
            &format!(
                "{C}.ports[4].name: Invalid value: \"1234567890123456\": must be no more than 15 characters"
            ),
            &format!(
                "{C}.ports[4].name: Invalid value: \"1234567890123456\": must contain at least one letter (a-z)"
            ),
        ],
    );
    check(
        json!({"containers": [
            {"name": "a", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]},
            {"name": "b", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "TCP"}]},
        ]}),
        json!({}),
        &["spec.template.spec.containers[1].ports[0].hostPort: Duplicate value: \"TCP//8080\""],
    );
    check(
        json!({"hostNetwork": true}),
        json!({"ports": [{"containerPort": 80, "hostPort": 81}]}),
        &[&format!(
            "{C}.ports[0].hostPort: Invalid value: 81: must match `containerPort` when `hostNetwork` is true"
        )],
    );
}

#[test]
fn env_names_and_sources() {
    check(
        json!({}),
        json!({"env": [
            {"name": "1ABC", "value": "x"},
            {"name": ".."},
            {"name": ""},
            {"name": "A", "valueFrom": {}},
            {"name": "B", "value": "v", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "spec.nope"}}},
            {"name": "E", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}},
            {"name": "F", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a b"}}},
            {"name": "G", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}},
        ]}),
        &[
            &format!(
                "{C}.env[0].name: Invalid value: \"1ABC\": a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"
            ),
            &format!("{C}.env[1].name: Invalid value: \"..\": must not be '..'"),
            &format!("{C}.env[2].name: Required value"),
            &format!(
                "{C}.env[3].valueFrom: Invalid value: \"\": must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
            ),
            &format!(
                "{C}.env[4].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty"
            ),
            &format!(
                "{C}.env[5].valueFrom: Invalid value: \"\": may not have more than one field specified at a time"
            ),
            &format!(
                "{C}.env[6].valueFrom.fieldRef.fieldPath: Invalid value: \"spec.nope\": error converting fieldPath: field label not supported: spec.nope"
            ),
            &format!(
                "{C}.env[7].valueFrom.fieldRef.fieldPath: Unsupported value: \"metadata.labels\": supported values: \"metadata.name\", \"metadata.namespace\", \"metadata.uid\", \"spec.nodeName\", \"spec.serviceAccountName\", \"status.hostIP\", \"status.hostIPs\", \"status.podIP\", \"status.podIPs\""
            ),
            &format!(
                "{C}.env[8].valueFrom.configMapKeyRef.key: Invalid value: \"a b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
            ),
            &format!(
                "{C}.env[9].valueFrom.resourceFieldRef.resource: Unsupported value: \"limits.gpu\": supported values: \"limits.cpu\", \"limits.ephemeral-storage\", \"limits.memory\", \"requests.cpu\", \"requests.ephemeral-storage\", \"requests.memory\""
            ),
        ],
    );
    check(
        json!({}),
        json!({"envFrom": [{"prefix": "1"}, {"configMapRef": {"name": ""}}]}),
        &[
            &format!(
                "{C}.envFrom[0].prefix: Invalid value: \"1\": a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"
            ),
            &format!(
                "{C}.envFrom: Invalid value: \"\": must specify one of: `configMapRef` or `secretRef`"
            ),
            &format!("{C}.envFrom[1].configMapRef.name: Required value"),
        ],
    );
}

#[test]
fn volumes_have_one_valid_source_and_mounts_refer_to_them() {
    check(
        json!({"volumes": [
            {"name": "a", "emptyDir": {}, "hostPath": {"path": "/x"}},
            {"name": "b"},
            {"name": "c", "configMap": {}},
            {"name": "d", "secret": {"defaultMode": 1000}},
            {"name": "e", "hostPath": {"path": "/x/../y", "type": "Dir"}},
            {"name": "f", "persistentVolumeClaim": {"claimName": ""}},
            {"name": "g", "emptyDir": {"sizeLimit": "-1Gi"}},
            {"name": "h", "emptyDir": {"sizeLimit": "lots"}},
            {"name": "Bad_Name", "emptyDir": {}},
            {"name": "ok", "emptyDir": {}},
            {"name": "ok", "emptyDir": {}},
        ]}),
        json!({"volumeMounts": [
            {"name": "ok", "mountPath": "/a"},
            {"name": "missing", "mountPath": "/a"},
            {"name": "ok", "mountPath": ""},
        ]}),
        &[
            "spec.template.spec.volumes[0].hostPath: Forbidden: may not specify more than 1 volume type",
            "spec.template.spec.volumes[1]: Required value: must specify a volume type",
            "spec.template.spec.volumes[2].configMap.name: Required value",
            "spec.template.spec.volumes[3].secret.secretName: Required value",
            "spec.template.spec.volumes[3].secret.defaultMode: Invalid value: 1000: must be a number between 0 and 0777 (octal), both inclusive",
            "spec.template.spec.volumes[4].hostPath.path: Invalid value: \"/x/../y\": must not contain '..'",
            "spec.template.spec.volumes[4].hostPath.type: Unsupported value: \"Dir\": supported values: \"\", \"BlockDevice\", \"CharDevice\", \"Directory\", \"DirectoryOrCreate\", \"File\", \"FileOrCreate\", \"Socket\"",
            "spec.template.spec.volumes[5].persistentVolumeClaim.claimName: Required value",
            "spec.template.spec.volumes[6].emptyDir.sizeLimit: Forbidden: SizeLimit field must be a valid resource quantity",
            "spec.template.spec.volumes[7].emptyDir.sizeLimit: Invalid value: \"lots\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
            "spec.template.spec.volumes[8].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            "spec.template.spec.volumes[10].name: Duplicate value: \"ok\"",
            &format!("{C}.volumeMounts[1].name: Not found: \"missing\""),
            &format!("{C}.volumeMounts[1].mountPath: Invalid value: \"/a\": must be unique"),
            &format!("{C}.volumeMounts[2].mountPath: Required value"),
        ],
    );
}

#[test]
fn volume_claim_templates_are_volumes() {
    let template = json!({"spec": {"containers": [{"name": "main", "image": "x", "volumeMounts": [{"name": "www", "mountPath": "/www"}]}]}});
    assert_eq!(validate_template(&template, "spec.template", &["www".to_owned()]), vec![]);
    assert_eq!(validate_template(&template, "spec.template", &[])[0].body(), "Not found: \"www\"");
}

#[test]
fn resources_are_valid_quantities_with_requests_within_limits() {
    check(
        json!({}),
        json!({"resources": {
            "limits": {"cpu": "500m", "memory": "1Gi", "example.com/gpu": 1},
            "requests": {"cpu": 2, "memory": "-1", "gpu": "1", "example.com/gpu": "2"},
        }}),
        &[
            &format!(
                "{C}.resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 500m"
            ),
            &format!(
                "{C}.resources.requests: Invalid value: \"2\": must be equal to example.com/gpu limit of 1"
            ),
            &format!(
                "{C}.resources.requests[gpu]: Invalid value: \"gpu\": must be a standard resource type or fully qualified"
            ),
            &format!(
                "{C}.resources.requests[gpu]: Invalid value: \"gpu\": must be a standard resource for containers"
            ),
            &format!(
                "{C}.resources.requests[memory]: Invalid value: \"-1\": must be greater than or equal to 0"
            ),
        ],
    );
    check(
        json!({}),
        json!({"resources": {"requests": {"example.com/gpu": 1}}}),
        &[&format!(
            "{C}.resources.limits: Required value: Limit must be set for non overcommitable resources"
        )],
    );
}

#[test]
fn quantities_print_as_the_api_server_prints_them() {
    for (text, canonical) in [
        ("2000m", "2"),
        ("1.5", "1500m"),
        ("1024Mi", "1Gi"),
        ("1536Mi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("100M", "100M"),
        ("1e3", "1e3"),
        ("512", "512"),
        ("-1", "-1"),
        ("0", "0"),
        ("0.1", "100m"),
    ] {
        let q = Quantity::parse(&json!(text)).unwrap();
        assert_eq!(q.canonical(), canonical, "{text}");
    }
    assert_eq!(Quantity::parse(&json!(1)).unwrap().canonical(), "1");
    assert_eq!(Quantity::parse(&json!("1Q")), None);
}

#[test]
fn probes_and_lifecycle_hooks() {
    check(
        json!({"terminationGracePeriodSeconds": 10}),
        json!({
            "livenessProbe": {"successThreshold": 2, "periodSeconds": -1, "exec": {"command": []}},
            "readinessProbe": {"httpGet": {"port": 0, "scheme": "FTP"}, "tcpSocket": {"port": 80}, "terminationGracePeriodSeconds": 5},
            "startupProbe": {},
            "lifecycle": {"postStart": {"sleep": {"seconds": 20}}, "preStop": {"httpGet": {"port": "HTTP"}}},
        }),
        &[
            &format!(
                "{C}.lifecycle.postStart.sleep: Invalid value: 20: must be greater than 0 and less than terminationGracePeriodSeconds (10). Enable AllowPodLifecycleSleepActionZeroValue feature gate for zero sleep."
            ),
            &format!(
                "{C}.lifecycle.preStop.httpGet.port: Invalid value: \"HTTP\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"
            ),
            &format!(
                "{C}.lifecycle.preStop.httpGet.port: Invalid value: \"HTTP\": must contain at least one letter (a-z)"
            ),
            &format!("{C}.livenessProbe.exec.command: Required value"),
            &format!(
                "{C}.livenessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0"
            ),
            &format!("{C}.livenessProbe.successThreshold: Invalid value: 2: must be 1"),
            &format!(
                "{C}.readinessProbe.httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive"
            ),
            &format!(
                "{C}.readinessProbe.httpGet.scheme: Unsupported value: \"FTP\": supported values: \"HTTP\", \"HTTPS\""
            ),
            &format!(
                "{C}.readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type"
            ),
            &format!(
                "{C}.readinessProbe.terminationGracePeriodSeconds: Invalid value: 5: must not be set for readinessProbes"
            ),
            &format!("{C}.startupProbe: Required value: must specify a handler type"),
        ],
    );
}

#[test]
fn init_containers_take_probes_only_as_sidecars() {
    check(
        json!({"initContainers": [
            {"name": "setup", "image": "x", "livenessProbe": {"exec": {"command": ["true"]}}},
            {"name": "side", "image": "x", "restartPolicy": "OnFailure"},
            {"name": "ok", "image": "x", "restartPolicy": "Always", "startupProbe": {"exec": {"command": ["true"]}}},
        ]}),
        json!({"restartPolicy": "Always"}),
        &[
            &format!("{C}.restartPolicy: Forbidden: may not be set for non-init containers"),
            "spec.template.spec.initContainers[0].livenessProbe: Forbidden: may not be set for init containers without restartPolicy=Always",
            "spec.template.spec.initContainers[1].restartPolicy: Unsupported value: \"OnFailure\": supported values: \"Always\"",
        ],
    );
}

#[test]
fn container_enums_and_security_context() {
    check(
        json!({}),
        json!({
            "imagePullPolicy": "Sometimes",
            "terminationMessagePolicy": "Log",
            "securityContext": {"privileged": true, "runAsUser": -1, "procMount": "Unmasked"},
        }),
        &[
            &format!(
                "{C}.terminationMessagePolicy: Unsupported value: \"Log\": supported values: \"File\", \"FallbackToLogsOnError\""
            ),
            &format!(
                "{C}.imagePullPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"IfNotPresent\", \"Never\""
            ),
            &format!("{C}.securityContext.privileged: Forbidden: disallowed by cluster policy"),
            &format!(
                "{C}.securityContext.runAsUser: Invalid value: -1: must be between 0 and 4294967295, inclusive"
            ),
            &format!(
                "{C}.securityContext.procMount: Invalid value: \"Unmasked\": `hostUsers` must be false to use `Unmasked`"
            ),
        ],
    );
}

#[test]
fn pod_level_fields() {
    check(
        json!({
            "restartPolicy": "Sometimes",
            "dnsPolicy": "Google",
            "nodeSelector": {"disk type": "ssd"},
            "activeDeadlineSeconds": 0,
            "hostname": "Host",
            "subdomain": "a.b",
            "serviceAccountName": "Bad_SA",
            "tolerations": [
                {"operator": "Equal", "value": "x"},
                {"key": "k", "operator": "Exists", "value": "v"},
                {"key": "k", "operator": "In", "effect": "Never"},
                {"key": "k", "tolerationSeconds": 5, "effect": "NoSchedule"},
            ],
            "securityContext": {"fsGroup": -5},
            "os": {"name": "plan9"},
        }),
        json!({}),
        &[
            "spec.template.spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
            "spec.template.spec.dnsPolicy: Unsupported value: \"Google\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"",
            "spec.template.spec.nodeSelector: Invalid value: \"disk type\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            "spec.template.spec.securityContext.fsGroup: Invalid value: -5: must be between 0 and 4294967295, inclusive",
            "spec.template.spec.serviceAccountName: Invalid value: \"Bad_SA\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            "spec.template.spec.activeDeadlineSeconds: Invalid value: 0: must be between 1 and 2147483647, inclusive",
            "spec.template.spec.hostname: Invalid value: \"Host\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            "spec.template.spec.subdomain: Invalid value: \"a.b\": must not contain dots",
            "spec.template.spec.tolerations[0].operator: Invalid value: \"Equal\": operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            "spec.template.spec.tolerations[1].operator: Invalid value: \"v\": value must be empty when `operator` is 'Exists'",
            "spec.template.spec.tolerations[2].operator: Unsupported value: \"In\": supported values: \"Equal\", \"Exists\"",
            "spec.template.spec.tolerations[2].effect: Unsupported value: \"Never\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
            "spec.template.spec.tolerations[3].effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute' when `tolerationSeconds` is set",
            "spec.template.spec.os.name: Unsupported value: \"plan9\": supported values: \"linux\", \"windows\"",
        ],
    );
    check(
        json!({"dnsPolicy": "None"}),
        json!({}),
        &[
            "spec.template.spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None",
        ],
    );
}

#[test]
fn template_metadata_and_ephemeral_containers() {
    check_template(
        json!({
            "metadata": {"labels": {"app": "-bad-"}},
            "spec": {
                "containers": [{"name": "main", "image": "x"}],
                "ephemeralContainers": [{"name": "debug", "image": "x", "targetContainerName": "nope", "ports": [{"containerPort": 80}]}],
            },
        }),
        &[
            "spec.template.labels: Invalid value: \"-bad-\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            "spec.template.spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"",
            "spec.template.spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
            "spec.template.spec.ephemeralContainers: Forbidden: ephemeral containers not allowed in pod template",
        ],
    );
}
