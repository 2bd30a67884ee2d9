"""Test set-up: without a CUDA GPU the kernels run through the Triton interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton.jit decorates the kernels, that is before flashattn2 is
imported, so it is set here, at collection time. Outputs are NaN-poisoned so an unwritten element fails.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["FLASHATTN2_POISON_OUTPUTS"] = "1"


def pytest_collection_modifyitems(config, items):
    import pytest

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
