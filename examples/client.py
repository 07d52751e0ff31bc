"""Call a model served by `ascendc-pack serve` (or Triton) with tritonclient's HTTP client.

    ascendc-pack serve mlp.ascpack --port 8080 &
    python examples/client.py --url 127.0.0.1:8080 --model mlp            # binary tensors
    python examples/client.py --url 127.0.0.1:8080 --model mlp --json     # JSON tensors
    python examples/client.py ... --check examples/mlp.py                 # compare with eager

It reads the model's metadata (names, V2 datatypes, static shapes), sends random inputs of
those shapes, and prints every output's shape and a checksum, plus the round-trip time. With
``--check MODEL.py`` it also runs the eager PyTorch module on the same inputs and prints the
largest difference. Needs `pip install 'tritonclient[http]'` (part of the `serve` extra).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype


def random_input(meta: dict, rng: np.random.Generator) -> np.ndarray:
    shape, datatype = meta["shape"], meta["datatype"]
    if any(d < 0 for d in shape):
        raise SystemExit(f"input {meta['name']} has a variable dimension {shape}; pass your own data")
    if datatype == "BOOL":
        return rng.random(shape) < 0.5
    if datatype.startswith(("INT", "UINT")):
        return rng.integers(0, 100, size=shape).astype(triton_to_np_dtype(datatype))
    if datatype == "BF16":
        raise SystemExit(f"input {meta['name']} is BF16: numpy has no bfloat16; send it from torch bytes")
    return rng.standard_normal(shape).astype(triton_to_np_dtype(datatype))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="127.0.0.1:8080", help="host:port, no scheme (default: %(default)s)")
    p.add_argument("--model", required=True)
    p.add_argument("--version", default="", help="model version ('' = the server's default)")
    p.add_argument("--json", action="store_true", help="JSON tensors instead of the binary extension")
    p.add_argument("--repeat", type=int, default=3, help="requests to send (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", metavar="MODEL.py", help="compare the outputs with this model file's eager module")
    a = p.parse_args(argv)

    client = httpclient.InferenceServerClient(a.url, network_timeout=300)
    try:
        if not client.is_server_live():
            print(f"{a.url}: server is not live", file=sys.stderr)
            return 1
        if not client.is_model_ready(a.model, a.version):
            print(f"{a.url}: model {a.model!r} is not ready (or not served there)", file=sys.stderr)
            return 1
        server = client.get_server_metadata()
        meta = client.get_model_metadata(a.model, a.version)
        print(f"server {server['name']} {server['version']}, extensions {server.get('extensions')}")
        print(f"model {meta['name']} versions {meta.get('versions')} platform {meta.get('platform')!r}")
        for kind in ("inputs", "outputs"):
            for t in meta[kind]:
                print(f"  {kind[:-1]:6s} {t['name']}: {t['datatype']} {t['shape']}")

        binary = not a.json
        rng = np.random.default_rng(a.seed)
        arrays = [random_input(m, rng) for m in meta["inputs"]]
        inputs = []
        for m, arr in zip(meta["inputs"], arrays):
            i = httpclient.InferInput(m["name"], list(arr.shape), m["datatype"])
            i.set_data_from_numpy(arr, binary_data=binary)
            inputs.append(i)
        outputs = [httpclient.InferRequestedOutput(m["name"], binary_data=binary) for m in meta["outputs"]]

        times = []
        for k in range(a.repeat):
            t0 = time.perf_counter()
            result = client.infer(a.model, inputs, model_version=a.version, outputs=outputs, request_id=str(k))
            times.append((time.perf_counter() - t0) * 1e3)
        mode = "JSON" if a.json else "binary"
        print(f"{a.repeat} x infer ({mode}): " + ", ".join(f"{t:.1f}" for t in times) + " ms")
        got = [result.as_numpy(m["name"]) for m in meta["outputs"]]
        for m, y in zip(meta["outputs"], got):
            print(f"  {m['name']}: {y.dtype}{list(y.shape)} sum {float(np.sum(y, dtype=np.float64)):.6g}")

        if a.check:
            import torch
            from torch.utils import _pytree as pytree

            from ascendc_pack.frontend.loader import load_model_file

            module = load_model_file(a.check).module
            with torch.no_grad():
                ref = pytree.tree_leaves(module(*[torch.from_numpy(np.array(x)) for x in arrays]))
            worst = max(float(np.max(np.abs(y.astype(np.float64) - r.numpy().astype(np.float64)), initial=0))
                        for y, r in zip(got, ref))
            print(f"max |server - eager| = {worst:.3g}")
    except InferenceServerException as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
