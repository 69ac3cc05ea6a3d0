"""The newest e2b Python SDK against `oka serve`: egress policies (started by tests/sdk_e2e.rs).

The test made an outside world in a network namespace: A and B (TEST-NET addresses) listen on
ports, and the host listens on every address. From inside sandboxes: the default reaches A and B
but never the host nor another sandbox; `allow_internet_access=False` reaches nothing;
`deny_out` blocks A only; `update_network` changes that live, `allow_out` winning over
`deny_out`; it survives a pause and resume; bad entries are 400 naming them. The network
options are the reference's TrafficPolicy (`kubectl get tp`), and a TrafficPolicy or a
GlobalTrafficPolicy applied with kubectl changes a sandbox's egress live, in one priority order
(and its deletion changes it back).

Environment: as e2e.py, plus OKA_A and OKA_B (addr:port), OKA_HOST_PORT, and OKA_KUBECTL and
OKA_KUBECONFIG (kubectl against this `oka serve`).
"""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

from e2b import Sandbox

A = os.environ["OKA_A"]
B = os.environ["OKA_B"]
HOST_PORT = os.environ["OKA_HOST_PORT"]
API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]

PROBE = r"""
import socket, struct, sys
def gateway():
    for line in open('/proc/net/route').read().splitlines()[1:]:
        f = line.split()
        if f[1] == '00000000':
            return socket.inet_ntoa(struct.pack('<I', int(f[2], 16)))
    return '0.0.0.0'
out = []
for target in sys.argv[1:]:
    addr, port = target.rsplit(':', 1)
    addr = gateway() if addr == 'gw' else addr
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((addr, int(port))); out.append('ok')
    except OSError:
        out.append('no')
print(' '.join(out))
"""


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def reach(sbx, *targets):
    sbx.files.write("/tmp/probe.py", PROBE)
    return sbx.commands.run("python3 /tmp/probe.py " + " ".join(targets)).stdout.split()


def api(method, path, body):
    req = urllib.request.Request(f"{API}{path}", data=json.dumps(body).encode(), method=method)
    req.add_header("X-API-Key", KEY)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


host = f"gw:{HOST_PORT}"
default = Sandbox.create(timeout=300)
got = reach(default, A, B, host)
check("default reaches the outside, never the host", got == ["ok", "ok", "no"], got)

closed = Sandbox.create(timeout=300, allow_internet_access=False)
got = reach(closed, A, B, host)
check("allow_internet_access=False reaches nothing", got == ["no", "no", "no"], got)

denied = Sandbox.create(timeout=300, network={"deny_out": ["198.51.100.0/24"]})
got = reach(denied, A, B)
check("deny_out blocks its network only", got == ["no", "ok"], got)

# Another sandbox's listener is out of reach.
denied.commands.run("python3 -m http.server 8000 --bind 0.0.0.0", background=True)
peer = denied.commands.run("hostname -I").stdout.split()[0]
got = reach(default, f"{peer}:8000")
check("another sandbox is unreachable", got == ["no"], got)

denied.update_network({"allow_out": [A.split(":")[0]], "deny_out": ["0.0.0.0/0"]})
got = reach(denied, A, B)
check("update_network applies live; allow_out wins over deny_out", got == ["ok", "no"], got)

denied.pause()
denied = Sandbox.connect(denied.sandbox_id)
got = reach(denied, A, B)
check("the policy survives pause and resume", got == ["ok", "no"], got)

status, body = api("POST", "/sandboxes", {"templateID": "base", "network": {"allowOut": ["*.example.com"]}})
check("a wildcard domain is 400", status == 400 and "*.example.com" in body, (status, body))
status, body = api("PUT", f"/sandboxes/{denied.sandbox_id}/network", {"denyOut": ["1.2.3.4/40"]})
check("a bad CIDR is 400 naming it", status == 400 and "1.2.3.4/40" in body, (status, body))

KUBECTL = [os.environ["OKA_KUBECTL"], "--kubeconfig", os.environ["OKA_KUBECONFIG"]]


def kubectl(*args, stdin=None):
    done = subprocess.run(KUBECTL + list(args), input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"kubectl {args}: {done.stderr}")
    return done.stdout


def eventually(name, probe, want, within=20):
    deadline = time.time() + within
    got = probe()
    while got != want and time.time() < deadline:
        time.sleep(0.2)
        got = probe()
    check(name, got == want, got)


# The network options are a TrafficPolicy of the reference's shape.
policies = json.loads(kubectl("get", "tp", "-A", "-o", "json"))["items"]
mine = [p for p in policies
        if p["metadata"].get("annotations", {}).get("agents.kruise.io/sandbox-id") == denied.sandbox_id]
check("the network options are a TrafficPolicy", len(mine) == 1, policies)
tp = mine[0]
check("named tp-, priority 100, owned by the sandbox",
      tp["metadata"]["name"].startswith("tp-") and tp["spec"]["priority"] == 100
      and tp["metadata"]["ownerReferences"][0]["kind"] == "Sandbox"
      and tp["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is False, tp)
check("allow-list then reject",
      [r["action"] for r in tp["spec"]["egress"]["rules"]] == ["allow", "reject"], tp["spec"])
table = kubectl("get", "tp", "-A")
check("kubectl get tp prints the priority", "PRIORITY" in table and " 100 " in table, table)
eventually("the controller accepts it",
           lambda: [c["status"] for c in json.loads(kubectl("get", "tp", "-n", tp["metadata"]["namespace"],
                    tp["metadata"]["name"], "-o", "json")).get("status", {}).get("conditions", [])
                    if c["type"] == "Accepted"], ["True"])

# A TrafficPolicy applied with kubectl changes a running sandbox's egress.
sandboxes = json.loads(kubectl("get", "sbx", "-A", "-o", "json"))["items"]
target = [s for s in sandboxes
          if s["metadata"].get("labels", {}).get("agents.kruise.io/sandbox-id") == default.sandbox_id][0]
ns, name = target["metadata"]["namespace"], target["metadata"]["name"]
a_addr, a_port = A.split(":")
kubectl("apply", "-f", "-", stdin=f"""
apiVersion: agents.kruise.io/v1alpha1
kind: TrafficPolicy
metadata: {{name: no-a, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{agents.kruise.io/sandbox-name: {name}}}}}
  egress:
    rules:
    - action: reject
      to: [{{cidr: {a_addr}/32}}]
      ports: [{{protocol: TCP, port: {a_port}}}]
""")
eventually("kubectl apply of a TrafficPolicy rejects A's port", lambda: reach(default, A, B), ["no", "ok"])
kubectl("apply", "-f", "-", stdin=f"""
apiVersion: agents.kruise.io/v1alpha1
kind: TrafficPolicy
metadata: {{name: to-a-service, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{app: nothing}}}}
  egress: {{rules: [{{action: allow, to: [{{service: {{name: db}}}}]}}]}}
""")
eventually("a Service peer is not accepted, naming why",
           lambda: [(c["status"], c["reason"]) for c in json.loads(kubectl("get", "tp", "-n", ns, "to-a-service",
                    "-o", "json")).get("status", {}).get("conditions", []) if c["type"] == "Accepted"],
           [("False", "UnresolvablePeer")])
kubectl("delete", "tp", "-n", ns, "no-a", "to-a-service")
eventually("deleting it gives the sandbox its network back", lambda: reach(default, A, B), ["ok", "ok"])

# A GlobalTrafficPolicy (cluster-scoped) applied with kubectl selects sandboxes of every
# namespace, in one priority order with the namespace's TrafficPolicies.
b_addr, b_port = B.split(":")
kubectl("apply", "-f", "-", stdin=f"""
apiVersion: agents.kruise.io/v1alpha1
kind: GlobalTrafficPolicy
metadata: {{name: no-b}}
spec:
  selector: {{matchLabels: {{agents.kruise.io/sandbox-name: {name}}}}}
  egress:
    rules:
    - action: reject
      to: [{{cidr: {b_addr}/32}}]
      ports: [{{protocol: TCP, port: {b_port}}}]
""")
check("kubectl get gtp lists it", "no-b" in kubectl("get", "gtp"), kubectl("get", "gtp"))
eventually("kubectl apply of a GlobalTrafficPolicy rejects B's port", lambda: reach(default, A, B), ["ok", "no"])
eventually("the controller accepts the GlobalTrafficPolicy",
           lambda: [c["status"] for c in json.loads(kubectl("get", "gtp", "no-b", "-o", "json"))
                    .get("status", {}).get("conditions", []) if c["type"] == "Accepted"], ["True"])
kubectl("apply", "-f", "-", stdin=f"""
apiVersion: agents.kruise.io/v1alpha1
kind: TrafficPolicy
metadata: {{name: allow-b, namespace: {ns}}}
spec:
  priority: 2000
  selector: {{matchLabels: {{agents.kruise.io/sandbox-name: {name}}}}}
  egress: {{rules: [{{action: allow, to: [{{cidr: {b_addr}/32}}]}}]}}
""")
eventually("a TrafficPolicy of higher priority goes first", lambda: reach(default, A, B), ["ok", "ok"])
kubectl("delete", "tp", "-n", ns, "allow-b")
eventually("without it the global rule holds again", lambda: reach(default, A, B), ["ok", "no"])
kubectl("delete", "gtp", "no-b")
eventually("deleting the GlobalTrafficPolicy gives the network back", lambda: reach(default, A, B), ["ok", "ok"])

for s in (default, closed, denied):
    s.kill()
print("all checks passed")
