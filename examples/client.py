"""Call a model served by `ascendc-pack serve` (or Triton) with tritonclient's HTTP client.

    ascendc-pack serve mlp.ascpack --port 8080 &
    python examples/client.py --url 127.0.0.1:8080 --model mlp            # binary tensors
    python examples/client.py --url 127.0.0.1:8080 --model mlp --json     # JSON tensors
    python examples/client.py ... --check examples/mlp.py                 # compare with eager

It reads the model's metadata (names, V2 datatypes, shapes; a -1 batch dim gets ``--rows``),
sends random inputs of those shapes, and prints every output's shape and a checksum, plus the
round-trip time. With ``--check MODEL.py`` it also runs the eager PyTorch module on the same
inputs and compares under the project's accuracy rule (per-dtype tolerances, ``--rtol`` /
``--atol`` to override): exit status 2 when an output differs. A server that cannot be reached,
or a bad ``--url``, is one line on stderr and exit status 1. Needs `pip install
'tritonclient[http]'` (part of the `serve` extra); ``--check`` needs torch too.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype


def host_port(url: str) -> str:
    """``host:port`` from ``--url`` (``http://`` is accepted and dropped); SystemExit otherwise."""
    rest = url[len("http://"):] if url.startswith("http://") else url
    if "://" in rest:
        raise SystemExit(f"error: --url {url}: this client speaks plain HTTP; give host:port, e.g. 127.0.0.1:8080")
    host, _, port = rest.rstrip("/").rpartition(":")
    if not host or not port.isdigit() or "/" in rest.rstrip("/"):
        raise SystemExit(f"error: --url {url}: expected host:port (e.g. 127.0.0.1:8080), without a path")
    return rest.rstrip("/")


def random_input(meta: dict, rng: np.random.Generator, rows: int) -> np.ndarray:
    shape, datatype = list(meta["shape"]), meta["datatype"]
    if shape and shape[0] == -1:
        shape[0] = rows   # the batch dim
    if any(d < 0 for d in shape):
        raise SystemExit(f"error: input {meta['name']} has a variable dimension {meta['shape']}; pass your own data")
    if datatype == "BOOL":
        return rng.random(shape) < 0.5
    if datatype.startswith(("INT", "UINT")):
        return rng.integers(0, 100, size=shape).astype(triton_to_np_dtype(datatype))
    if datatype == "BF16":
        raise SystemExit(f"error: input {meta['name']} is BF16: numpy has no bfloat16; send it from torch bytes")
    return rng.standard_normal(shape).astype(triton_to_np_dtype(datatype))


def check_with_eager(model_file: str, arrays: list[np.ndarray], names: list[str], got: list[np.ndarray],
                     rtol: float | None, atol: float | None) -> str | None:
    """None when every output matches the model file's eager module (the runtime's accuracy
    rule), else the first difference."""
    import torch

    from ascendc_pack_runtime.eager import compare_with_eager, load_eager_module

    module = load_eager_module(model_file)
    checks, problem = compare_with_eager(module, [torch.from_numpy(np.array(x)) for x in arrays],
                                         [torch.from_numpy(np.array(y)) for y in got], names, rtol=rtol, atol=atol)
    for c in checks:
        print(f"  vs eager: {c.describe()}")
    return problem


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="127.0.0.1:8080", help="host:port (default: %(default)s)")
    p.add_argument("--model", required=True)
    p.add_argument("--version", default="", help="model version ('' = the server's default)")
    p.add_argument("--json", action="store_true", help="JSON tensors instead of the binary extension")
    p.add_argument("--repeat", type=int, default=3, help="requests to send (default: %(default)s)")
    p.add_argument("--rows", type=int, default=1, help="rows of a batch dim (-1 in the metadata; default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", metavar="MODEL.py", help="compare the outputs with this model file's eager module")
    p.add_argument("--rtol", type=float, default=None, help="--check: relative tolerance (default: per dtype)")
    p.add_argument("--atol", type=float, default=None, help="--check: absolute tolerance (default: per dtype)")
    a = p.parse_args(argv)
    url = host_port(a.url)

    client = httpclient.InferenceServerClient(url, network_timeout=300)
    try:
        if not client.is_server_live():
            print(f"error: {url}: the server is not live", file=sys.stderr)
            return 1
        if not client.is_model_ready(a.model, a.version):
            print(f"error: {url}: model {a.model!r} is not ready (or not served there)", file=sys.stderr)
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
        arrays = [random_input(m, rng, a.rows) for m in meta["inputs"]]
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
    except InferenceServerException as e:
        print(f"error: {url}: {e}", file=sys.stderr)
        return 1
    except OSError as e:   # refused, unreachable, reset: the server is not there
        reason = e.strerror or type(e).__name__
        print(f"error: cannot reach {url} ({reason}); is the server running? (ascendc-pack serve BUNDLE --port "
              f"{url.rpartition(':')[2]})", file=sys.stderr)
        return 1
    finally:
        client.close()

    if a.check:
        from ascendc_pack_runtime.eager import ModelFileLoadError

        try:
            problem = check_with_eager(a.check, arrays, [m["name"] for m in meta["outputs"]], got, a.rtol, a.atol)
        except ModelFileLoadError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if problem is not None:
            print(f"error: the server's outputs differ from {a.check}'s eager module: {problem}", file=sys.stderr)
            return 2
        print(f"outputs match {a.check}'s eager module")
    return 0


if __name__ == "__main__":
    sys.exit(main())
