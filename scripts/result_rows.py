"""The JSON file an A/B or sweep script writes: {"meta": the device, torch and Triton versions, the UTC time and the
script's own fields, "rows": its measurements}."""

import json
import os
import time

import torch
import triton


def write_rows(path: str, rows: list, **extra) -> None:
    """Write rows to path (its folder made if missing), with the run's meta and extra fields."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **extra)
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
