"""Property-based conformance of a live `oka serve` to its own description of its E2B API.

Schemathesis generates requests from `crates/manager/openapi.yaml` (as the API serves it at
`GET /openapi.yaml`) and checks every answer: no 5xx (501 only where documented), a documented
status, content type and headers, a body that matches the documented schema, and 401 without
the key.

Random IDs only ever reach the 404 paths, so the run first makes real sandboxes (running and
paused) and binds the `sandboxID` path parameter to them, and the create's `templateID` to the
real pool, each with some probability: the generated requests then reach the answers of real
sandboxes in every state (and kill, pause, resume and time them out as they go). Three runs: every
operation but kill, then kill, then sequences along the document's links (a create, then
operations on the sandbox it made).

Environment: OKA_API (the API's base URL), E2B_API_KEY, OKA_POOL (the pool's name),
OKA_REPORT_DIR (where schemathesis writes its reports), OKA_SEED (default fixed, so CI is
reproducible), OKA_MAX_EXAMPLES (per operation and phase). Exits non-zero on any finding.
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

API = os.environ["OKA_API"].rstrip("/")
KEY = os.environ["E2B_API_KEY"]
POOL = os.environ.get("OKA_POOL", "base")
REPORTS = os.environ.get("OKA_REPORT_DIR", "schemathesis-report")
SEED = os.environ.get("OKA_SEED", "20260518")
MAX_EXAMPLES = os.environ.get("OKA_MAX_EXAMPLES", "25")
SCHEMATHESIS = os.path.join(os.path.dirname(sys.executable), "schemathesis")
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
        "ignored_auth",
    ]
)


def call(method, path, body=None):
    """One API call; (status, parsed JSON or None)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(API + path, data=data, method=method)
    request.add_header("X-API-Key", KEY)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, json.loads(raw) if raw else None


def create(**extra):
    status, body = call("POST", "/v2/sandboxes", {"templateID": POOL, "timeout": 900, **extra})
    assert status == 201, f"create: {status} {body}"
    return body["sandboxID"]


def sandboxes():
    """Real sandboxes for the generated requests: running ones, paused ones, one that pauses
    at its timeout."""
    running = [create(metadata={"conformance": "running"}) for _ in range(3)]
    paused = [create(metadata={"conformance": "paused"}) for _ in range(2)]
    for sandbox in paused:
        status, body = call("POST", f"/sandboxes/{sandbox}/pause", {})
        assert status == 204, f"pause: {status} {body}"
    auto = create(autoPause=True, autoResume={"enabled": True})
    return running + paused + [auto]


def config(ids):
    """schemathesis.toml: the real sandboxes and pool as dictionaries bound to the parameters."""
    quoted = ", ".join(json.dumps(i) for i in ids)
    return f"""
# 501: the operations the document says oka does not serve; 503: a drained pool (documented
# on the creates, with Retry-After; status_code_conformance still flags it anywhere else).
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "501", "503"]

[phases.stateful]
max-steps = 8

[dictionaries.sandboxes]
values = [{quoted}]

[dictionaries.counts]
values = [1, 2]

[dictionaries.templates]
values = [{json.dumps(POOL)}]

[parameters]
"path.sandboxID" = {{ dictionary = "sandboxes", probability = 0.7 }}
"query.sandboxID" = {{ dictionary = "sandboxes", probability = 0.5 }}
"path.templateID" = {{ dictionary = "templates", probability = 0.5 }}
"body.templateID" = {{ dictionary = "templates", probability = 0.5 }}
# A fork makes `count` real sandboxes (up to 100 by the document): a few keep the run short.
"body.count" = {{ dictionary = "counts", probability = 1.0 }}
"""


def run(name, config_path, phases, *selection):
    command = [
        SCHEMATHESIS,
        "--config-file",
        config_path,
        "run",
        f"{API}/openapi.yaml",
        "--url",
        API,
        "--header",
        f"X-API-Key: {KEY}",
        "--checks",
        CHECKS,
        "--phases",
        phases,
        "--max-examples",
        MAX_EXAMPLES,
        "--seed",
        SEED,
        # One worker: Python 3.11's compiler is not thread-safe (hypothesis compiles code as it
        # generates; two threads at once fail with "AST constructor recursion depth mismatch"),
        # and one worker sends the same requests in the same order for a seed.
        "--workers",
        "1",
        "--request-timeout",
        "90",
        "--no-shrink",
        "--continue-on-failure",
        "--suppress-health-check",
        "all",
        "--report",
        "junit",
        "--report-dir",
        os.path.join(REPORTS, name),
        *selection,
    ]
    print(f"==> {name}: {' '.join(c if KEY not in c else '<key>' for c in command)}", flush=True)
    started = time.monotonic()
    result = subprocess.run(command, env={**os.environ, "NO_COLOR": "1"})
    print(f"==> {name}: exit {result.returncode} in {time.monotonic() - started:.0f}s", flush=True)
    return result.returncode


def main():
    os.makedirs(REPORTS, exist_ok=True)
    ids = sandboxes()
    print(f"sandboxes for the generated requests: {ids}", flush=True)
    config_path = os.path.join(REPORTS, "schemathesis.toml")
    with open(config_path, "w") as f:
        f.write(config(ids))
    kill = "DELETE /sandboxes/{sandboxID}"
    generated = "examples,coverage,fuzzing"
    failed = run("all-but-kill", config_path, generated, "--exclude-name", kill)
    failed |= run("kill", config_path, generated, "--include-name", kill)
    # Sequences along the document's links: create, then pause, connect, time out, kill ...
    failed |= run("stateful", config_path, "stateful")
    if failed:
        print("conformance: findings above", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
