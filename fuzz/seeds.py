#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/): small real inputs, as the E2B
SDKs, kubectl and sandboxes send them. Run it again after editing; the files are committed.
A crash the fuzzers found is kept in the corpus under a name of its own (crash-*), not here."""
import hashlib
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
NUL = b"\0"


def write(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def j(value):
    return json.dumps(value, separators=(",", ":")).encode()


ENVD = ("x-access-token: envd-token-123\r\ne2b-sandbox-id: sbxd0b5d60f1bb1499bb\r\n"
        "e2b-sandbox-port: 49983\r\nuser-agent: e2b-python-sdk/2.63.0\r\n")

# --- gateway: request heads (the SDK's envd calls through the gateway), response heads, bodies
write("gateway_request_head", "sdk-start",
      "POST /process.Process/Start HTTP/1.1\r\nHost: 49983-sbxd0b5d60f1bb1499bb.oka.test\r\n"
      "content-type: application/connect+json\r\nconnect-protocol-version: 1\r\n"
      "connect-timeout-ms: 60000\r\n" + ENVD + "transfer-encoding: chunked\r\n\r\n")
write("gateway_request_head", "sdk-read",
      "GET /files?path=%2Ftmp%2Fa HTTP/1.1\r\nHost: 127.0.0.1:3002\r\n" + ENVD +
      "accept-encoding: gzip, deflate\r\nConnection: keep-alive\r\n\r\n")
write("gateway_request_head", "path-routed",
      "GET /kruise/sbxd0b5d60f1bb1499bb/8080/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Connection: keep-alive\r\nKeep-Alive: 5\r\nTE: trailers\r\n"
      "e2b-traffic-access-token: t0k\r\nContent-Length: 5\r\n\r\nhello")
write("gateway_request_head", "websocket",
      "GET /ws HTTP/1.1\r\nHost: 8080-sbx1.oka.test\r\nUpgrade: websocket\r\n"
      "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
write("gateway_request_head", "no-sandbox", "GET / HTTP/1.1\r\nHost: oka.test\r\n\r\n")
write("gateway_response_head", "connect-stream",
      "HTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n")
write("gateway_response_head", "files-json",
      "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 43\r\n"
      "connection: keep-alive, x-hop\r\nx-hop: 1\r\n\r\n")
write("gateway_response_head", "continue", "HTTP/1.1 100 Continue\r\n\r\n")
write("gateway_response_head", "http10", "HTTP/1.0 404 Not Found\r\nConnection: keep-alive\r\n\r\n")
write("gateway_response_head", "gzip-until-close",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n")
write("gateway_chunked", "two-chunks", b"\x03\x01\x05\x07" + b"4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\n\r\n")
write("gateway_chunked", "trailers", b"\x00" + b"a\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nNEXT")

# --- envd: fast-path heads, Connect bodies, multipart uploads
write("envd_fast_head", "sdk-read",
      "GET /files?path=%2Ftmp%2Fa&username=user HTTP/1.1\r\nHost: 127.0.0.1:49983\r\n" + ENVD +
      "accept-encoding: gzip, deflate\r\n\r\n")
write("envd_fast_head", "octet-upload",
      "POST /files?path=%2Fhome%2Fuser%2Fbig.bin&signature=v1_a+b%2Bc&signature_expiration=9 "
      "HTTP/1.1\r\nHost: 127.0.0.1:49983\r\ncontent-type: application/octet-stream\r\n"
      "content-length: 1048576\r\nx-metadata-owner: me\r\n\r\n")
write("envd_fast_head", "init",
      "POST /init HTTP/1.1\r\nHost: 10.0.0.2:49983\r\ncontent-type: application/json\r\n"
      "content-length: 64\r\n\r\n" + '{"envVars":{"A":"1"},"accessToken":"envd-token-123","timestamp":1}')


def envelope(flags, payload):
    return struct.pack(">BI", flags, len(payload)) + payload


start = j({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "b"},
                       "cwd": "/home/user"}, "stdin": False})
write("envd_connect", "start-json", b"\x00" + envelope(0, start))
write("envd_connect", "update-json", b"\x02" + envelope(0, j({"process": {"pid": 4242},
                                                                 "pty": {"size": {"cols": 80, "rows": 24}}})))
write("envd_connect", "send-input-json", b"\x04" + envelope(0, j({"process": {"tag": "t"},
                                                                     "input": {"stdin": "aGkK"}})))
write("envd_connect", "stream-input-json",
      b"\x06" + envelope(0, j({"start": {"process": {"pid": 1}}})) + envelope(0, j({"data": {"input": {"pty": "eA=="}}}))
      + envelope(2, b"{}"))
write("envd_connect", "signal-json", b"\x08" + envelope(0, j({"process": {"pid": 7}, "signal": "SIGNAL_SIGKILL"})))
write("envd_connect", "list-dir-json", b"\x0a" + envelope(0, j({"path": "/home/user", "depth": 2})))
write("envd_connect", "move-json", b"\x0c" + envelope(0, j({"source": "/tmp/a", "destination": "/tmp/b"})))
write("envd_connect", "watch-json", b"\x0e" + envelope(0, j({"path": "/tmp", "recursive": True})))
# Binary protobuf: StartRequest{process: ProcessConfig{cmd: "ls", args: ["-la"]}}.
config = b"\x0a\x02ls" + b"\x12\x03-la"
write("envd_connect", "start-proto", b"\x01" + envelope(0, b"\x0a" + bytes([len(config)]) + config))
write("envd_connect", "end-only", b"\x00" + envelope(2, b"{}"))
boundary = "881d1b3d6209fcccc09fc5200e30eebf"
write("envd_multipart", "sdk-write",
      f"multipart/form-data; boundary={boundary}\n--{boundary}\r\n"
      'Content-Disposition: form-data; name="file"; filename="/tmp/a"\r\n'
      f"Content-Type: application/octet-stream\r\n\r\nx\r\n--{boundary}--\r\n")
write("envd_multipart", "sdk-write-files",
      f"multipart/form-data; boundary={boundary}\n--{boundary}\r\n"
      'Content-Disposition: form-data; name="file"; filename="/tmp/a"\r\n\r\none\r\n'
      f"--{boundary}\r\n"
      'Content-Disposition: form-data; name="file"; filename="b/c.txt"\r\n\r\ntwo\r\n'
      f"--{boundary}--\r\n")

# --- manager: create bodies and list queries
write("manager_create_body", "sdk-default", j({"templateID": "base", "metadata": {}, "envVars": {}}))
write("manager_create_body", "sdk-options",
      j({"templateID": "base", "autoPause": True, "autoResume": {"enabled": True},
         "allow_internet_access": False, "network": {"allowOut": ["1.1.1.1"]},
         "metadata": {}, "envVars": {}, "timeout": 120}))
write("manager_create_body", "legacy-v1",
      j({"templateID": "code-interpreter-v1", "timeout": 300, "secure": True,
         "metadata": {"user": "a b", "label:team": "ml"}, "envVars": {"K": "v"}}))
write("manager_create_body", "extensions",
      j({"templateID": "base", "metadata": {
          "e2b.agents.kruise.io/never-timeout": "true",
          "e2b.agents.kruise.io/reserve-paused-sandbox-duration": "1h30m",
          "e2b.agents.kruise.io/wait-ready-timeout-seconds": "30",
          "e2b.agents.kruise.io/image": "python:3.12",
          "e2b.agents.kruise.io/cpu-request": "500m",
          "e2b.agents.kruise.io/cpu-limit": "2",
          "e2b.agents.kruise.io/create-on-no-stock": "false"},
          "network": {"allowPublicTraffic": False, "denyOut": ["0.0.0.0/0"],
                      "allowOut": ["example.com", "*.github.com", "10.0.0.0/8"]},
          "autoPauseMemory": False}))
write("manager_create_body", "unsupported", j({"templateID": "base", "mcp": {"x": {}},
                                               "volumeMounts": [{"name": "v", "path": "/v"}]}))
write("manager_list_query", "sdk-list", "metadata=user%3Da%2520b%26env%3Dprod&state=running%2Cpaused&limit=10")
write("manager_list_query", "paged",
      "state=paused&order=asc&template=base&startedAfter=2026-01-01T00:00:00Z&nextToken="
      "eyJrZXkiOiIyMDI2LTAxLTAxVDAwOjAwOjAwWiIsImlkIjoic2J4MSJ9")
write("manager_list_query", "literal-percent", "metadata=k%3D100%25&c=3")

# --- Kubernetes API: patches, server-side apply, protobuf bodies, selectors, admission
claim = {"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxClaim",
         "metadata": {"name": "c1", "namespace": "default", "labels": {"app": "web"}},
         "spec": {"templateName": "base", "replicas": 2}}
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
       "spec": {"containers": [{"name": "a", "image": "nginx", "env": [{"name": "X", "value": "1"}]},
                               {"name": "b", "image": "busybox"}]}}
write("kube_patch", "merge-label", b"\x00" + j(claim) + NUL + j({"metadata": {"labels": {"app": None, "tier": "x"}}}))
write("kube_patch", "merge-scale", b"\x00" + j(claim) + NUL + j({"spec": {"replicas": 3}}))
write("kube_patch", "strategic-containers", b"\x01" + j(pod) + NUL + j(
    {"spec": {"containers": [{"name": "a", "image": "nginx:2"}, {"name": "b", "$patch": "delete"}],
              "$setElementOrder/containers": [{"name": "a"}]}}))
write("kube_patch", "strategic-replace", b"\x01" + j(pod) + NUL + j(
    {"metadata": {"labels": {"$patch": "replace", "a": "b"}},
     "spec": {"$retainKeys": ["containers"], "$deleteFromPrimitiveList/finalizers": ["x"]}}))
write("kube_patch", "json-patch", b"\x02" + j(claim) + NUL + j(
    [{"op": "test", "path": "/spec/replicas", "value": 2},
     {"op": "replace", "path": "/spec/replicas", "value": 5},
     {"op": "add", "path": "/metadata/labels/a~1b", "value": "c"},
     {"op": "remove", "path": "/metadata/labels/app"},
     {"op": "copy", "from": "/spec", "path": "/status"},
     {"op": "move", "from": "/status", "path": "/spec2"},
     {"op": "add", "path": "/metadata/finalizers", "value": []},
     {"op": "add", "path": "/metadata/finalizers/-", "value": "f"}]))
sandbox_set = ("apiVersion: agents.kruise.io/v1alpha1\nkind: SandboxSet\nmetadata:\n  name: base\n"
               "spec:\n  replicas: 3\n  template:\n    spec:\n      containers:\n      - name: main\n"
               "        image: python:3.12\n        ports:\n        - containerPort: 49983\n")
write("kube_apply", "create", b"\x00" + b"{}" + NUL + sandbox_set.encode())
live = {"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet",
        "metadata": {"name": "base", "managedFields": [
            {"manager": "kubectl", "operation": "Update", "apiVersion": "agents.kruise.io/v1alpha1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]},
        "spec": {"replicas": 1}}
write("kube_apply", "conflict", b"\x02" + j(live) + NUL + sandbox_set.encode())
write("kube_apply", "force", b"\x03" + j(live) + NUL + sandbox_set.encode())


def field(number, payload):
    return bytes([number << 3 | 2]) + bytes([len(payload)]) + payload


config_map = field(1, field(1, b"v1") + field(2, b"ConfigMap")) + field(2, field(1, field(1, b"cm") + field(3, b"default")) + field(2, field(1, b"k") + field(2, b"v")))
write("kube_protobuf", "config-map", b"k8s\0" + config_map)
write("kube_protobuf", "type-only", b"k8s\0" + field(1, field(1, b"agents.kruise.io/v1alpha1") + field(2, b"SandboxClaim")))
write("selectors", "equality", "app=web,tier!=db")
write("selectors", "set", "env in (prod, staging),!canary,agents.kruise.io/pool,tier notin (a)")
write("selectors", "field", "metadata.name=a,metadata.namespace!=kube-system")
write("selectors", "double", "app==web,status.phase=Running")
write("admission", "claim-create", b"\x00" + j(claim))
write("admission", "claim-update", b"\x00" + j(claim) + NUL + j(claim))
for i, kind_obj in enumerate([
    {"apiVersion": "agents.kruise.io/v1alpha1", "kind": "Sandbox", "metadata": {"name": "s"},
     "spec": {"template": {"spec": {"containers": [{"name": "m", "image": "i"}]}}}},
    {"apiVersion": "agents.kruise.io/v1alpha1", "kind": "SandboxSet", "metadata": {"name": "b"},
     "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "m", "image": "i",
              "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}}},
]):
    for k in range(8):
        write("admission", f"obj{i}-kind{k}", bytes([k | 0x10]) + j(kind_obj))
    write("admission", f"obj{i}-status", bytes([0x80 | 0x20 | i]) + j(kind_obj) + NUL + j(kind_obj))
