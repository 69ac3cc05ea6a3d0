"""Drives the official e2b Python SDK against oka's cluster components on a real Kubernetes API
server (started by tests/cluster.rs): create, commands, files, pause, resume, snapshot and clone,
kill, each through a manager replica and the gateway, with sandboxes on the node agents.

Environment: E2B_API_URL (a manager), E2B_SANDBOX_URL (the gateway), E2B_API_KEY, OKA_RUN_ID.
A failed check exits non-zero with a traceback, which fails the Rust test.
"""
import os
import time

from e2b import Sandbox

RUN = os.environ["OKA_RUN_ID"]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


started = time.monotonic()
sbx = Sandbox.create(template="base", timeout=120, envs={"FOO": "on-a-cluster"}, metadata={"run": RUN})
print(f"create took {(time.monotonic() - started) * 1000:.1f} ms", flush=True)
r = sbx.commands.run("echo $FOO; id -un")
check("run", r.stdout.split() == ["on-a-cluster", "user"], r.stdout)

sbx.files.write("/home/user/notes.txt", "written through the relay")
check("files read", sbx.files.read("/home/user/notes.txt") == "written through the relay")
payload = bytes(range(256)) * 4096
sbx.files.write("/tmp/blob.bin", payload)
check("files bytes", bytes(sbx.files.read("/tmp/blob.bin", format="bytes")) == payload)
snapshot = sbx.create_snapshot()
clone = Sandbox.create(template=snapshot.snapshot_id, timeout=120, metadata={"run": RUN})
check("clone has the files", clone.files.read("/home/user/notes.txt") == "written through the relay")
check("clone runs", clone.commands.run("echo clone").stdout.strip() == "clone")

bg = sbx.commands.run("sleep 600", background=True)

sbx.pause()
info = Sandbox.get_info(sbx.sandbox_id)
check("paused", str(getattr(info.state, "value", info.state)) == "paused", repr(info.state))
resumed = Sandbox.connect(sbx.sandbox_id)
check("resumed keeps files", resumed.commands.run("cat /home/user/notes.txt").stdout == "written through the relay")
check("resumed keeps processes", any(p.pid == bg.pid for p in resumed.commands.list()))

check("kill clone", clone.kill() is True)
check("kill", resumed.kill() is True)
check("kill again", Sandbox.kill(sbx.sandbox_id) is False)
check("snapshot deleted", Sandbox.delete_snapshot(snapshot.snapshot_id))
print("all checks passed", flush=True)
