"""A sandbox restarted through the Kubernetes API (what `okactl restart sbx` asks for), as the
official e2b Python SDK sees it (started by tests/sdk_e2e.rs).

The sandbox keeps its ID and its files; its processes are new; the claim's environment variables
and access token are sent to the new agent runtime again, so the SDK goes on working.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID, KUBECONFIG.
"""
import os
import time

from e2b import Sandbox
from kubernetes import client, config

GROUP, VERSION, NS = "agents.kruise.io", "v1alpha1", "default"


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail!r}")
    print(f"ok {name}", flush=True)


config.load_kube_config(os.environ["KUBECONFIG"])
custom = client.CustomObjectsApi()

sbx = Sandbox.create(envs={"OKA_RESTART": "kept"}, timeout=120)
check("env before", sbx.commands.run("echo $OKA_RESTART").stdout.strip() == "kept")
sbx.files.write("/home/user/before-restart.txt", "still here")
sleeper = sbx.commands.run("sleep 1000", background=True)
LIST = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1000' || true"
check("the command runs", sbx.commands.run(LIST).stdout.strip() == "1")

found = custom.list_namespaced_custom_object(
    GROUP, VERSION, NS, "sandboxes", label_selector=f"agents.kruise.io/sandbox-id={sbx.sandbox_id}"
)["items"]
check("one sandbox object", len(found) == 1, found)
name = found[0]["metadata"]["name"]
requested = "2026-12-05T12:00:00.123456Z"
custom.patch_namespaced_custom_object(
    GROUP, VERSION, NS, "sandboxes", name,
    {"metadata": {"annotations": {"agents.kruise.io/restart-requested-at": requested}}},
)


def initialized(obj):
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c["type"] == "RuntimeInitialized" and c["status"] == "True" for c in conditions)


deadline = time.time() + 60
while True:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes", name)
    done = obj["metadata"].get("annotations", {}).get("agents.kruise.io/restarted-at")
    if done == requested and obj["status"].get("phase") == "Running" and initialized(obj):
        break
    if time.time() > deadline:
        raise AssertionError(f"not restarted: {obj['metadata'].get('annotations')} {obj.get('status')}")
    time.sleep(0.2)
check("restarted and initialised again", True)

check("env after", sbx.commands.run("echo $OKA_RESTART").stdout.strip() == "kept")
check("files kept", sbx.files.read("/home/user/before-restart.txt") == "still here")
# Pids start again in the new processes' namespace: look for the command itself.
left = sbx.commands.run(LIST).stdout.strip()
check("processes new", left == "0", left)
sbx.kill()
print("all checks passed", flush=True)
