"""E2B parity with the newest official e2b Python SDK against `oka serve`: short timeouts,
set_timeout(0), the lifecycle of a create (pause or kill at the end, memory or files only,
auto-resume), the list's order and paging, and fork.

Run by tests/sdk_e2e.rs like e2e.py (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID).
OKA_PARITY_OLD=1 runs only what the 2.8.x SDK has (no lifecycle, no fork).
"""
import os
import time

from e2b import Sandbox, SandboxQuery, SandboxState

RUN = os.environ["OKA_RUN_ID"]
OLD = os.environ.get("OKA_PARITY_OLD") == "1"
META = {"run": RUN}


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def state_of(sandbox_id):
    """The state the API shows, or None once the sandbox is gone."""
    try:
        return Sandbox.get_info(sandbox_id).state.value
    except Exception as error:  # SandboxNotFoundException (newest) or NotFoundException (2.8)
        if "not found" in str(error).lower():
            return None
        raise


def wait_state(sandbox_id, want, within):
    deadline = time.monotonic() + within
    while True:
        got = state_of(sandbox_id)
        if got == want:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"{sandbox_id} is {got}, not {want}, after {within} s")
        time.sleep(0.1)


SLEEPERS = iter(range(100001, 200000))


def boot_and_pid(sbx):
    """The kernel's boot ID and a long-lived process started in the sandbox: `(boot, (pid,
    command line))`. A process that starts afresh after a resume may get the same PID number, so
    the process is known by both."""
    boot = sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    command = f"sleep {next(SLEEPERS)}"
    handle = sbx.commands.run(command, background=True)
    return boot, (handle.pid, command)


def alive(sbx, process):
    pid, command = process
    out = sbx.commands.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null; true").stdout
    return out.strip() == command


# 1. Short timeouts: E2B accepts any timeout (its own tests use 5 s); the sandbox ends on time.
started = time.monotonic()
sbx = Sandbox.create("base", timeout=5, metadata=META)
check("timeout=5 accepted", sbx.is_running())
check("a command in a 5 s sandbox", sbx.commands.run("echo hi").stdout == "hi\n")
gone = wait_state(sbx.sandbox_id, None, 20) - started
check("killed at its 5 s timeout", 4 <= gone <= 12, f"{gone:.1f} s")

# 2. set_timeout(0) applies the end at once.
sbx = Sandbox.create("base", timeout=120, metadata=META)
started = time.monotonic()
sbx.set_timeout(0)
gone = wait_state(sbx.sandbox_id, None, 10) - started
check("set_timeout(0) kills at once", gone < 5, f"{gone:.1f} s")

# 3. The list: newest first, paused and running in one order, filters before paging.
made = []
for _ in range(4):
    made.append(Sandbox.create("base", timeout=120, metadata={"run": RUN, "list": "yes"}))
for s in made[1:3]:
    s.beta_pause() if OLD else s.pause()
query = {"run": RUN, "list": "yes"}
newest_first = [s.sandbox_id for s in reversed(made)]


def walk(state, limit):
    paginator = Sandbox.list(query=SandboxQuery(metadata=query, state=state), limit=limit)
    seen = []
    while paginator.has_next:
        seen.extend(s.sandbox_id for s in paginator.next_items())
    return seen


for limit in (1, 2, 100):
    got = walk([SandboxState.RUNNING, SandboxState.PAUSED], limit)
    check(f"list newest first (limit {limit})", got == newest_first, f"{got} != {newest_first}")
    got = walk([SandboxState.PAUSED], limit)
    want = [made[2].sandbox_id, made[1].sandbox_id]
    check(f"paused only, newest first (limit {limit})", got == want, f"{got} != {want}")
first = Sandbox.list(query=SandboxQuery(metadata=query, state=[SandboxState.PAUSED]), limit=1).next_items()
check("page one of paused, limit 1, is the newest paused", [s.sandbox_id for s in first] == [made[2].sandbox_id])
spaced = Sandbox.create("base", timeout=60, metadata={"run": RUN, "note": "with spaces é", "session id": "s:1"})
found = Sandbox.list(query=SandboxQuery(metadata={"note": "with spaces é"})).next_items()
check("a metadata filter with spaces and non-ASCII", [s.sandbox_id for s in found] == [spaced.sandbox_id])
check("any metadata key, as E2B", Sandbox.get_info(spaced.sandbox_id).metadata.get("session id") == "s:1")
found = Sandbox.list(query=SandboxQuery(metadata={"session id": "s:1"})).next_items()
check("a filter on such a key", [s.sandbox_id for s in found] == [spaced.sandbox_id])
for s in made + [spaced]:
    s.kill()

if OLD:
    print("all checks passed", flush=True)
    raise SystemExit(0)

# 4. Pause at the timeout, keeping the memory, without auto-resume: only connect wakes it, and
#    it carries on in place (the same processes, the same boot ID).
sbx = Sandbox.create("base", timeout=3, metadata=META, lifecycle={"on_timeout": "pause"})
info = Sandbox.get_info(sbx.sandbox_id)
check("lifecycle shown", info.lifecycle == {"on_timeout": "pause", "auto_resume": False}, info.lifecycle)
boot, pid = boot_and_pid(sbx)
wait_state(sbx.sandbox_id, "paused", 20)
try:
    sbx.commands.run("echo woken", request_timeout=5)
    woken = True
except Exception as error:
    woken = False
    print(f"traffic to the paused sandbox: {type(error).__name__}: {error}", flush=True)
check("traffic does not wake it without auto_resume", not woken)
check("still paused after the traffic", state_of(sbx.sandbox_id) == "paused")
sbx = Sandbox.connect(sbx.sandbox_id, timeout=60)
check("connect resumed it", state_of(sbx.sandbox_id) == "running")
check("the same process goes on", alive(sbx, pid))
check("the same boot ID", sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip() == boot)
sbx.kill()

# 5. With auto_resume, traffic through the gateway wakes it.
sbx = Sandbox.create(
    "base", timeout=3, metadata=META, lifecycle={"on_timeout": "pause", "auto_resume": True}
)
boot, pid = boot_and_pid(sbx)
wait_state(sbx.sandbox_id, "paused", 20)
check("traffic wakes it with auto_resume", sbx.commands.run("echo woken").stdout == "woken\n")
check("woken in place", alive(sbx, pid))
sbx.kill()

# set_timeout(0) applies a pause at once too.
sbx = Sandbox.create("base", timeout=120, metadata=META, lifecycle={"on_timeout": "pause"})
started = time.monotonic()
sbx.set_timeout(0)
paused = wait_state(sbx.sandbox_id, "paused", 10) - started
check("set_timeout(0) pauses at once", paused < 5, f"{paused:.1f} s")
sbx.kill()

# 6. A filesystem-only pause: the files stay, the processes start afresh at the resume.
sbx = Sandbox.create(
    "base",
    timeout=3,
    metadata=META,
    lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}},
)
sbx.files.write("/home/user/kept.txt", "files stay")
boot, pid = boot_and_pid(sbx)
wait_state(sbx.sandbox_id, "paused", 30)
sbx = Sandbox.connect(sbx.sandbox_id, timeout=60)
check("files kept", sbx.files.read("/home/user/kept.txt") == "files stay")
check("processes restarted", not alive(sbx, pid))
sbx.kill()

# 7. An explicit pause of the files only, on a sandbox that would pause with its memory.
sbx = Sandbox.create("base", timeout=120, metadata=META)
boot, pid = boot_and_pid(sbx)
check("pause(mode=filesystem)", sbx.pause(mode="filesystem"))
sbx = Sandbox.connect(sbx.sandbox_id, timeout=60)
check("an explicit filesystem pause restarts the processes", not alive(sbx, pid))
check("pause() keeps the memory", sbx.pause())
boot, pid = boot_and_pid(Sandbox.connect(sbx.sandbox_id, timeout=60))
sbx.pause()
sbx = Sandbox.connect(sbx.sandbox_id, timeout=60)
check("a memory pause keeps the processes", alive(sbx, pid))
sbx.files.write("/home/user/kept.txt", "files stay")
sbx.pause()
sbx = Sandbox.connect(sbx.sandbox_id, timeout=60, on_resume="reboot")
check("on_resume=reboot starts the processes afresh", not alive(sbx, pid))
check("on_resume=reboot keeps the files", sbx.files.read("/home/user/kept.txt") == "files stay")
sbx.kill()

# 8. fork: the new sandboxes carry on from the source's memory and files, each with its own ID,
#    token and timeout; the source goes on. The counter runs as root (see snapshot.py).
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
sbx = Sandbox.create("base", timeout=120, metadata={"run": RUN, "fork": "source"}, envs={"FROM": "source"})
sbx.files.write("/home/user/server.py", SERVER)
sbx.files.write("/home/user/state.txt", "before the fork")
sbx.commands.run("python3 /home/user/server.py", background=True, user="root")
deadline = time.monotonic() + 20
while True:
    try:
        first = sbx.commands.run(GET).stdout.strip()
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
check("the source counts", first == "1", first)
started = time.monotonic()
forks = sbx.fork(count=2, timeout=60)
print(f"fork of 2 took {(time.monotonic() - started) * 1000:.0f} ms", flush=True)
errors = [f for f in forks if isinstance(f, Exception)]
check("two forks", len(forks) == 2 and not errors, errors)
ids = {sbx.sandbox_id} | {f.sandbox_id for f in forks}
check("fresh IDs", len(ids) == 3, ids)
for f in forks:
    check("a fork has the files", f.files.read("/home/user/state.txt") == "before the fork")
    check("a fork has the memory", f.commands.run(GET).stdout.strip() == "2")
    check("a fork has the env", f.commands.run("echo $FROM").stdout.strip() == "source")
    info = f.get_info()
    check("a fork has the metadata", info.metadata.get("fork") == "source", info.metadata)
    left = (info.end_at - info.started_at).total_seconds()
    check("a fork has its own timeout", 55 <= left <= 61, left)
check("the forks have their own tokens", len({f._envd_access_token for f in forks} | {sbx._envd_access_token}) == 3)
check("the source goes on", sbx.commands.run(GET).stdout.strip() == "2")
check("the source runs", state_of(sbx.sandbox_id) == "running")
for s in forks + [sbx]:
    s.kill()

print("all checks passed", flush=True)
