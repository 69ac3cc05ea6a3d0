"""Drives the official e2b Python SDK against oka-envd (started by tests/sdk_python.rs).

Environment: E2B_API_URL (the harness's fake control plane), E2B_SANDBOX_URL (the daemon),
E2B_API_KEY, OKA_TEST_HOME (the default user's home), OKA_TEST_UID (its uid).
Any failed assertion exits non-zero with a traceback, which fails the Rust test.
"""
import inspect
import os
import sys
import threading
import time

import e2b
from e2b import (
    CommandExitException,
    FileType,
    FilesystemEventType,
    PtySize,
    Sandbox,
    TimeoutException,
)

HOME = os.environ["OKA_TEST_HOME"]
UID = os.environ["OKA_TEST_UID"]
checks = []


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    checks.append(name)


def expect_raises(name, exc, fn):
    try:
        fn()
    except exc as e:
        checks.append(name)
        return e
    raise AssertionError(f"{name}: expected {exc.__name__}")


version = getattr(e2b, "__version__", None)
try:
    import importlib.metadata as md

    version = md.version("e2b")
except Exception:
    pass
print(f"e2b {version}", flush=True)

sbx = Sandbox.create()
check("sandbox id", sbx.sandbox_id == "oka0test0sandbox0001", sbx.sandbox_id)
check("is_running", sbx.is_running())

# ---- commands ---------------------------------------------------------------------------------
r = sbx.commands.run("echo hi")
check("run stdout", r.stdout == "hi\n" and r.exit_code == 0, repr(r))
r = sbx.commands.run("pwd; id -u; echo $HOME $USER")
check("default cwd/user", r.stdout.split() == [HOME, UID, HOME, "user"], r.stdout)
r = sbx.commands.run("echo $A-$GLOBAL_VAR-$E2B_SANDBOX", envs={"A": "1"})
check("envs", r.stdout == "1-from-init-true\n", r.stdout)
r = sbx.commands.run("echo $GLOBAL_VAR", envs={"GLOBAL_VAR": "req"})
check("request env wins", r.stdout == "req\n", r.stdout)
r = sbx.commands.run("pwd; id -u", cwd="/tmp", user="root")
check("cwd+root", r.stdout.split() == ["/tmp", "0"], r.stdout)
e = expect_raises("exit 127", CommandExitException, lambda: sbx.commands.run("no_such_cmd_oka"))
check("127 code", e.exit_code == 127, repr(e))
check("127 stderr", "command not found" in e.stderr, e.stderr)
e = expect_raises("exit 3", CommandExitException, lambda: sbx.commands.run("echo out; exit 3"))
check("exit 3 output", e.exit_code == 3 and e.stdout == "out\n", repr(e))
out, err = [], []
r = sbx.commands.run(
    "echo a; echo b >&2; echo c", on_stdout=out.append, on_stderr=err.append
)
check("callbacks", "".join(out) == "a\nc\n" and "".join(err) == "b\n", (out, err))
e = expect_raises("bad cwd", Exception, lambda: sbx.commands.run("true", cwd="/no/such/dir"))
check("bad cwd message", "does not exist" in str(e), str(e))
big = sbx.commands.run("head -c 300000 /dev/zero | tr '\\0' x")
check("large output", len(big.stdout) == 300000, len(big.stdout))

t0 = time.time()
expect_raises(
    "timeout", (TimeoutException, CommandExitException), lambda: sbx.commands.run("sleep 10", timeout=1)
)
check("timeout is prompt", time.time() - t0 < 6, time.time() - t0)

h = sbx.commands.run("sleep 30", background=True)
check("background pid", h.pid > 0)
listed = {p.pid: p for p in sbx.commands.list()}
check("list", h.pid in listed and listed[h.pid].cmd == "/bin/bash", listed)
check("kill", sbx.commands.kill(h.pid))
e = expect_raises("killed wait", CommandExitException, h.wait)
check("killed code", e.exit_code == -1, repr(e))
check("kill unknown", sbx.commands.kill(999999) is False)
check("gone from list", h.pid not in {p.pid for p in sbx.commands.list()})

h = sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.3; done", background=True)
h2 = sbx.commands.connect(h.pid)
r2 = h2.wait()
check("connect", r2.stdout.strip().endswith("3") and r2.exit_code == 0, r2.stdout)
r1 = h.wait()
check("original handle", r1.stdout == "1\n2\n3\n", r1.stdout)
expect_raises("connect unknown", Exception, lambda: sbx.commands.connect(999999))

h = sbx.commands.run("cat", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "hello\n")
if hasattr(sbx.commands, "close_stdin"):
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    check("stdin+close", r.stdout == "hello\n", r.stdout)
else:
    time.sleep(0.3)
    sbx.commands.kill(h.pid)
    e = expect_raises("stdin (2.8)", CommandExitException, h.wait)
    check("stdin echoed", e.stdout == "hello\n", e.stdout)
if hasattr(sbx.commands, "stream_input"):
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(h.pid, iter([b"x", b"y\n"]))
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    check("stream_input", r.stdout == "xy\n", r.stdout)

# ---- pty --------------------------------------------------------------------------------------
h = sbx.pty.create(PtySize(rows=24, cols=80))
data = []
def pty_wait():
    # The PTY is killed at the end of this section, so its wait ends with an exit exception.
    try:
        data.append(h.wait(on_pty=lambda d: data.append(bytes(d))))
    except Exception as e:  # noqa: BLE001
        data.append(e)


waiter = threading.Thread(target=pty_wait)
waiter.daemon = True
waiter.start()
sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
sbx.pty.send_stdin(h.pid, b"stty size; echo ok-$((40+2))\n")
deadline = time.time() + 10
while time.time() < deadline and b"ok-42" not in b"".join(x for x in data if isinstance(x, bytes)):
    time.sleep(0.05)
text = b"".join(x for x in data if isinstance(x, bytes))
check("pty output", b"ok-42" in text, text[-500:])
check("pty resize", b"30 100" in text, text[-500:])
check("pty kill", sbx.pty.kill(h.pid))
waiter.join(10)
check("pty ended", not waiter.is_alive())

# ---- files ------------------------------------------------------------------------------------
base = f"{HOME}/files"
info = sbx.files.write(f"{base}/a.txt", "hello")
check("write", info.path == f"{base}/a.txt" and info.name == "a.txt", repr(info))
check("read text", sbx.files.read(f"{base}/a.txt") == "hello")
check("read bytes", bytes(sbx.files.read(f"{base}/a.txt", format="bytes")) == b"hello")
stream = sbx.files.read(f"{base}/a.txt", format="stream")
check("read stream", b"".join(stream) == b"hello")
sbx.files.write(f"{base}/bin", b"\x00\x01\xff")
check("bytes round trip", bytes(sbx.files.read(f"{base}/bin", format="bytes")) == b"\x00\x01\xff")
payload = os.urandom(5 * 1024 * 1024)
sbx.files.write(f"{base}/big.bin", payload)
check("large file", bytes(sbx.files.read(f"{base}/big.bin", format="bytes")) == payload)
r = sbx.commands.run(f"stat -c '%u %a' {base}/a.txt {base}")
check("owner and modes", r.stdout.split() == [UID, "644", UID, "755"], r.stdout)
infos = sbx.files.write_files(
    [{"path": f"{base}/m/1.txt", "data": "one"}, {"path": f"{base}/m/2.txt", "data": b"two"}]
)
check("write_files", sorted(i.name for i in infos) == ["1.txt", "2.txt"], infos)
check("write_files content", sbx.files.read(f"{base}/m/2.txt") == "two")
entries = sbx.files.list(base)
names = sorted(e.name for e in entries)
check("list depth 1", names == ["a.txt", "big.bin", "bin", "m"], names)
entries = sbx.files.list(base, depth=2)
paths = sorted(e.path for e in entries)
check("list depth 2", f"{base}/m/1.txt" in paths and len(paths) == 6, paths)
check("exists", sbx.files.exists(f"{base}/a.txt"))
check("not exists", not sbx.files.exists(f"{base}/nope"))
i = sbx.files.get_info(f"{base}/a.txt")
check("get_info", i.type == FileType.FILE and i.size == 5 and i.name == "a.txt", repr(i))
i = sbx.files.get_info(base)
check("get_info dir", i.type == FileType.DIR, repr(i))
check("make_dir", sbx.files.make_dir(f"{base}/d1/d2"))
check("make_dir again", sbx.files.make_dir(f"{base}/d1/d2") is False)
moved = sbx.files.rename(f"{base}/a.txt", f"{base}/new/b.txt")
check("rename", moved.path == f"{base}/new/b.txt", repr(moved))
check("renamed content", sbx.files.read(f"{base}/new/b.txt") == "hello")
sbx.files.remove(f"{base}/new")
check("remove", not sbx.files.exists(f"{base}/new/b.txt"))
expect_raises("read missing", Exception, lambda: sbx.files.read(f"{base}/nope"))
expect_raises("list missing", Exception, lambda: sbx.files.list(f"{base}/nope"))
expect_raises("read dir", Exception, lambda: sbx.files.read(base))

# File metadata (the SDKs that have it; envd 0.6.2): an upload sets the file's whole metadata, so a
# rewrite without metadata clears it, on every write path (multipart of one and of several files,
# octet-stream on the fast path and, gzipped, through the router).
if "metadata" in inspect.signature(sbx.files.write).parameters:
    mbase = f"{base}/meta"

    def meta_of(path):
        listed = {e.path: e.metadata for e in sbx.files.list(os.path.dirname(path))}
        return sbx.files.get_info(path).metadata, listed[path]

    ways = {
        "multipart": {},
        "octet-stream": {"use_octet_stream": True},
        "gzip": {"gzip": True},
    }
    for way, opts in ways.items():
        p = f"{mbase}/{way}.txt"
        info = sbx.files.write(p, "v1", metadata={"Owner": "oka", "purpose": "test"}, **opts)
        want = {"owner": "oka", "purpose": "test"}
        check(f"metadata {way} answer", info.metadata == want, repr(info))
        check(f"metadata {way} stat+list", meta_of(p) == (want, want), meta_of(p))
        info = sbx.files.write(p, "v2", metadata={"purpose": "replaced"}, **opts)
        want = {"purpose": "replaced"}
        check(f"metadata {way} replaced", info.metadata == want, repr(info))
        check(f"metadata {way} replaced stat+list", meta_of(p) == (want, want), meta_of(p))
        info = sbx.files.write(p, "v3", **opts)
        check(f"metadata {way} cleared answer", info.metadata is None, repr(info))
        check(f"metadata {way} cleared stat+list", meta_of(p) == (None, None), meta_of(p))
        check(f"metadata {way} content", sbx.files.read(p) == "v3")
    for opts in ({}, {"use_octet_stream": True}):
        files = [{"path": f"{mbase}/many/{n}", "data": n} for n in ("a", "b")]
        infos = sbx.files.write_files(files, metadata={"batch": "1"}, **opts)
        check("metadata write_files", all(i.metadata == {"batch": "1"} for i in infos), infos)
        infos = sbx.files.write_files(files, **opts)
        check("metadata write_files cleared", all(i.metadata is None for i in infos), infos)
        got = [meta_of(f["path"]) for f in files]
        check("metadata write_files cleared stat+list", got == [(None, None)] * 2, got)
    sbx.files.remove(mbase)

w = sbx.files.watch_dir(base)
sbx.files.write(f"{base}/w.txt", "x")
sbx.files.remove(f"{base}/bin")
events = []
wanted = {("w.txt", FilesystemEventType.CREATE), ("bin", FilesystemEventType.REMOVE)}
deadline = time.time() + 10
# Poll until both expected events arrived (writes also bring chmod/write events first).
while time.time() < deadline and not wanted <= {(e.name, e.type) for e in events}:
    events += w.get_new_events()
    time.sleep(0.1)
kinds = {(e.name, e.type) for e in events}
check("watch create", ("w.txt", FilesystemEventType.CREATE) in kinds, kinds)
check("watch remove", ("bin", FilesystemEventType.REMOVE) in kinds, kinds)
w.stop()

if sbx.download_url is not None:
    try:
        import urllib.request

        url = sbx.download_url(f"{base}/w.txt")
        check("signed url", "signature=v1_" in url, url)
        with urllib.request.urlopen(url) as resp:
            check("signed download", resp.read() == b"x")
    except AttributeError:
        pass

print(f"OK {len(checks)} checks", flush=True)
sys.exit(0)
