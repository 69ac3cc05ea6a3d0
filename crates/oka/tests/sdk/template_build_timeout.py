"""A template build past oka serve's `templates.buildTimeLimit` (started by tests/template_build.rs)
fails with the SDK's BuildException saying so.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID.
"""
import os

from e2b import BuildException, Template

RUN = os.environ["OKA_RUN_ID"]

try:
    Template.build(
        Template().from_template("base").run_cmd("sleep 60"),
        f"slow-{RUN}",
        on_build_logs=lambda entry: None,
    )
    raise AssertionError("a build past the time limit did not fail")
except BuildException as e:
    if "time limit" not in str(e):
        raise AssertionError(f"the failure does not name the time limit: {e}")
    print("ok a build past the time limit fails saying so", flush=True)

print("all checks passed", flush=True)
