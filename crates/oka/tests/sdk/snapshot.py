"""Snapshot then create from it, with the official e2b Python SDK against `oka serve`.

Run by tests/sdk_e2e.rs like e2e.py (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID).
The server the snapshot carries runs as root: CRIU reads every process's rlimits with
prlimit(2), which for a process of another uid needs CAP_SYS_RESOURCE, and hosts that withhold
it (our CI machine) cannot dump a sandbox with a process of `user` alive (see hibernate.rs).
"""
import os
import time

from e2b import Sandbox

RUN = os.environ["OKA_RUN_ID"]
SERVER = """
import http.server
count = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        body = str(count).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 9000), H).serve_forever()
"""
GET = "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9000').read().decode())\""


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def count(sbx):
    return sbx.commands.run(GET).stdout.strip()


sbx = Sandbox.create(template="base", timeout=120, metadata={"run": RUN})
sbx.files.write("/home/user/state.txt", "before the snapshot")
sbx.files.write("/home/user/server.py", SERVER)
sbx.commands.run("python3 /home/user/server.py", background=True, user="root")
deadline = time.monotonic() + 20
while True:
    try:
        first = count(sbx)
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
check("server counts", first == "1", first)

started = time.monotonic()
snapshot = sbx.create_snapshot()
print(f"snapshot took {(time.monotonic() - started) * 1000:.1f} ms", flush=True)
snapshot_id = snapshot.snapshot_id
check("snapshot listed", snapshot_id in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()])
check("original goes on", count(sbx) == "2")

started = time.monotonic()
clones = [Sandbox.create(template=snapshot_id, timeout=120, metadata={"run": RUN}) for _ in range(2)]
print(f"create from snapshot took {(time.monotonic() - started) * 500:.1f} ms each", flush=True)
for clone in clones:
    check("clone has the files", clone.files.read("/home/user/state.txt") == "before the snapshot")
    check("clone starts at the snapshot's count", count(clone) == "2")
check("clones are independent", count(clones[0]) == "3" and count(clones[1]) == "3")
check("original unaffected", count(sbx) == "3")

for s in clones + [sbx]:
    s.kill()
check("snapshot deleted", Sandbox.delete_snapshot(snapshot_id))
check("snapshot gone", snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()])
print("all checks passed", flush=True)
