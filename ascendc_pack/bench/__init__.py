"""Benchmarks (never tests): ``python -m ascendc_pack.bench kernels|model|build`` and
``ascendc-pack bench``. One module per concern:

* :mod:`.stats` -- the timing protocol: interleaved rounds, medians, spread, unstable rows;
* :mod:`.contenders` -- what each contender is, how its artifact is built, loaded and checked;
* :mod:`.workers` -- a process per contender, cold-start processes;
* :mod:`.model` -- the model benchmark (:func:`bench_model`);
* :mod:`.contention` -- one core kept busy by another process, slowdowns;
* :mod:`.kernels` -- the fused-kernel benchmark and kernel table (the kernel-spec reads);
* :mod:`.report` -- tables shared by the text report and docs/PERFORMANCE.md;
* :mod:`.machine` -- the host, its load and the other work while timing; :mod:`.extras` -- the optional ``bench`` packages.

docs/PERFORMANCE.md describes the protocol; ``bench/run_all.py`` regenerates it.
"""

from ascendc_pack.bench.contenders import BUNDLES, MODEL_CONTENDERS, PEERS, build_artifact, label
from ascendc_pack.bench.extras import MissingExtraError
from ascendc_pack.bench.kernels import EXAMPLES, bench_kernels
from ascendc_pack.bench.machine import (QUIET_OTHER_CORES, describe_other_work, host_cores, load_line, loadavg,
                                        machine_info, other_work_line)
from ascendc_pack.bench.model import bench_model
from ascendc_pack.bench.report import format_report
from ascendc_pack.bench.stats import interleaved_medians, interleaved_stats

__all__ = ["BUNDLES", "EXAMPLES", "MODEL_CONTENDERS", "PEERS", "QUIET_OTHER_CORES", "MissingExtraError",
           "bench_kernels", "bench_model", "build_artifact", "describe_other_work", "format_report", "host_cores",
           "interleaved_medians", "interleaved_stats", "label", "load_line", "loadavg", "machine_info",
           "other_work_line"]
