"""The newest e2b Python SDK against `oka serve`: the edges of the API (started by tests/sdk_e2e.rs).

Concurrent creates never share a sandbox; listing pages with metadata filters; bad keys (401)
and unknown IDs (404); a drained pool answers fast and retryably; a request through the gateway
to a paused sandbox wakes it and is served.

Environment: as e2e.py, plus OKA_POOL (the warm pool's size).
"""
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from e2b import AuthenticationException, Sandbox, SandboxQuery, SandboxState

RUN = os.environ["OKA_RUN_ID"]
API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def api(method, path, body=None, key=KEY):
    """One raw API call; (status, headers, body)."""
    data = None if body is None else body.encode()
    req = urllib.request.Request(f"{API}{path}", data=data, method=method)
    req.add_header("X-API-Key", key)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


# ---- concurrent creates: eight callers, eight different sandboxes, each really theirs ----------
def create_and_mark(i):
    sbx = Sandbox.create(template="base", timeout=120, metadata={"run": RUN, "n": str(i)})
    sbx.files.write("/home/user/owner", f"caller-{i}")
    return sbx


with ThreadPoolExecutor(8) as pool:
    sandboxes = list(pool.map(create_and_mark, range(8)))
ids = [s.sandbox_id for s in sandboxes]
check("concurrent creates are distinct", len(set(ids)) == 8, ids)
for i, sbx in enumerate(sandboxes):
    owner = sbx.files.read("/home/user/owner")
    check(f"sandbox {i} is its caller's alone", owner == f"caller-{i}", owner)

# ---- list: metadata filter and paging ------------------------------------------------------------
pager = Sandbox.list(query=SandboxQuery(metadata={"run": RUN}), limit=3)
pages = []
while pager.has_next:
    pages.append([s.sandbox_id for s in pager.next_items()])
check("paging", [len(p) for p in pages][:2] == [3, 3] and sum(map(len, pages)) == 8, pages)
check("paging covers all", sorted(sum(pages, [])) == sorted(ids), pages)
only = Sandbox.list(query=SandboxQuery(metadata={"run": RUN, "n": "5"})).next_items()
check("metadata filter", [s.sandbox_id for s in only] == [ids[5]], only)
for sbx in sandboxes:
    sbx.kill()

# ---- keys and IDs ----------------------------------------------------------------------------
try:
    Sandbox.create(template="base", api_key="e2b_" + "0" * 40)
    check("bad key", False, "created")
except AuthenticationException:
    check("bad key", True)
status, _, body = api("GET", "/sandboxes/nosuchsandbox0")
check("unknown id 404", status == 404 and '"code":404' in body.replace(" ", ""), (status, body))
check("unknown id kill", Sandbox.kill("nosuchsandbox0") is False)

# ---- a drained pool answers at once with a retryable status ---------------------------------
body = '{"templateID":"base","metadata":{"e2b.agents.kruise.io/create-on-no-stock":"false"}}'
held = []
started = time.monotonic()
for _ in range(int(os.environ["OKA_POOL"]) + 2):
    status, headers, answer = api("POST", "/v2/sandboxes", body)
    if status == 201:
        held.append(answer)
        continue
    break
took = time.monotonic() - started
check("drained pool 503", status == 503 and headers.get("Retry-After"), (status, answer))
check("drained pool answers fast", took < 5, took)
for answer in held:
    import json

    api("DELETE", f"/sandboxes/{json.loads(answer)['sandboxID']}")

# ---- wake on request: a paused auto-resume sandbox is woken by traffic through the gateway ---
deadline = time.monotonic() + 60
while True:  # the pool refills after the drain above
    try:
        sbx = Sandbox.create(template="base", timeout=120, metadata={"run": RUN},
                             lifecycle={"on_timeout": "pause", "auto_resume": True})
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
sbx.commands.run("echo before > /tmp/state")
check("pause for wake", sbx.pause() is True)
state = Sandbox.get_info(sbx.sandbox_id).state
check("is paused", state == SandboxState.PAUSED, state)
r = sbx.commands.run("cat /tmp/state")  # no connect: the gateway wakes it
check("woken by a request", r.stdout == "before\n", r.stdout)
state = Sandbox.get_info(sbx.sandbox_id).state
check("running after wake", state == SandboxState.RUNNING, state)
sbx.kill()
print("all checks passed", flush=True)
