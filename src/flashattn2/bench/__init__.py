"""Benchmark of flashattn2 against PyTorch SDPA backends and naive attention.

Command line: ``python -m flashattn2.bench --help``. Programmatic use::

    from flashattn2.bench import make_shapes, run_suite, markdown_table
    rows = run_suite(make_shapes([64], [32], [False], ["fp16"], total_tokens=64, hidden=64),
                     modes=["fwd", "bwd"], peers=None, device="cpu")
    print(markdown_table(rows))
"""

from typing import TYPE_CHECKING, Any

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
)

# The report names are looked up on first use (__getattr__ below) rather than imported here:
# `python -m flashattn2.bench.report` runs report.py as __main__, and runpy warns when the package has
# already imported the module it is about to run.
if TYPE_CHECKING:
    from .report import (
        collect_meta,
        default_stem,
        markdown_report,
        markdown_table,
        memory_table,
        ratio_table,
        summary_markdown,
        tflops_table,
        write_json,
        write_markdown,
        write_results,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:  # only the report names get here: the core ones are module globals
        from . import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "markdown_report",
    "markdown_table",
    "measure_first_calls",
    "measure_memory",
    "memory_table",
    "naive_attention",
    "paper_batch_nheads",
    "ratio_table",
    "run_suite",
    "shape_flops",
    "summary_markdown",
    "tflops_per_s",
    "tflops_table",
    "write_json",
    "write_markdown",
    "write_results",
]
