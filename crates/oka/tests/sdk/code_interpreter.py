"""The newest e2b-code-interpreter Python SDK against `oka serve` (started by tests/sdk_e2e.rs).

`Sandbox.create()` claims a warm sandbox of the `code-interpreter-v1` pool, whose command is
`oka-interpreter` (E2B's code interpreter API on port 49999, reached through the gateway), with a
real Jupyter kernel from the host's `/usr`. The flow: run code with stdout, results, errors and
callbacks; state kept between runs and across pause and resume; per-run and global env vars; the
kernel runs as `user` and shares files with `sandbox.files`; code contexts; then the parity
checks of crates/interpreter/tests/sdk/parity.py (plots, charts, DataFrames, the kernels of
scripts/install-kernels.sh); kill.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID.
"""
import os
import sys

from e2b_code_interpreter import Sandbox

# The parity checks shared with oka-interpreter's own SDK test.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../interpreter/tests/sdk"))
import parity  # noqa: E402

RUN = os.environ["OKA_RUN_ID"]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def out(ex):
    """All of a run's stdout. How it is split into chunks follows the kernel's flushes (`print`
    writes its text and the newline apart, which ipykernel may send as two messages): not a
    contract of the API, so the checks join them."""
    return "".join(ex.logs.stdout)


sbx = Sandbox.create(timeout=300, metadata={"run": RUN}, envs={"OKA_GLOBAL": "from-create", "G_VAR": "from-sandbox"})
info = sbx.get_info()
check("created from the code-interpreter-v1 pool", info.template_id == "code-interpreter-v1", info)

ex = sbx.run_code("print('hello'); 1+1")
check("stdout", out(ex) == "hello\n", ex)
check("main result", ex.text == "2", ex)
check("no error", ex.error is None, ex.error)
check("execution count", ex.execution_count is not None and ex.execution_count >= 1, ex)

sbx.run_code("x = 41")
check("state is kept between runs", sbx.run_code("x + 1").text == "42")

ex = sbx.run_code("1/0")
check("an error names its exception", ex.error is not None and ex.error.name == "ZeroDivisionError", ex)
check("an error has a traceback", ex.error is not None and "ZeroDivisionError" in ex.error.traceback, ex)

seen = []
ex = sbx.run_code(
    "import sys\nprint('a')\nprint('b', file=sys.stderr)", on_stdout=lambda m: seen.append(("out", m.line)),
    on_stderr=lambda m: seen.append(("err", m.line)),
)
streams = {k: "".join(m for kind, m in seen if kind == k) for k in ("out", "err")}
check("callbacks see stdout and stderr", streams == {"out": "a\n", "err": "b\n"}, seen)

ex = sbx.run_code("import os; print(os.environ.get('OKA_RUN_ENV'))", envs={"OKA_RUN_ENV": "per-run"})
check("per-run env vars are visible", out(ex) == "per-run\n", ex)
ex = sbx.run_code("import os; print(os.environ.get('OKA_RUN_ENV'))")
check("per-run env vars are reverted", out(ex) == "None\n", ex)
ex = sbx.run_code("import os; print(os.environ.get('OKA_GLOBAL'))")
check("the sandbox's env vars reach the kernel", out(ex) == "from-create\n", ex)

ex = sbx.run_code("import getpass, os; print(getpass.getuser(), os.getcwd())")
check("the kernel runs as user in its home", out(ex) == "user /home/user\n", ex)
sbx.run_code("open('/home/user/from-kernel.txt', 'w').write('written by the kernel')")
check("files of the kernel are the sandbox's", sbx.files.read("/home/user/from-kernel.txt") == "written by the kernel")
check("commands run beside the kernel", sbx.commands.run("whoami").stdout.strip() == "user")

ctx = sbx.create_code_context(cwd="/tmp")
ex = sbx.run_code("import os; print(os.getcwd()); y = 7", context=ctx)
check("a context has its own cwd", out(ex) == "/tmp\n", ex)
check("contexts are listed", ctx.id in [c.id for c in sbx.list_code_contexts()])
ex = sbx.run_code("print('y' in dir())")
check("contexts do not share state", out(ex) == "False\n", ex)
sbx.restart_code_context(ctx)
ex = sbx.run_code("print('y' in dir())", context=ctx)
check("a restarted context starts afresh", out(ex) == "False\n", ex)
sbx.remove_code_context(ctx)
check("a removed context is gone", ctx.id not in [c.id for c in sbx.list_code_contexts()])

# Results, charts and every language's contexts as E2B's template gives them, each interrupted on
# the SDK's timeout (the gateway closes the sandbox's connection when the SDK gives up).
parity.rich(sbx)

sbx.pause()
sbx = Sandbox.connect(sbx.sandbox_id)
check("kernel state survives pause and resume", sbx.run_code("x").text == "41")

check("kill", sbx.kill() is True)
check("kill again finds nothing", Sandbox.kill(sbx.sandbox_id) is False)
print("all checks passed")
