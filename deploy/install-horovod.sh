#!/usr/bin/env bash
# Install Horovod 0.28.1 (CPU, Gloo, PyTorch) into the virtual environment of $1.
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

if "$PY" -c "import horovod, horovod.torch; assert horovod.__version__ == '$VERSION'" 2>/dev/null; then
    echo "horovod $VERSION already installed"
    exit 0
fi

wheel=$(ls "$KEYDIR"/horovod-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    echo "building horovod $VERSION against torch $TORCH_VERSION (about 7 minutes, once)"
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
