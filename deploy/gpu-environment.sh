#!/usr/bin/env bash
# Make the virtual environment $1 with the Python of $2 (the portal's), and install PyTorch's CUDA
# build there. `manage.py gpu_environment` (which `make run` runs) calls it only where nvidia-smi
# reports GPUs; the portal's own .venv keeps the CPU build.
#
# The CUDA wheels come from PyTorch's index, $RINGMASTER_TORCH_CUDA_INDEX (default: the CUDA 12.8
# builds), a few GB once; a later run finds them installed and returns at once. It fails (non-zero,
# saying why) when the install fails or leaves a torch without CUDA, as pip does where a local CPU
# wheel of the same version wins over an index it cannot reach.
set -euo pipefail

ENV=$(realpath -m "${1:?usage: gpu-environment.sh <environment folder> <portal python>}")
BASE=${2:?usage: gpu-environment.sh <environment folder> <portal python>}
VERSION=2.13.0
INDEX=${RINGMASTER_TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}
PY="$ENV/bin/python"

cuda_torch() {
    "$PY" -c "import sys, torch
sys.exit(not (torch.__version__.split('+')[0] == '$VERSION' and torch.version.cuda))" 2>/dev/null
}

if [ ! -x "$PY" ]; then
    echo "making $ENV, an environment for PyTorch's CUDA build"
    "$BASE" -m venv "$ENV"
fi
if cuda_torch; then
    echo "torch $VERSION (CUDA $("$PY" -c 'import torch; print(torch.version.cuda)')) already installed in $ENV"
    exit 0
fi
echo "installing torch $VERSION, CUDA build, into $ENV from $INDEX (a few GB, once)"
"$PY" -m pip install -q --upgrade pip
if ! "$PY" -m pip install -q "torch==$VERSION" --index-url "$INDEX"; then
    echo "torch $VERSION's CUDA build did not install from $INDEX (pip's message is above)" >&2
    exit 1
fi
if ! cuda_torch; then
    echo "pip installed torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?'), which" \
         "is not a CUDA build: $INDEX gave no CUDA wheel for torch $VERSION" >&2
    "$PY" -m pip uninstall -q -y torch   # so that the next run installs the CUDA build, not "already satisfied"
    exit 1
fi
echo "torch $VERSION with CUDA $("$PY" -c 'import torch; print(torch.version.cuda)') installed in $ENV"
