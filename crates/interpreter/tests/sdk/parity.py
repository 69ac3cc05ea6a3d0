"""What E2B's code-interpreter template gives the e2b-code-interpreter Python SDK, checked from
the SDK's side: rich results (plots, DataFrames, JSON, LaTeX, Markdown, SVG, HTML), results
streamed to `on_result` while the code runs, typed charts, the kernels of every language with
their contexts, working directories, env vars at three levels, errors and interrupts.

Used by tests/sdk/driver.py (oka-interpreter alone) and crates/oka/tests/sdk/code_interpreter.py
(the whole product). Needs the kernels of scripts/install-kernels.sh. The sandbox must have the
env var GLOBAL_VAR=from-sandbox (the sandbox level).
"""
import base64
import time

import httpx
from e2b.exceptions import TimeoutException
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScaleType,
    ScatterChart,
    SuperChart,
)
from e2b_code_interpreter.models import Context

ALL_LANGUAGES = ("python", "javascript", "typescript", "r", "bash", "java")


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def only(ex):
    """The one result of an execution."""
    check("one result", len(ex.results) == 1 and ex.error is None, ex)
    return ex.results[0]


def shown(sbx, code):
    """The chart of the figure `code` draws and shows."""
    r = only(sbx.run_code("import matplotlib.pyplot as plt\nplt.figure()\n" + code + "\nplt.show()"))
    check("a shown figure is a display result", r.is_main_result is False, r)
    check("a shown figure has a png", base64.b64decode(r.png)[:8] == b"\x89PNG\r\n\x1a\n")
    check("a shown figure has its text", (r.text or "").startswith("<Figure size"), r.text)
    return r.chart


def results(sbx):
    c = shown(sbx, "plt.plot([1, 2, 3], [1, 4, 9], label='squares')\nplt.title('Squares')\n"
                   "plt.xlabel('distance (m)')\nplt.ylabel('area')")
    check("a line plot is a line chart", isinstance(c, LineChart) and c.type == ChartType.LINE, c)
    check("the chart's title and labels", (c.title, c.x_label, c.y_label) == ("Squares", "distance (m)", "area"), c.to_dict())
    check("the unit comes from the label", c.x_unit == "m" and c.y_unit is None, c.to_dict())
    check("linear scales", c.x_scale == ScaleType.LINEAR and c.y_scale == ScaleType.LINEAR, c.to_dict())
    check("ticks and their labels", len(c.x_ticks) == len(c.x_tick_labels) > 0, c.to_dict())
    check("the line's points", [(e.label, e.points) for e in c.elements] == [("squares", [(1, 1), (2, 4), (3, 9)])], c.to_dict())

    c = shown(sbx, "plt.scatter([1, 2], [3, 4], label='dots')\nplt.yscale('log')")
    check("a scatter chart", isinstance(c, ScatterChart) and c.elements[0].points == [(1, 3), (2, 4)], c.to_dict())
    check("a log scale", c.y_scale == ScaleType.LOG, c.to_dict())

    c = shown(sbx, "plt.bar(['a', 'b', 'c'], [3, 5, 7], label='count')\nplt.title('Bars')")
    check("a bar chart", isinstance(c, BarChart) and c.title == "Bars", c.to_dict())
    check("the bars", [(e.label, e.value, e.group) for e in c.elements] == [("a", 3, "count"), ("b", 5, "count"), ("c", 7, "count")], c.to_dict())

    c = shown(sbx, "plt.pie([1, 3], labels=['small', 'big'])")
    check("a pie chart", isinstance(c, PieChart), c.to_dict())
    check("the wedges", [(e.label, e.angle) for e in c.elements] == [("small", 90), ("big", 270)], c.to_dict())

    c = shown(sbx, "plt.boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]], tick_labels=['A', 'B'],"
                   " patch_artist=True)\nplt.ylabel('score')")
    check("a box-and-whisker chart", isinstance(c, BoxAndWhiskerChart) and c.type == ChartType.BOX_AND_WHISKER, c and c.to_dict())
    got = [(e.label, e.min, e.first_quartile, e.median, e.third_quartile, e.max, e.outliers) for e in c.elements]
    check("the boxes", got == [("A", 78, 85, 88, 90, 92, []), ("B", 84, 84.75, 88, 90.5, 95, [76])], got)

    r = only(sbx.run_code(
        "import matplotlib.pyplot as plt\nfig, (l, r) = plt.subplots(1, 2)\nl.plot([1, 2], [3, 4])\n"
        "r.bar(['x'], [1])\nfig.suptitle('Two')\nplt.show()"))
    c = r.chart
    check("several axes are a superchart", isinstance(c, SuperChart) and c.title == "Two", c and c.to_dict())
    check("the superchart's charts", [type(e) for e in c.elements] == [LineChart, BarChart], c.to_dict())

    ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])")
    check("a figure left open is shown at the end", len(ex.results) == 2 and ex.results[1].png and ex.results[1].chart, ex)

    r = only(sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y'], 'c': [0.5, None]})"))
    check("a DataFrame is the main result", r.is_main_result, r)
    check("a DataFrame's data are its columns", r.data == {"a": [1, 2], "b": ["x", "y"], "c": [0.5, None]}, r.data)
    check("a DataFrame has its html table", "<table" in r.html and r.text, r)

    r = only(sbx.run_code("{'a': [1, 2], 'b': None}"))
    check("a dict is json too", r.json == {"a": [1, 2], "b": None} and r.text == "{'a': [1, 2], 'b': None}", r)

    ex = sbx.run_code(
        "from IPython.display import HTML, JSON, Latex, Markdown, SVG, display\n"
        "display(Latex(r'$x^2$'), Markdown('**bold**'), HTML('<b>b</b>'), JSON({'k': 1}))\n"
        "SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>')")
    got = [(r.latex, r.markdown, r.html, r.json, r.svg, r.is_main_result) for r in ex.results]
    check("LaTeX, Markdown, HTML, JSON and SVG as Jupyter gives them", got == [
        ("$x^2$", None, None, None, None, False), (None, "**bold**", None, None, None, False),
        (None, None, "<b>b</b>", None, None, False), (None, None, None, {"k": 1}, None, False),
        (None, None, None, None, '<svg xmlns="http://www.w3.org/2000/svg"/>', True)], got)

    seen = []
    t0 = time.time()
    ex = sbx.run_code(
        "from IPython.display import display\nimport time\ndisplay('first')\ntime.sleep(2)\n'last'",
        on_result=lambda r: seen.append((time.time() - t0, r.text)))
    done = time.time() - t0
    check("on_result sees every result", [t for _, t in seen] == ["first", "last"], seen)
    check("on_result streams while the code runs", seen[0][0] < done - 1.5, (seen, done))


def raw_context(sbx, language, cwd, envs):
    """A context with its own env vars, created over plain HTTP: the SDKs send none, E2B's
    server takes none; oka-interpreter takes `envs` (the context level)."""
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
    r = httpx.post(f"{sbx._jupyter_url}/contexts", json={"language": language, "cwd": cwd, "envs": envs},
                   headers=headers, timeout=60)
    check(f"{language}: a context with env vars", r.status_code == 200, r.text)
    d = r.json()
    return Context(d["id"], d["language"], d["cwd"])


# language -> (code printing cwd and the env vars G, C and X, one per line; code making an
# error; its name, in the error's name or value (JJava names every error RuntimeException and
# gives the class in the value); a long-running code; code reading back state; code setting it).
KERNELS = {
    "python": ("import os\nprint(os.getcwd())\nfor k in 'GCX': print(os.environ.get(k + '_VAR'))",
               "1/0", "ZeroDivisionError", "while True: pass", "kept", "kept = 42"),
    "javascript": ("console.log([Deno.cwd(), ...['G', 'C', 'X'].map((k) => Deno.env.get(k + '_VAR') ?? 'undefined')].join('\\n'))",
                   "throw new TypeError('boom')", "TypeError", "while (true) {}", "kept", "var kept = 42"),
    "typescript": ("const vars: (string | undefined)[] = ['G', 'C', 'X'].map((k) => Deno.env.get(k + '_VAR') ?? 'undefined')\n"
                   "console.log([Deno.cwd(), ...vars].join('\\n'))",
                   "throw new RangeError('boom')", "RangeError", "while (true) {}", "kept", "var kept: number = 42"),
    "r": ("cat(getwd(), Sys.getenv(c('G_VAR', 'C_VAR', 'X_VAR'), unset = 'undefined'), sep = '\\n')",
          "stop('boom')", "ERROR", "while (TRUE) {}", "kept", "kept <- 42"),
    "bash": ("pwd; for k in G C X; do v=${k}_VAR; echo ${!v-undefined}; done",
             "false", "", "while true; do :; done", "echo $kept", "kept=42"),
    "java": ("System.out.println(System.getProperty(\"user.dir\"))", "throw new IllegalStateException(\"boom\");",
             "IllegalStateException", "while (true) {}", "kept", "int kept = 42;"),
}


def out(ex):
    return "".join(ex.logs.stdout)


def kernels(sbx, languages, interrupts):
    for lang in languages:
        show, bad, err_name, forever, get, put = KERNELS[lang]
        ctx = sbx.create_code_context(language=lang, cwd="/tmp")
        check(f"{lang}: a context has its language and cwd", (ctx.language, ctx.cwd) == (lang, "/tmp"), ctx)
        check(f"{lang}: contexts are listed", ctx.id in [c.id for c in sbx.list_code_contexts()])
        ex = sbx.run_code(put, context=ctx)
        check(f"{lang}: runs code", ex.error is None, ex)
        ex = sbx.run_code(bad, context=ctx)
        check(f"{lang}: an error with name, value and traceback",
              ex.error is not None and ex.error.value and err_name in ex.error.name + ex.error.value, ex.error)
        if lang != "bash":
            check(f"{lang}: a traceback", ex.error.traceback, ex.error)
        # Interrupted on the SDK's timeout; the context goes on (its state kept where the kernel
        # can stop a running cell).
        if interrupts:
            try:
                sbx.run_code(forever, context=ctx, timeout=2)
                raise AssertionError(f"{lang}: expected a timeout")
            except TimeoutException:
                print(f"ok {lang}: the SDK's timeout", flush=True)
        ex = sbx.run_code(get, context=ctx, timeout=30)
        text = ex.text if lang != "bash" else out(ex).strip()
        if lang == "r":
            text = ex.results[0].text if ex.results else None
        check(f"{lang}: the context works after an interrupt, its state kept", text in ("42", "[1] 42"), ex)
        if lang == "java":
            # A JVM cannot change its own environment: env vars are not applied to Java.
            ex = sbx.run_code(show, context=ctx)
            check("java: the context's cwd", out(ex).strip() == "/tmp", ex)
        else:
            ex = sbx.run_code(show, context=ctx, envs={"X_VAR": "from-call"})
            check(f"{lang}: cwd and the sandbox's and the call's env vars",
                  out(ex).split("\n")[:4] == ["/tmp", "from-sandbox", "undefined" if lang != "python" else "None", "from-call"], out(ex))
            c2 = raw_context(sbx, lang, "/", {"C_VAR": "from-context", "G_VAR": "context-wins"})
            ex = sbx.run_code(show, context=c2, envs={"X_VAR": "from-call", "C_VAR": "call-wins"})
            check(f"{lang}: the call's env vars over the context's over the sandbox's",
                  out(ex).split("\n")[:4] == ["/", "context-wins", "call-wins", "from-call"], out(ex))
            ex = sbx.run_code(show, context=c2)
            none = "None" if lang == "python" else "undefined"
            check(f"{lang}: a call's env vars end with the call",
                  out(ex).split("\n")[:4] == ["/", "context-wins", "from-context", none], out(ex))
            sbx.remove_code_context(c2)
        sbx.restart_code_context(ctx)
        ex = sbx.run_code(get, context=ctx)
        check(f"{lang}: a restart forgets the state", (ex.error is not None) or out(ex).strip() == "", ex)
        sbx.remove_code_context(ctx)
        check(f"{lang}: a removed context is gone", ctx.id not in [c.id for c in sbx.list_code_contexts()])
    # (Printed rather than returned: Deno 2.9's kernel now and then publishes no execute_result
    # for one of the first cells of a fresh kernel.)
    ex = sbx.run_code("const m = await import('node:path'); console.log(m.join('a', 'b'))", language="javascript")
    check("javascript: ES modules and top-level await", out(ex) == "a/b\n", ex)
    ex = sbx.run_code("const n: number = await Promise.resolve(6)\nconsole.log(n * 7)", language="typescript")
    check("typescript: types and top-level await", out(ex) == "42\n", ex)


def rich(sbx, languages=ALL_LANGUAGES, interrupts=True):
    results(sbx)
    kernels(sbx, languages, interrupts)
