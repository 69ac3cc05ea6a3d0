"""The default templates through the real E2B SDKs (started by tests/sdk_e2e.rs).

`base` is Debian with the tools E2B's base template offers and passwordless sudo for `user`;
`code-interpreter-v1` adds the Jupyter kernels with numpy, pandas and matplotlib. Neither sees
the host's installed software: OKA_HOST_ONLY names files the host has and the templates do not.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID, OKA_HOST_ONLY.
"""
import base64
import os

from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeSandbox

RUN = os.environ["OKA_RUN_ID"]
HOST_ONLY = os.environ["OKA_HOST_ONLY"].split(":")


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def run(sbx, cmd):
    """The command's result, whatever its exit code."""
    try:
        return sbx.commands.run(cmd, timeout=120)
    except Exception as e:  # CommandExitException carries the result
        return e


sbx = Sandbox.create(timeout=300, metadata={"run": RUN})
check("created from base", sbx.get_info().template_id == "base")
r = run(sbx, "whoami")
check("commands run as user", r.exit_code == 0 and r.stdout.strip() == "user", r)
r = run(sbx, "sudo -n true && sudo -n id -u")
check("user has passwordless sudo", r.exit_code == 0 and r.stdout.strip() == "0", r)
for cmd, expect in [
    ("python3 -m pip --version", "pip "),
    ("node --version", "v"),
    ("npm --version", ""),
    ("git --version", "git version"),
    ("curl --version", "curl "),
    ("gcc --version", "gcc"),
    ("python3 -m venv /tmp/venv && /tmp/venv/bin/python -c 'print(42)'", "42"),
]:
    r = run(sbx, cmd)
    check(f"base has: {cmd}", r.exit_code == 0 and expect in r.stdout, r)
r = run(sbx, "cat /etc/os-release")
check("base is Debian bookworm", 'VERSION_CODENAME=bookworm' in r.stdout, r)
for path in HOST_ONLY:
    r = run(sbx, f"test ! -e {path}")
    check(f"the host's {path} is not in the sandbox", r.exit_code == 0, r)
r = run(sbx, "sudo touch /etc/made-by-sudo && ls -l /etc/made-by-sudo")
check("sudo writes where only root may", r.exit_code == 0 and " root root " in r.stdout, r)
sbx.kill()

csbx = CodeSandbox.create(timeout=300, metadata={"run": RUN})
check("created from code-interpreter-v1", csbx.get_info().template_id == "code-interpreter-v1")
r = run(csbx, "python3 -c 'import pandas, matplotlib, numpy; print(numpy.__version__)'")
check("python3 imports pandas, matplotlib and numpy", r.exit_code == 0 and r.stdout.strip(), r)
r = run(csbx, "sudo -n true")
check("code-interpreter-v1 keeps base's sudo", r.exit_code == 0, r)
ex = csbx.run_code(
    "import matplotlib.pyplot as plt\n"
    "plt.plot([1, 2, 3], [1, 4, 9])\n"
    "plt.title('squares')\n"
    "plt.show()\n"
)
check("a plot runs", ex.error is None, ex.error)
check("a plot gives a PNG result",
      len(ex.results) >= 1 and ex.results[0].png
      and base64.b64decode(ex.results[0].png)[:8] == b"\x89PNG\r\n\x1a\n", ex)
ex = csbx.run_code("import pandas as pd\nint(pd.DataFrame({'a': [1, 2]})['a'].sum())")
check("pandas in the kernel", ex.error is None and ex.text == "3", ex)
for path in HOST_ONLY:
    r = run(csbx, f"test ! -e {path}")
    check(f"the host's {path} is not in the code interpreter", r.exit_code == 0, r)
csbx.kill()
print("all checks passed", flush=True)
