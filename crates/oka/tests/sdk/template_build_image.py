"""A template built `from_image` of an image in a registry (started by tests/template_build.rs):
the image is pulled through oka serve's image store, the steps run on its layers with its env,
and a sandbox of the template sees the image's files, the steps' files and the env of both.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID, OKA_TEST_IMAGE.
"""
import os

from e2b import Sandbox, Template

RUN = os.environ["OKA_RUN_ID"]
IMAGE = os.environ["OKA_TEST_IMAGE"]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


logs = []
template = (
    Template()
    .from_image(IMAGE)
    .set_envs({"STAGE": "built"})
    .set_workdir("/work")
    .run_cmd("echo \"$FROM_IMAGE/$STAGE in $(pwd)\" > /work/made.txt")
)
Template.build(template, f"from-image-{RUN}", on_build_logs=lambda e: logs.append(e.message))
text = "\n".join(logs)
check("the base is pulled from the registry", f"FROM {IMAGE}" in text and "pulled" in text, text)

sbx = Sandbox.create(f"from-image-{RUN}", timeout=60)
try:
    r = sbx.commands.run("cat /work/made.txt /etc/image-release", user="root")
    check("the step saw the image's env and its own", "from-image/built in /work" in r.stdout, r)
    check("the image's files are there", "test image" in r.stdout, r)
    r = sbx.commands.run("echo $FROM_IMAGE $STAGE; pwd", user="root")
    check("the sandbox has the image's and the template's env and workdir", r.stdout.split() == ["from-image", "built", "/work"], r)
finally:
    sbx.kill()

print("all checks passed", flush=True)
