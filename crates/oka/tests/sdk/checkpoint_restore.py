"""A claimed sandbox upgraded by a SandboxUpdateOps of type CheckpointRestore, as the official e2b
Python SDK sees it (started by tests/sdk_e2e.rs): its processes survive the upgrade with their
memory, and the SDK goes on working.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID, KUBECONFIG.
"""
import os
import time

from e2b import Sandbox
from kubernetes import client, config

GROUP, VERSION, NS = "agents.kruise.io", "v1alpha1", "default"
COUNTER = """
import http.server
count = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        body = f"count={count}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8123), H).serve_forever()
"""
GET = "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8123/').read().decode())\""


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail!r}")
    print(f"ok {name}", flush=True)


def get(sbx):
    for _ in range(50):
        try:
            return sbx.commands.run(GET).stdout.strip()
        except Exception:  # the server may still be starting
            time.sleep(0.1)
    raise AssertionError("the counter does not answer")


config.load_kube_config(os.environ["KUBECONFIG"])
custom = client.CustomObjectsApi()

sbx = Sandbox.create(timeout=120)
sbx.files.write("/tmp/counter.py", COUNTER)
# As root: CRIU checkpoints another user's processes only with CAP_SYS_RESOURCE, which some
# hosts (containers) withhold from root.
server = sbx.commands.run("python3 /tmp/counter.py", background=True, user="root")
check("count 1", get(sbx) == "count=1")
check("count 2", get(sbx) == "count=2")

found = custom.list_namespaced_custom_object(
    GROUP, VERSION, NS, "sandboxes", label_selector=f"agents.kruise.io/sandbox-id={sbx.sandbox_id}"
)["items"]
name = found[0]["metadata"]["name"]
custom.patch_namespaced_custom_object(
    GROUP, VERSION, NS, "sandboxes", name, {"metadata": {"labels": {"upgrade-me": "yes"}}}
)
# The controllers' caches follow the store by a watch: let the label reach them.
time.sleep(0.5)
ops = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "SandboxUpdateOps",
    "metadata": {"name": "keep-processes"},
    "spec": {
        "selector": {"matchLabels": {"upgrade-me": "yes"}},
        "updateStrategy": {"type": "CheckpointRestore"},
        "patch": {"metadata": {"labels": {"upgraded": "yes"}}},
    },
}
custom.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxupdateops", ops)
deadline = time.time() + 90
while True:
    status = custom.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxupdateops", "keep-processes").get("status", {})
    if status.get("phase") in ("Completed", "Failed"):
        break
    if time.time() > deadline:
        raise AssertionError(f"not done: {status}")
    time.sleep(0.2)
upgraded = custom.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes", name)
check(
    "ops completed",
    status.get("phase") == "Completed" and status.get("updatedReplicas") == 1,
    (status, upgraded.get("status", {}).get("conditions")),
)
reasons = {c["type"]: c["reason"] for c in upgraded["status"].get("conditions", [])}
check("upgraded", reasons.get("Upgrading") == "Succeeded", reasons)
check(
    "template patched",
    upgraded["spec"]["template"]["metadata"]["labels"].get("upgraded") == "yes",
    upgraded["spec"]["template"],
)
# The same process, with its memory: the count goes on.
check("count 3 after the upgrade", get(sbx) == "count=3")
alive = sbx.commands.run(f"kill -0 {server.pid} && echo alive", user="root").stdout.strip()
check("the server is the same process", alive == "alive", alive)
sbx.kill()
print("all checks passed", flush=True)
