"""Drives the official e2b-code-interpreter Python SDK against oka-interpreter (started by
tests/sdk.rs).

Environment: E2B_API_URL (the harness's stand-in control plane), E2B_SANDBOX_URL (oka-interpreter),
E2B_API_KEY; OKA_KERNELS=all when the kernels of scripts/install-kernels.sh are installed (then
`parity.py` runs too). Any failed assertion exits non-zero with a traceback, which fails the Rust
test.
"""
import os
import time

from e2b_code_interpreter import Sandbox
from e2b.exceptions import NotFoundException, TimeoutException
from parity import rich

checks = []


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    checks.append(name)


def out(ex):
    """All of a run's stdout. How it is split into chunks follows the kernel's flushes (`print`
    writes its text and the newline apart, which ipykernel may send as two messages): not a
    contract of the API, so the checks join them."""
    return "".join(ex.logs.stdout)


sbx = Sandbox.create()

ex = sbx.run_code("print('hello'); 1+1")
check("stdout", out(ex) == "hello\n", ex)
check("text", ex.text == "2", ex)
check("execution_count", isinstance(ex.execution_count, int) and ex.execution_count >= 1, ex)
check("no error", ex.error is None, ex)

ex = sbx.run_code("1/0")
check("error name", ex.error is not None and ex.error.name == "ZeroDivisionError", ex)
check("error value", ex.error.value == "division by zero", ex)
check("traceback", "ZeroDivisionError" in ex.error.traceback, ex.error.traceback)

seen = []
ex = sbx.run_code(
    "import sys\nprint('out1')\nprint('err1', file=sys.stderr)",
    on_stdout=lambda m: seen.append(("out", m.line)),
    on_stderr=lambda m: seen.append(("err", m.line)),
)
streams = {k: "".join(m for kind, m in seen if kind == k) for k in ("out", "err")}
check("on_stdout", streams["out"] == "out1\n", seen)
check("on_stderr", streams["err"] == "err1\n", seen)

png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
ex = sbx.run_code(
    f"from IPython.display import display\ndisplay({{'image/png': '{png}', 'text/plain': 'img'}}, raw=True)"
)
check("display png", len(ex.results) == 1 and ex.results[0].png == png, ex)
check("display is not main", ex.results[0].is_main_result is False, ex)

ex = sbx.run_code("import os; os.environ.get('A')", envs={"A": "1"})
check("envs visible", ex.text == "1", ex)
ex = sbx.run_code("import os; str(os.environ.get('A'))")
check("envs gone", ex.text == "None", ex)
ex = sbx.run_code("import os; os.environ.get('GLOBAL_VAR')")
check("global env from envd", ex.text == "from-envd", ex)

ctx = sbx.create_code_context(cwd="/tmp")
check("context language", ctx.language == "python", ctx)
check("context cwd", ctx.cwd == "/tmp", ctx)
ex = sbx.run_code("import os; z = 7; os.getcwd()", context=ctx)
check("context cwd applies", ex.text == "/tmp", ex)
check("context state", sbx.run_code("z", context=ctx).text == "7")
ids = [c.id for c in sbx.list_code_contexts()]
check("list contexts", ids == [ctx.id], ids)
sbx.restart_code_context(ctx)
ex = sbx.run_code("z", context=ctx)
check("restart clears state", ex.error is not None and ex.error.name == "NameError", ex)
sbx.remove_code_context(ctx)
check("removed", sbx.list_code_contexts() == [])
try:
    sbx.run_code("1", context=ctx)
    raise AssertionError("run on a removed context should fail")
except NotFoundException:
    checks.append("removed context is not found")

# An SDK timeout interrupts the execution: the kernel is usable for the next request.
t0 = time.time()
try:
    sbx.run_code("while True: pass", timeout=1)
    raise AssertionError("expected a timeout")
except TimeoutException:
    checks.append("timeout")
ex = sbx.run_code("40 + 2")
check("usable after timeout", ex.text == "42", ex)
check("fast after timeout", time.time() - t0 < 10, time.time() - t0)

if os.environ.get("OKA_KERNELS") == "all":
    rich(sbx)
else:
    print("SKIPPED the kernels of scripts/install-kernels.sh: not installed")

sbx.kill()
print("OK", len(checks), "checks:", ", ".join(checks))
