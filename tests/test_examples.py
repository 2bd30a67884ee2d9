"""The GPT recipe (examples/gpt) runs end to end on a tiny model and writes its result set; on the CPU the
kernels run through the interpreter, so this checks the plumbing, not the speed."""

import importlib.util
import json
import sys
from pathlib import Path

from helpers import DEVICE

RECIPE = Path(__file__).parent.parent / "examples" / "gpt" / "train.py"


def test_gpt_recipe_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("gpt_train", RECIPE)
    train = importlib.util.module_from_spec(spec)
    sys.modules["gpt_train"] = train
    spec.loader.exec_module(train)
    rc = train.main(["--config", "tiny", "--seqlen", "32", "--batch-tokens", "64", "--steps", "3", "--warmup", "1",
                     "--no-compile", "--device", DEVICE, "--backends", "flashattn2", "sdpa-math",
                     "--out-dir", str(tmp_path), "--log-every", "1"])
    assert rc == 0
    (result,) = tmp_path.glob("*.json")
    data = json.loads(result.read_text())
    losses = {r["backend"]: r["losses"] for r in data["results"]}
    assert set(losses) == {"flashattn2", "sdpa-math"}
    # the same seed and batches: the two backends' curves agree to bf16 noise
    for a, b in zip(losses["flashattn2"], losses["sdpa-math"], strict=True):
        assert abs(a - b) < 0.05 * abs(b)
    assert result.with_suffix(".md").exists()
