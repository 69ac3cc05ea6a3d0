"""The official Python Kubernetes client against oka serve's Kubernetes API.

Run with KUBECONFIG set to the kubeconfig oka serve writes. Prints "ok" when every check holds.
"""

import os
import threading

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

GROUP, VERSION, NS = "agents.kruise.io", "v1alpha1", "default"

config.load_kube_config(os.environ["KUBECONFIG"])
custom = client.CustomObjectsApi()
core = client.CoreV1Api()


def expect_error(status, reason, call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except ApiException as e:
        assert e.status == status, (e.status, e.body)
        assert f'"reason":"{reason}"' in e.body.replace(" ", ""), e.body
        return e
    raise AssertionError(f"{call.__name__} succeeded; expected {status} {reason}")


# List, then watch from the list's resourceVersion in the background.
pools = custom.list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxsets")
assert any(p["metadata"]["name"] == "base" for p in pools["items"]), pools
rv = pools["metadata"]["resourceVersion"]
seen = []
done = threading.Event()


def watcher():
    w = watch.Watch()
    for event in w.stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        NS,
        "sandboxsets",
        resource_version=rv,
        timeout_seconds=20,
    ):
        obj = event["object"]
        seen.append((event["type"], obj["metadata"]["name"], obj["spec"].get("replicas")))
        if event["type"] == "DELETED" and obj["metadata"]["name"] == "py-pool":
            w.stop()
    done.set()


thread = threading.Thread(target=watcher)
thread.start()

pool = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "SandboxSet",
    "metadata": {"name": "py-pool", "labels": {"made-by": "python"}},
    "spec": {
        "replicas": 0,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
    },
}
created = custom.create_namespaced_custom_object(GROUP, VERSION, NS, "sandboxsets", pool)
assert created["metadata"]["uid"], created
expect_error(409, "AlreadyExists", custom.create_namespaced_custom_object, GROUP, VERSION, NS, "sandboxsets", pool)

# The scale subresource, a merge patch, and optimistic concurrency.
custom.patch_namespaced_custom_object_scale(
    GROUP, VERSION, NS, "sandboxsets", "py-pool", {"spec": {"replicas": 1}}
)
scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, NS, "sandboxsets", "py-pool")
assert scale["spec"]["replicas"] == 1, scale
for _ in range(10):
    # The pool's controller writes its status meanwhile: read again on a conflict.
    current = custom.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxsets", "py-pool")
    current["spec"]["replicas"] = 0
    try:
        custom.replace_namespaced_custom_object(GROUP, VERSION, NS, "sandboxsets", "py-pool", current)
        break
    except ApiException as e:
        assert e.status == 409, e.body
# Replaced again with the version it had before its own replace: stale.
expect_error(409, "Conflict", custom.replace_namespaced_custom_object, GROUP, VERSION, NS, "sandboxsets", "py-pool", current)

# Selectors, errors, and admission.
labelled = custom.list_namespaced_custom_object(
    GROUP, VERSION, NS, "sandboxsets", label_selector="made-by=python"
)
assert [p["metadata"]["name"] for p in labelled["items"]] == ["py-pool"], labelled
expect_error(404, "NotFound", custom.get_namespaced_custom_object, GROUP, VERSION, NS, "sandboxsets", "nope")
bad = dict(pool, metadata={"name": "py-bad"}, spec=dict(pool["spec"], replicas="two"))
error = expect_error(422, "Invalid", custom.create_namespaced_custom_object, GROUP, VERSION, NS, "sandboxsets", bad)
assert "spec.replicas in body must be of type integer" in error.body, error.body

# A core kind through the typed client.
core.create_namespaced_config_map(
    NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py-config"), data={"a": "b"})
)
maps = core.list_namespaced_config_map(NS)
assert [m.metadata.name for m in maps.items] == ["py-config"], maps
assert core.read_namespaced_config_map("py-config", NS).data == {"a": "b"}
core.delete_namespaced_config_map("py-config", NS)

# Options are honoured or refused, never ignored: a create's field manager owns its fields,
# `force` belongs to apply patches, a get waits for no version the server has not reached,
# and `sendInitialEvents` is for watches.
made = core.create_namespaced_config_map(
    NS,
    client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py-managed"), data={"a": "b"}),
    field_manager="py-tool",
)
owners = [(m.manager, m.operation) for m in made.metadata.managed_fields or []]
assert owners == [("py-tool", "Update")], owners
core.delete_namespaced_config_map("py-managed", NS)
error = expect_error(
    422, "Invalid", custom.patch_namespaced_custom_object,
    GROUP, VERSION, NS, "sandboxsets", "py-pool", {"spec": {"replicas": 0}}, force=True,
)
assert "force: Forbidden: may not be specified for non-apply patch" in error.body, error.body
raw = client.ApiClient()
pool_path = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/sandboxsets/py-pool"


def raw_get(path, query):
    request = raw.param_serialize("GET", path, query_params=query, auth_settings=["BearerToken"])
    response = raw.call_api(*request)
    response.read()
    return raw.response_deserialize(response, {"200": "object"}).data


assert raw_get(pool_path, [("resourceVersion", "1")])["metadata"]["name"] == "py-pool"
error = expect_error(504, "Timeout", raw_get, pool_path, [("resourceVersion", "999999999999")])
assert "Too large resource version: 999999999999" in error.body, error.body
error = expect_error(
    422, "Invalid", raw_get,
    f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/sandboxsets", [("sendInitialEvents", "true")],
)
assert "sendInitialEvents is forbidden for list" in error.body, error.body

custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "sandboxsets", "py-pool")
thread.join(30)
assert done.is_set(), "the watch did not end"
names = [(t, n) for t, n, _ in seen if n == "py-pool"]
assert names[0] == ("ADDED", "py-pool"), seen
assert ("MODIFIED", "py-pool") in names, seen
assert names[-1] == ("DELETED", "py-pool"), seen
replicas = [r for t, n, r in seen if n == "py-pool" and t == "MODIFIED"]
assert 1 in replicas, seen
print("ok")
