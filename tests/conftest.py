"""Test set-up: without a CUDA GPU the kernels run through the Triton interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton.jit decorates the kernels, that is before flashattn2 is
imported, so it is set here, at collection time. Outputs are NaN-poisoned so an unwritten element fails.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["FLASHATTN2_POISON_OUTPUTS"] = "1"


@pytest.fixture(scope="session")
def compile_child():
    """A child process that compiles kernels for sm_90 without the interpreter, one per test worker."""
    from compile_child import CompileChild

    child = CompileChild()
    yield child
    child.close()


def pytest_collection_modifyitems(config, items):
    import pytest

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Why tests were skipped, by reason and count (pytest -q shows the total alone)."""
    from collections import Counter

    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        # longrepr of a skip: (file, line, "Skipped: reason")
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_line("skipped: " + "; ".join(f"{n} {why}" for why, n in reasons.most_common()))
