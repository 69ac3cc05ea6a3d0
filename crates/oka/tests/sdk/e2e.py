"""Drives the official e2b Python SDK against `oka serve` end to end (started by tests/sdk_e2e.rs).

Environment: E2B_API_URL (the manager), E2B_SANDBOX_URL (the gateway), E2B_API_KEY, OKA_RUN_ID (a
value unique to this run, put in the sandboxes' metadata so listing can find them).
Any failed assertion exits non-zero with a traceback, which fails the Rust test. Each check that
passed is printed, so a failure shows how far the flow got.
"""
import importlib.metadata as md
import os
import time
from datetime import datetime, timezone

from e2b import Sandbox, SandboxQuery, SandboxState

RUN = os.environ["OKA_RUN_ID"]
VERSION = md.version("e2b")
NEW_SDK = tuple(int(p) for p in VERSION.split(".")[:2]) >= (2, 9)
print(f"e2b {VERSION}", flush=True)


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def listed_ids(states=None):
    query = SandboxQuery(metadata={"run": RUN}, **({"state": [SandboxState(s) for s in states]} if states else {}))
    pager = Sandbox.list(query=query)
    ids = []
    while pager.has_next:
        ids += [s.sandbox_id for s in pager.next_items()]
    return ids


# ---- create from the warm pool ----------------------------------------------------------------
started = time.monotonic()
sbx = Sandbox.create(template="base", timeout=120, envs={"FOO": "from-create"},
                     metadata={"run": RUN, "who": "e2e"})
check("create", sbx.sandbox_id.isalnum() and sbx.sandbox_id.islower(), sbx.sandbox_id)
print(f"create took {(time.monotonic() - started) * 1000:.1f} ms", flush=True)
info = sbx.get_info()
check("get_info", info.sandbox_id == sbx.sandbox_id and info.metadata.get("who") == "e2e", repr(info))
check("get_info state", str(getattr(info.state, "value", info.state)) == "running", repr(info.state))

# ---- commands in the sandbox --------------------------------------------------------------------
r = sbx.commands.run("echo $FOO; id -un; pwd")
check("run", r.stdout.split() == ["from-create", "user", "/home/user"], r.stdout)
try:
    sbx.commands.run("echo oops >&2; exit 3")
    check("exit code", False, "no exception")
except Exception as e:  # CommandExitException
    check("exit code", getattr(e, "exit_code", None) == 3 and "oops" in getattr(e, "stderr", ""), repr(e))
r = sbx.commands.run("ls /proc | grep -c '^[0-9]'")
check("own pid namespace", int(r.stdout) < 20, r.stdout)

# ---- files --------------------------------------------------------------------------------------
sbx.files.write("/home/user/notes/a.txt", "hello from the SDK")
check("files read", sbx.files.read("/home/user/notes/a.txt") == "hello from the SDK")
check("files list", [e.name for e in sbx.files.list("/home/user/notes")] == ["a.txt"])
payload = os.urandom(3 * 1024 * 1024)
sbx.files.write("/tmp/blob.bin", payload)
check("files bytes", bytes(sbx.files.read("/tmp/blob.bin", format="bytes")) == payload)
r = sbx.commands.run("sha256sum /tmp/blob.bin | cut -c1-16")
import hashlib  # noqa: E402

check("files seen by commands", r.stdout.strip() == hashlib.sha256(payload).hexdigest()[:16], r.stdout)

# ---- background process, list ------------------------------------------------------------------
bg = sbx.commands.run("sleep 600", background=True)
check("background", any(p.pid == bg.pid for p in sbx.commands.list()))
check("list", sbx.sandbox_id in listed_ids(), "not listed")

# ---- timeout --------------------------------------------------------------------------------------
sbx.set_timeout(90)
left = (sbx.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
check("set_timeout", 80 <= left <= 91, left)

# ---- pause and resume (connect) ------------------------------------------------------------------
paused = sbx.pause() if NEW_SDK else sbx.beta_pause()
check("pause", paused is None or paused is True, repr(paused))
info = Sandbox.get_info(sbx.sandbox_id)
check("paused state", str(getattr(info.state, "value", info.state)) == "paused", repr(info.state))
check("list paused", sbx.sandbox_id in listed_ids(["paused"]), "not listed as paused")
if NEW_SDK:
    check("pause twice", sbx.pause() is False)
# 2.8's class-method connect builds a client without the `E2b-Sandbox-Id` header, which a
# self-hosted gateway reached through E2B_SANDBOX_URL needs (E2B's cloud routes by host name
# instead); its instance method keeps the headers of the create.
resumed = Sandbox.connect(sbx.sandbox_id) if NEW_SDK else sbx.connect()
r = resumed.commands.run("cat /home/user/notes/a.txt")
check("resumed keeps files", r.stdout == "hello from the SDK", r.stdout)
check("resumed keeps processes", any(p.pid == bg.pid for p in resumed.commands.list()))

# ---- kill -----------------------------------------------------------------------------------------
check("kill", resumed.kill() is True)
check("kill again", Sandbox.kill(sbx.sandbox_id) is False)
try:
    Sandbox.get_info(sbx.sandbox_id)
    check("gone", False, "still there")
except Exception as e:  # SandboxNotFoundException (NotFoundException in 2.8)
    check("gone", "not found" in str(e).lower() or type(e).__name__.endswith("NotFoundException"), repr(e))
check("not listed after kill", sbx.sandbox_id not in listed_ids())
print("all checks passed", flush=True)
