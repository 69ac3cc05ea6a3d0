"""E2B template builds through the real Python SDK's builder (started by tests/template_build.rs).

A template from oka's `base` (by name, and by the SDK's default `e2bdev/base`) with a command
(that also removes a file and replaces a directory: whiteouts and opaque directories),
a copied directory and a copied file with a mode, env, a working directory, a user and a start
command with a port check is built with its logs streamed; a sandbox of it has all of that and
its server answers; a template built on it adds a layer. A build whose command fails raises the SDK's BuildException naming the
step; the same build again without changes is answered from the cache.

Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, OKA_RUN_ID.
"""
import os
import tempfile

from e2b import BuildException, Sandbox, Template, wait_for_port

RUN = os.environ["OKA_RUN_ID"]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def run(sbx, cmd, user=None):
    try:
        return sbx.commands.run(cmd, timeout=60, user=user) if user else sbx.commands.run(cmd, timeout=60)
    except Exception as e:  # CommandExitException carries the result
        return e


context = tempfile.mkdtemp()
os.makedirs(os.path.join(context, "site/sub"))
with open(os.path.join(context, "site/index.html"), "w") as f:
    f.write("hello from a built template\n")
with open(os.path.join(context, "site/sub/data.txt"), "w") as f:
    f.write("nested\n")
with open(os.path.join(context, "tool.sh"), "w") as f:
    f.write("#!/bin/sh\necho tool ran\n")


def template(base):
    return (
        base.run_cmd(
            "echo building as $(whoami) && mkdir -p /opt/made && echo made > /opt/made/file"
            " && rm /etc/debian_version && rm -rf /etc/skel && mkdir /etc/skel && touch /etc/skel/only",
            user="root",
        )
        .copy("site", "/srv/site/")
        .copy("tool.sh", "/usr/local/bin/tool", mode=0o755)
        .set_envs({"GREETING": "hello", "APP_MODE": "built"})
        .set_workdir("/srv/site")
        .run_cmd("echo \"$GREETING from $(pwd)\" > /srv/site/env.txt", user="root")
        .set_user("user")
        .run_cmd("whoami > $HOME/builder-user")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )


logs = []
name = f"built-{RUN}"
info = Template.build(
    template(Template(file_context_path=context).from_template("base")),
    name,
    cpu_count=1,
    memory_mb=512,
    on_build_logs=lambda entry: (logs.append(entry.message), print("build:", entry.message, flush=True)),
)
text = "\n".join(logs)
check("the build streams step logs", "Step 1/8 : RUN" in text and "Step 8/8" in text, text)
check("a RUN's output is in the logs", "building as root" in text, text)

sbx = Sandbox.create(name, timeout=120)
try:
    r = run(sbx, "cat /opt/made/file")
    check("a RUN's files are in the template", r.exit_code == 0 and r.stdout.strip() == "made", r)
    r = run(sbx, "test ! -e /etc/debian_version && ls -A /etc/skel")
    check("a removed file stays removed, a replaced directory holds only its new files", r.exit_code == 0 and r.stdout.split() == ["only"], r)
    r = run(sbx, "cat /srv/site/index.html /srv/site/sub/data.txt")
    check("a copied directory's contents are at dest", r.exit_code == 0 and "hello from a built template" in r.stdout and "nested" in r.stdout, r)
    r = run(sbx, "stat -c '%a %U' /usr/local/bin/tool && tool")
    check("a copied file has its mode", r.exit_code == 0 and r.stdout.startswith("755 ") and "tool ran" in r.stdout, r)
    r = run(sbx, "echo $GREETING $APP_MODE")
    check("the env is the template's", r.stdout.strip() == "hello built", r)
    r = run(sbx, "cat /srv/site/env.txt")
    check("later RUNs saw the env and the workdir", r.stdout.strip() == "hello from /srv/site", r)
    r = run(sbx, "cat /home/user/builder-user; whoami")
    check("USER applies to later steps and the sandbox", r.stdout.split() == ["user", "user"], r)
    r = run(sbx, "pwd")
    check("the workdir is the template's", r.stdout.strip() == "/srv/site", r)
    r = run(sbx, "curl -s http://127.0.0.1:8000/index.html")
    check("the start command serves on port 8000", "hello from a built template" in r.stdout, r)
finally:
    sbx.kill()

# A template built on the built one stacks a layer on its image, env and user included.
Template.build(
    Template(file_context_path=context).from_template(name).run_cmd("echo layered > $HOME/second"),
    f"{name}-child",
    on_build_logs=lambda entry: None,
)
sbx = Sandbox.create(f"{name}-child", timeout=60)
try:
    r = run(sbx, "cat /opt/made/file /home/user/second; whoami; echo $GREETING")
    check("a template built on a built one has both layers", r.stdout.split() == ["made", "layered", "user", "hello"], r)
finally:
    sbx.kill()

# The SDK's default base, `e2bdev/base`, is oka's base template too; the same steps again
# without changes are answered from the cache.
logs.clear()
Template.build(
    template(Template(file_context_path=context).from_image("e2bdev/base")),
    f"{name}-again",
    on_build_logs=lambda entry: logs.append(entry.message),
)
check("an unchanged build is CACHED", "CACHED" in "\n".join(logs), "\n".join(logs))

failing = Template(file_context_path=context).from_template("base").run_cmd("echo before-failure").run_cmd("echo about to fail >&2; exit 3")
try:
    Template.build(failing, f"failing-{RUN}", on_build_logs=lambda entry: None)
    raise AssertionError("a failing build did not raise")
except BuildException as e:
    message = str(e)
    check("a failing RUN raises BuildException naming the step and exit code", "exit code 3" in message and "Step 2" in message and "about to fail" in message, message)

print("all checks passed", flush=True)
