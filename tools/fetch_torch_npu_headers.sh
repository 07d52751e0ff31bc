#!/usr/bin/env bash
# Fetch torch_npu's headers (and the seed's ascendc backend sources) for the compile checks of the
# npu device path - WITHOUT installing torch_npu (it would replace the CPU torch): the x86_64
# wheel of torch-npu 2.13.0 is downloaded from PyPI and unzipped into a cache directory, which
# tests/test_npu_device_headers.py looks for (ASCENDC_PACK_TORCH_NPU_DIR overrides it).
#
#   tools/fetch_torch_npu_headers.sh            # -> ~/.cache/ascendc-pack/torch_npu-2.13.0/torch_npu/include
set -euo pipefail
VERSION="${TORCH_NPU_VERSION:-2.13.0}"
DEST="${ASCENDC_PACK_TORCH_NPU_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ascendc-pack/torch_npu-$VERSION}"
PY="${PYTHON:-python3}"
if [ -f "$DEST/torch_npu/include/torch_npu/csrc/core/npu/NPUStream.h" ]; then
  echo "$DEST (already there)"
  exit 0
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
  "torch-npu==$VERSION" -d "$TMP" >&2
mkdir -p "$DEST"
"$PY" -m zipfile -e "$TMP"/torch_npu-*.whl "$DEST"
echo "$DEST"
