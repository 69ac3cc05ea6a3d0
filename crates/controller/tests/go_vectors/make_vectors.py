#!/usr/bin/env python3
"""Test vectors for oka's revision hashes, computed by a route independent of the Rust encoder.

Each vector is the JSON Go's encoding/json writes for the reference's structs, derived by hand
from the Go declarations (k8s.io/api v0.35, the reference's api/v1alpha1): field order is the
declaration order, omitempty fields that are empty are left out, structs are always written
(`"resources":{}`, `"metadata":{"creationTimestamp":null}`, `"status":{}`), quantities are
canonical (`1` stays `1`, `10Gi` stays `10Gi`, `500m`, `0.5Gi` is `512Mi`), `<`, `>`, `&` are
escaped as \\u003c, \\u003e, \\u0026. The hashes are then the reference's algorithms written
again here: FNV-1 32 (hash/fnv New32), decimal, SafeEncode; SHA-256 hex, 9 chars, SafeEncode.

Run `python3 make_vectors.py` to print the vectors the Rust test `revision::tests` pins.
"""
import hashlib
import json

ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def safe_encode(text):
    return "".join(ALPHABET[ord(c) % 27] for c in text)


def fnv1_32(data):
    h = 0x811C9DC5
    for b in data:
        h = (h * 0x01000193) % (1 << 32)
        h ^= b
    return h


def set_revision(go_json):
    json.loads(go_json)  # it is JSON
    return safe_encode(str(fnv1_32(go_json.encode())))


def sandbox_revision(go_json):
    json.loads(go_json)
    return safe_encode(hashlib.sha256(go_json.encode()).hexdigest()[:9])


# /work/shared/docs/crds/samples/sandboxset-code-interpreter.yaml: the effective
# SandboxTemplateSpec {Template, VolumeClaimTemplates} (no persistentContents, runtimes,
# pauseStrategy). `ImagePullPolicy` (capitalised) is not a field a case-sensitive decoder knows.
CODE_INTERPRETER = (
    '{"template":{"metadata":{"creationTimestamp":null},"spec":{'
    '"volumes":[{"name":"envd-volume","emptyDir":{}}],'
    '"initContainers":[{"name":"init","image":"openkruise/agent-runtime:preview-v0.0.2",'
    '"env":[{"name":"ENVD_DIR","value":"/mnt/envd"}],"resources":{},"restartPolicy":"Always",'
    '"volumeMounts":[{"name":"envd-volume","mountPath":"/mnt/envd"}]}],'
    '"containers":[{"name":"sandbox","image":"e2bdev/code-interpreter:latest",'
    '"env":[{"name":"PORT","value":"49999"},{"name":"ENVD_DIR","value":"/mnt/envd"}],'
    '"resources":{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"1","memory":"1Gi"}},'
    '"volumeMounts":[{"name":"envd-volume","mountPath":"/mnt/envd"}],'
    '"startupProbe":{"httpGet":{"path":"/health","port":49999},"initialDelaySeconds":1,'
    '"timeoutSeconds":1,"periodSeconds":2,"failureThreshold":20},'
    '"lifecycle":{"postStart":{"exec":{"command":["bash","/mnt/envd/envd-run.sh"]}}}}],'
    '"terminationGracePeriodSeconds":1}},'
    '"volumeClaimTemplates":[{"metadata":{"name":"www","creationTimestamp":null},'
    '"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"10Gi"}},'
    '"storageClassName":"alicloud-disk-ssd"},"status":{}}]}'
)

# A pool with every pool-level field, HTML characters, and quantities to canonicalise:
# template labels {"app": "a<b>&c"}, container "main" image "busybox" command ["sh","-c","x > y"],
# ports [{containerPort: 8080, protocol: TCP}], resources requests {cpu: "500m", memory:
# "0.5Gi"}, tolerations [{operator: Exists}]; persistentContents ["memory"]; runtimes
# [{name: "csi"}]; pauseStrategy {type: "Stop"}.
FULL_POOL = (
    '{"template":{"metadata":{"creationTimestamp":null,"labels":{"app":"a\\u003cb\\u003e\\u0026c"}},'
    '"spec":{"containers":[{"name":"main","image":"busybox","command":["sh","-c","x \\u003e y"],'
    '"ports":[{"containerPort":8080,"protocol":"TCP"}],'
    '"resources":{"requests":{"cpu":"500m","memory":"512Mi"}}}],'
    '"tolerations":[{"operator":"Exists"}]}},'
    '"persistentContents":["memory"],"runtimes":[{"name":"csi"}],'
    '"pauseStrategy":{"type":"Stop"}}'
)

# /work/shared/docs/crds/samples/sandbox.yaml: the Sandbox revision hashes `spec.template`.
SANDBOX_TEMPLATE = (
    '{"metadata":{"creationTimestamp":null},"spec":{"containers":[{"name":"sandbox",'
    '"image":"nginx:latest","resources":{},"volumeMounts":[{"name":"www","mountPath":"/data"}]}]}}'
)

if __name__ == "__main__":
    print("code-interpreter pool:", set_revision(CODE_INTERPRETER))
    print("full pool:", set_revision(FULL_POOL))
    print("sandbox sample:", sandbox_revision(SANDBOX_TEMPLATE))
