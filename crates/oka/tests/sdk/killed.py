"""A sandbox killed while requests are in flight, as the official e2b Python SDK sees it (started
by tests/sdk_e2e.rs; the same in killed.mjs).

A command streams, a directory watch streams (async SDK), a file read waits in envd (a FIFO with no
writer) and a file upload is half sent when another client kills the sandbox. Each must fail with
the SDK's "the sandbox is gone" error (`SandboxNotRunningException`, newest SDKs): the streams and
the upload break, the SDK probes `/health` through the gateway, which answers E2B's "sandbox was
not found" 502; the read gets that 502 itself. Calls made after the kill fail the same way. The
2.8 SDKs have no health probe: there, calls after the kill raise the `TimeoutException` of a 502.

Environment: E2B_API_URL (the manager), E2B_SANDBOX_URL (the gateway), E2B_API_KEY, OKA_RUN_ID.
"""
import asyncio
import importlib.metadata as md
import os
import threading
import time

import e2b
from e2b import AsyncSandbox, Sandbox, TimeoutException

RUN = os.environ["OKA_RUN_ID"]
VERSION = md.version("e2b")
# The newest SDKs' error for a sandbox that is gone (a TimeoutException); 2.8 has none.
NotRunning = getattr(e2b, "SandboxNotRunningException", None)
print(f"e2b {VERSION}", flush=True)


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail!r}")
    print(f"ok {name}", flush=True)


def in_flight(outcomes, name, fn):
    """Runs `fn` on a thread; its exception (or None) lands in `outcomes[name]`."""

    def run():
        try:
            fn()
            outcomes[name] = None
        except Exception as e:  # noqa: BLE001 - the exception is what is checked
            outcomes[name] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def gone(e, *, in_flight=False):
    """Whether `e` is the SDK's "the sandbox is gone" error; `in_flight`: the one raised after
    the health probe of a request that broke."""
    if NotRunning is None:
        return isinstance(e, TimeoutException) and "was not found" in str(e)
    wording = "killed or reached its end of life" if in_flight else "killed or reached its"
    return isinstance(e, NotRunning) and wording in str(e)


sbx = Sandbox.create(template="base", timeout=120, metadata={"run": RUN, "who": "killed"})
sid = sbx.sandbox_id
sbx.commands.run("mkdir -p /home/user/w && mkfifo /home/user/fifo")
check("running", sbx.is_running())

outcomes = {}
threads = []
started = threading.Event()
threads.append(in_flight(outcomes, "command", lambda: sbx.commands.run(
    "echo started; sleep 120", on_stdout=lambda _: started.set(), timeout=0)))
check("command streams", started.wait(30))

if NotRunning is not None:
    # The newest SDK only: the async watch streams (the sync one polls with unary calls).
    watching = threading.Event()

    def watch():
        async def main():
            asbx = await AsyncSandbox.connect(sid)
            ended = asyncio.get_running_loop().create_future()
            await asbx.files.watch_dir(
                "/home/user/w", on_event=lambda _: None, timeout=0,
                on_exit=lambda err: ended.done() or ended.set_result(err))
            watching.set()
            err = await asyncio.wait_for(ended, 60)
            if err is not None:
                raise err

        asyncio.run(main())

    threads.append(in_flight(outcomes, "watch", watch))
    check("watch streams", watching.wait(30))

    # Waits in envd: opening a FIFO blocks until a writer comes, and none does.
    threads.append(in_flight(outcomes, "read", lambda: sbx.files.read("/home/user/fifo")))

    release = threading.Event()

    def chunks():
        yield b"x" * (1 << 20)
        release.wait(60)
        for _ in range(32):
            yield b"y" * (1 << 20)

    threads.append(in_flight(outcomes, "upload", lambda: sbx.files.write("/home/user/w/big.bin", chunks())))
    time.sleep(1)  # the read and the first megabyte reach envd

check("kill", Sandbox.kill(sid) is True)
if NotRunning is not None:
    release.set()
for thread in threads:
    thread.join(60)
    check("in-flight call ended", not thread.is_alive())

e = outcomes["command"]
if NotRunning is None:
    check("command fails", e is not None, e)
else:
    check("command: killed while streaming", gone(e, in_flight=True), e)
    check("watch: killed while streaming", gone(outcomes["watch"], in_flight=True), outcomes["watch"])
    check("read: killed while waiting in envd", gone(outcomes["read"]), outcomes["read"])
    check("upload: killed while sending", gone(outcomes["upload"]), outcomes["upload"])
    check("is_running after kill", sbx.is_running() is False)

for name, call in [
    ("list", lambda: sbx.files.list("/home/user")),
    ("run", lambda: sbx.commands.run("true")),
    ("write", lambda: sbx.files.write("/home/user/a", "a")),
]:
    try:
        call()
        check(f"{name} after kill", False, "no exception")
    except Exception as e:  # noqa: BLE001
        check(f"{name} after kill", gone(e), e)

print("all checks passed", flush=True)
