"""Benchmark of flashattn2 against PyTorch SDPA backends and naive attention.

Command line: ``python -m flashattn2.bench --help``. Programmatic use::

    from flashattn2.bench import make_shapes, run_suite, markdown_table
    rows = run_suite(make_shapes([64], [32], [False], ["fp16"], total_tokens=64, hidden=64),
                     modes=["fwd", "bwd"], peers=None, device="cpu")
    print(markdown_table(rows))

The other benchmarks are scripts in benchmarks/ (python benchmarks/bench_features.py, ...); they use the
package's public API and, from here, collect_meta, default_stem and time_call.
"""

from .core import (
    ALL_PEERS,
    CPU_PEERS,
    GPU_PEERS,
    MODES,
    OURS,
    Shape,
    attention_flops,
    compute_ratios,
    make_row,
    make_shapes,
    measure_first_calls,
    measure_memory,
    naive_attention,
    paper_batch_nheads,
    run_suite,
    shape_flops,
    tflops_per_s,
    time_call,
)
from .report import collect_meta, default_stem, markdown_table, write_json

__all__ = [
    "ALL_PEERS",
    "CPU_PEERS",
    "GPU_PEERS",
    "MODES",
    "OURS",
    "Shape",
    "attention_flops",
    "collect_meta",
    "compute_ratios",
    "default_stem",
    "make_row",
    "make_shapes",
    "markdown_table",
    "measure_first_calls",
    "measure_memory",
    "naive_attention",
    "paper_batch_nheads",
    "run_suite",
    "shape_flops",
    "tflops_per_s",
    "time_call",
    "write_json",
]
