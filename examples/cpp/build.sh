#!/bin/sh
# Build run_bundle against the libtorch of the current Python environment:
#   examples/cpp/build.sh [OUTPUT]      (default: examples/cpp/run_bundle)
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/run_bundle}
PY=${PYTHON:-python}
flags=$($PY - <<'PY'
import torch, ascendc_pack_runtime as rt
from torch.utils import cpp_extension as ce
inc = " ".join(f"-I{p}" for p in ce.include_paths() + [str(rt.include_dir())])
lib = " ".join(f"-L{p} -Wl,-rpath,{p}" for p in ce.library_paths())
print(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)} {inc} {lib}")
PY
)
${CXX:-g++} -std=c++20 -O2 -w $flags "$here/run_bundle.cpp" -o "$out" -lc10 -ltorch_cpu -ldl
echo "$out"
