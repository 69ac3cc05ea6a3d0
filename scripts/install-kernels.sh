#!/usr/bin/env bash
# Installs the Jupyter kernels and libraries that E2B's code-interpreter template has, on a
# Debian root (as root): the default template code-interpreter-v1 runs it inside its root while
# it is built (`oka templates build`; the script is carried in the oka binary, and a change to it
# rebuilds that template), and the test script runs it on the host for oka-interpreter's own
# tests. Everything goes under /usr/local:
#
#   /usr/local/lib/oka-kernels/python   a Python venv (the machine's python3) with ipykernel,
#                                       matplotlib, numpy, pandas, e2b-charts (E2B's chart
#                                       extraction, used by oka-interpreter's python setup) and
#                                       bash_kernel
#   /usr/local/bin/deno                 Deno 2 from the npm registry (@deno/linux-x64-glibc): the
#                                       JavaScript and TypeScript kernels (`deno jupyter`)
#   /usr/local/share/jupyter/kernels/   kernelspecs: python3, javascript, typescript, bash, r
#                                       (IRkernel from Debian), java (JJava from PyPI, on
#                                       Debian's JDK; its configuration in /etc/java-17-openjdk)
#
# Idempotent and quick when everything is there (a stamp per part records what was installed).
#
# Environment: FORCE=1 reinstalls every part.
set -euo pipefail

say() { printf 'install-kernels: %s\n' "$*" >&2; }
die() { printf 'install-kernels: error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "must run as root"
FORCE=${FORCE:-0}
PREFIX=/usr/local
LIB=$PREFIX/lib/oka-kernels
VENV=$LIB/python
KERNELS=$PREFIX/share/jupyter/kernels
# What the python venv holds; a change here reinstalls it.
PY_REQS="ipykernel matplotlib numpy pandas e2b-charts==1.0.0 bash_kernel==0.10.0 jjava==1.0a8"
DENO_VERSION=2.9.6

# done NAME VALUE: whether part NAME was installed with VALUE; mark NAME VALUE records it.
done_() { [[ $FORCE != 1 && -f $LIB/.stamp-$1 && $(cat "$LIB/.stamp-$1") == "$2" ]]; }
mark() { mkdir -p "$LIB"; printf '%s' "$2" >"$LIB/.stamp-$1"; }

apt_missing() { # packages -> those not installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || printf '%s ' "$p"
  done
}

kernelspec() { # name language display argv-json [env-json [interrupt-mode]]
  mkdir -p "$KERNELS/$1"
  printf '{"argv": %s, "display_name": "%s", "language": "%s", "env": %s, "interrupt_mode": "%s"}\n' \
    "$4" "$3" "$2" "${5:-{\}}" "${6:-signal}" >"$KERNELS/$1/kernel.json"
}

# --- Debian packages: Python with venv, R with IRkernel, a JDK (jshell) for JJava --------------
missing=$(apt_missing python3 python3-venv r-cran-irkernel openjdk-17-jdk-headless)
if [[ -n $missing ]]; then
  say "installing $missing"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null; } \
    || die "apt-get install $missing failed"
fi

# --- the python kernel's venv ---------------------------------------------------------------------
if ! done_ python "$PY_REQS" || [[ ! -x $VENV/bin/python ]]; then
  say "python venv in $VENV: $PY_REQS"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir $PY_REQS
  mark python "$PY_REQS"
fi
py=$VENV/bin/python
kernelspec python3 python "Python 3" "[\"$py\", \"-m\", \"ipykernel_launcher\", \"-f\", \"{connection_file}\"]"
kernelspec bash bash "Bash" "[\"$py\", \"-m\", \"bash_kernel\", \"-f\", \"{connection_file}\"]"
# JJava's kernelspec names its jars by {resource_dir}: copied as it is.
rm -rf "$KERNELS/java"
cp -r "$VENV/share/jupyter/kernels/java" "$KERNELS/java"

# --- Deno: the JavaScript and TypeScript kernels ---------------------------------------------------
if ! done_ deno "$DENO_VERSION" || [[ ! -x $PREFIX/bin/deno ]]; then
  say "deno $DENO_VERSION from npm"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm install --no-audit --no-fund --loglevel=error "@deno/linux-x64-glibc@$DENO_VERSION" >/dev/null) \
    || die "cannot install @deno/linux-x64-glibc@$DENO_VERSION from npm"
  bin=$(find "$tmp/node_modules/@deno/linux-x64-glibc" -type f -name deno | head -n1)
  [[ -n $bin ]] || die "no deno binary in @deno/linux-x64-glibc"
  install -m 0755 "$bin" "$PREFIX/bin/deno"
  rm -rf "$tmp"
  mark deno "$DENO_VERSION"
fi
deno_argv="[\"$PREFIX/bin/deno\", \"jupyter\", \"--kernel\", \"--conn\", \"{connection_file}\"]"
deno_env='{"DENO_NO_UPDATE_CHECK": "1", "NO_COLOR": "1"}'
# Deno ends on SIGINT; it stops a running cell on the control socket's interrupt_request.
kernelspec javascript javascript "JavaScript (Deno)" "$deno_argv" "$deno_env" message
kernelspec typescript typescript "TypeScript (Deno)" "$deno_argv" "$deno_env" message

# --- R: IRkernel from Debian, through R's own launcher (it reads /etc/R) ------------------------
kernelspec r R "R" \
  '["/usr/lib/R/bin/R", "--no-echo", "--no-restore", "--no-save", "-e", "IRkernel::main()", "--args", "{connection_file}"]' \
  '{"LANG": "C.UTF-8"}'

say "kernels ready: $(ls "$KERNELS" | tr '\n' ' ')"
