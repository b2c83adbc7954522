#!/usr/bin/env bash
# Install Horovod 0.28.1 (CPU, Gloo, PyTorch) into the virtual environment of $1.
#
# With HOROVOD_GPU_OPERATIONS=NCCL (as `manage.py gpu_environment` runs it for the environment with
# PyTorch's CUDA build), the GPU operations too: against NCCL from PyTorch's CUDA wheels (the
# nvidia-nccl package) unless HOROVOD_NCCL_HOME/_LIB say where, compiled with the CUDA toolkit's
# nvcc (on PATH, or in $HOROVOD_CUDA_HOME). That wheel is cached apart from the CPU one.
#
# Horovod's newest release does not build as published against torch 2.13 and CMake 4; the
# two fixes are documented in DESIGN.md. The build takes ~7 minutes on 2 cores, so the wheel is
# built once and cached outside the repo ($RINGMASTER_WHEEL_CACHE, default
# ~/.cache/ringmaster/wheels); every later run installs the cached wheel in seconds.
set -euo pipefail

PY=$(realpath -s "${1:?usage: install-horovod.sh <venv python>}")
VERSION=0.28.1
CACHE=${RINGMASTER_WHEEL_CACHE:-$HOME/.cache/ringmaster/wheels}
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
# The wheel links against one torch ABI: key the cache by the torch version too.
KEYDIR="$CACHE/horovod-$VERSION-torch-$TORCH_VERSION"
GPU_OPS=${HOROVOD_GPU_OPERATIONS:-}
INSTALLED="import horovod, horovod.torch; assert horovod.__version__ == '$VERSION'"
if [ -n "$GPU_OPS" ]; then
    CUDA=$("$PY" -c 'import torch; print(torch.version.cuda or "")')
    if [ -z "$CUDA" ]; then
        echo "HOROVOD_GPU_OPERATIONS=$GPU_OPS needs PyTorch's CUDA build; $PY has a torch without CUDA" >&2
        exit 1
    fi
    KEYDIR="$KEYDIR-cuda$CUDA-$(printf %s "$GPU_OPS" | tr '[:upper:]' '[:lower:]')"
    INSTALLED="$INSTALLED; assert horovod.torch.nccl_built()"
fi

if "$PY" -c "$INSTALLED" 2>/dev/null; then
    echo "horovod $VERSION already installed${GPU_OPS:+ (GPU operations: $GPU_OPS)}"
    exit 0
fi

wheel=$(ls "$KEYDIR"/horovod-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "building horovod $VERSION against torch $TORCH_VERSION${GPU_OPS:+ and CUDA $CUDA with $GPU_OPS} (minutes, once)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PY" -m pip install -q setuptools wheel cmake==3.31.6 cffi cloudpickle psutil pyyaml packaging
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$VERSION"
    tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
    src="$work/horovod-$VERSION"
    # PyTorch >= 2.1 headers need C++17 (horovod#3996; fixed on master, not released).
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt"
    mkdir -p "$KEYDIR"
    (
        cd "$src"
        export CMAKE_POLICY_VERSION_MINIMUM=3.5   # vendored Gloo asks for CMake 2.8
        export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
        export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
        if [ -n "$GPU_OPS" ] && [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_LIB:-}" ]; then
            nccl=$("$PY" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
            # The wheel holds libnccl.so.2 alone; CMake's find_library looks for libnccl.so.
            [ -e "$nccl/lib/libnccl.so" ] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
            export HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$nccl/lib" HOROVOD_NCCL_LINK=SHARED
        fi
        export MAKEFLAGS="-j$(nproc)"
        "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir -w "$work/dist" .
    )
    cp "$work"/dist/horovod-"$VERSION"-*.whl "$KEYDIR/.tmp.whl"
    wheel="$KEYDIR/$(basename "$work"/dist/horovod-"$VERSION"-*.whl)"
    mv "$KEYDIR/.tmp.whl" "$wheel"   # atomic: a half-copied wheel is never picked up
fi

"$PY" -m pip install -q --no-cache-dir "$wheel"
"$PY" -m horovod.runner.launch --check-build >/dev/null
echo "horovod $VERSION installed from $wheel"
