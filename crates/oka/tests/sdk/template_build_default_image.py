"""A template built `from_template("base")` while oka serve's default template `base` runs on an
image of a registry that wants credentials (`templates.images`, `templates.imagePullSecrets`;
started by tests/template_build.rs): the build runs on the image its pool pulled, and a sandbox
of the template sees the image's files and the step's.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID.
"""
import os

from e2b import Sandbox, Template

RUN = os.environ["OKA_RUN_ID"]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


logs = []
template = Template().from_template("base").run_cmd("echo built > /made.txt", user="root")
Template.build(template, f"on-base-{RUN}", on_build_logs=lambda e: logs.append(e.message))
text = "\n".join(logs)
check("the build runs on base's stored image", "is stored here" in text, text)

sbx = Sandbox.create(f"on-base-{RUN}", timeout=60)
try:
    r = sbx.commands.run("cat /made.txt /etc/image-release", user="root")
    check("the image's files and the step's are there", r.stdout.split() == ["built", "test", "image"], r)
finally:
    sbx.kill()

print("all checks passed", flush=True)
