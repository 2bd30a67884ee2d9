"""CPU-only tests of the benchmark's pure parts (no kernels, no GPU)."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flashattn2.bench import (
    MODES,
    OURS,
    Shape,
    attention_flops,
    make_row,
    make_shapes,
    markdown_table,
    measure_first_calls,
    naive_attention,
    paper_batch_nheads,
    run_suite,
    tflops_per_s,
    write_json,
)
from flashattn2.bench.core import fresh_triton_cache
from flashattn2.bench.report import default_stem, device_slug, stdout_line

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# the scripts import one another by name, as they do when run as python benchmarks/<name>.py
sys.path.insert(0, str(BENCHMARKS))


def _script(name: str):
    """A script of benchmarks/ (report and plot formatting, kept outside the package) as a module."""
    import importlib.util

    path = BENCHMARKS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report_bench = _script("report_bench")
markdown_report, write_markdown = report_bench.markdown_report, report_bench.write_markdown
ratio_table, tflops_table = report_bench.ratio_table, report_bench.tflops_table
fmt_ratio_range = report_bench.fmt_ratio_range


def test_flops_forward_formula_and_causal_halving() -> None:
    fwd = attention_flops(2, 16, 1024, 1024, 128)
    assert fwd == 4 * 2 * 16 * 1024 * 1024 * 128
    assert attention_flops(2, 16, 1024, 1024, 128, causal=True) == fwd / 2
    assert attention_flops(1, 1, 128, 256, 64) == 4 * 128 * 256 * 64


@pytest.mark.parametrize("causal", [False, True])
def test_flops_backward_factors(causal: bool) -> None:
    fwd = attention_flops(4, 8, 512, 512, 64, causal, "fwd")
    assert attention_flops(4, 8, 512, 512, 64, causal, "bwd") == pytest.approx(2.5 * fwd)
    assert attention_flops(4, 8, 512, 512, 64, causal, "fwd_bwd") == pytest.approx(3.5 * fwd)
    with pytest.raises(ValueError):
        attention_flops(4, 8, 512, 512, 64, causal, "bogus")


def test_tflops_per_s() -> None:
    assert tflops_per_s(2e12, 1000.0) == pytest.approx(2.0)
    assert tflops_per_s(1e12, 1.0) == pytest.approx(1000.0)
    assert tflops_per_s(1e12, None) is None


def test_paper_shapes() -> None:
    shapes = make_shapes()
    assert len(shapes) == 6 * 3 * 2 * 2
    for s in shapes:
        assert s.batch * s.seqlen == 16384
        assert s.nheads * s.headdim == 2048
    assert {s.dtype for s in shapes} == {"bf16", "fp16"}
    assert {s.causal for s in shapes} == {False, True}
    small = make_shapes([256, 512], [32, 64], [True], ["fp16"], total_tokens=1024, hidden=256)
    assert [(s.batch, s.seqlen, s.nheads, s.headdim) for s in small] == [
        (4, 256, 8, 32),
        (2, 512, 8, 32),
        (4, 256, 4, 64),
        (2, 512, 4, 64),
    ]
    assert paper_batch_nheads(32768, 128, 16384, 2048) == (1, 16)  # never an empty batch
    with pytest.raises(ValueError):
        paper_batch_nheads(1024, 128, 16384, 2000)
    with pytest.raises(ValueError):
        make_shapes([64], [32], [False], ["fp8"])


def test_naive_attention_matches_sdpa_math() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g) for _ in range(3))
    mask = torch.ones(40, 40, dtype=torch.bool).triu(1)
    torch.testing.assert_close(naive_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(
        naive_attention(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


def _fake_rows() -> list[dict]:
    rows = []
    for causal in (False, True):
        shape = Shape(batch=8, seqlen=2048, nheads=16, headdim=128, causal=causal, dtype="bf16")
        for mode in MODES:
            flops = attention_flops(8, 16, 2048, 2048, 128, causal, mode)

            def ms_for(tf: float, flops: float = flops) -> float:
                return flops / (tf * 1e12) * 1e3

            ms = {
                OURS: ms_for(300.0),
                "sdpa-flash": ms_for(200.0),
                "sdpa-cudnn": ms_for(400.0),
                "sdpa-mem-eff": None,
                "naive": None,
            }
            notes = {"sdpa-mem-eff": "RuntimeError: No available kernel", "naive": "skipped: too big"}
            rows.append(make_row(shape, mode, ms, notes))
    return rows


def _table_lines(md: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("|")
    ]


def test_markdown_table_ratios_and_missing_peers() -> None:
    rows = _fake_rows()
    md = markdown_table(rows)
    for mode in MODES:
        assert f"### bf16 {mode} (TFLOP/s)" in md
    lines = _table_lines(md)
    header = lines[0]
    assert header == [
        "hdim",
        "causal",
        "seqlen",
        OURS,
        "sdpa-flash",
        "sdpa-cudnn",
        "sdpa-mem-eff",
        "naive",
        "ours/sdpa-flash",
        "ours/sdpa-cudnn",
    ]
    data = [ln for ln in lines if ln[0] == "128"]
    assert len(data) == 6  # 2 causal x 3 modes
    for cells in data:
        cell = dict(zip(header, cells, strict=True))
        assert cell[OURS] == "300.0"
        assert cell["sdpa-flash"] == "200.0"
        assert cell["sdpa-mem-eff"] == "n/a"
        assert cell["naive"] == "n/a"
        assert cell["ours/sdpa-flash"] == "1.50"
        assert cell["ours/sdpa-cudnn"] == "0.75"
    assert {c[1] for c in data} == {"yes", "no"}


def test_markdown_table_ratio_with_missing_ours_and_no_default_peers() -> None:
    shape = Shape(1, 64, 2, 32, False, "fp16")
    flops = attention_flops(1, 2, 64, 64, 32)
    row = make_row(shape, "fwd", {OURS: None, "sdpa-math": flops / 1e9, "naive": flops / 2e9})
    lines = _table_lines(markdown_table([row]))
    # On CPU there is no sdpa-flash / sdpa-cudnn: the ratios fall back to the peers that were measured.
    assert lines[0][-2:] == ["ours/sdpa-math", "ours/naive"]
    assert lines[2][3] == "n/a"
    assert lines[2][-2:] == ["n/a", "n/a"]
    assert row["ratios"] == {"sdpa-math": None, "naive": None}


def test_row_ratios_match_table() -> None:
    row = _fake_rows()[0]
    assert row["ratios"]["sdpa-flash"] == pytest.approx(1.5)
    assert row["ratios"]["sdpa-cudnn"] == pytest.approx(0.75)
    assert row["ratios"]["naive"] is None
    assert row["tflops"][OURS] == pytest.approx(300.0)
    assert "n/a" in stdout_line(row, [OURS, "sdpa-mem-eff"])
    assert "skip" in stdout_line(row, [OURS, "naive"])


def _fake_memory() -> dict:
    return {
        "batch": 1,
        "nheads": 16,
        "headdim": 128,
        "dtype": "bf16",
        "causal": False,
        "rows": [
            {
                "seqlen": s,
                "qkv_mib": 3 * s * 16 * 128 * 2 / 2**20,
                "mib": {OURS: s / 64, "naive": (s / 64) ** 2 if s < 4096 else None},
                "notes": {} if s < 4096 else {"naive": "skipped: too big"},
            }
            for s in (1024, 2048, 4096)
        ],
    }


def test_write_json_and_markdown(tmp_path) -> None:
    rows, memory = _fake_rows(), _fake_memory()
    meta = {
        "device": "NVIDIA H100 80GB HBM3",
        "torch": "2.x",
        "command": "python -m flashattn2.bench --quick",
    }
    path = write_json(tmp_path / "r.json", meta, rows, memory)
    doc = json.loads(path.read_text())
    assert set(doc) == {"meta", "rows", "memory", "first_call"}
    assert doc["first_call"] is None
    assert doc["meta"]["device"] == meta["device"]
    assert len(doc["rows"]) == 6
    assert doc["rows"][0]["tflops"]["naive"] is None
    assert doc["rows"][0]["ratios"]["sdpa-flash"] == pytest.approx(1.5)
    assert doc["memory"]["rows"][2]["mib"]["naive"] is None

    md = write_markdown(tmp_path / "out" / "tagged.md", meta, rows, memory).read_text()
    assert md.startswith("# flashattn2 benchmark")
    assert "- device: NVIDIA H100 80GB HBM3" in md
    assert "Peak extra memory" in md
    assert "| 4096 | 48.0 | 64.0 | n/a |" in md
    assert "sdpa-mem-eff: RuntimeError: No available kernel" in md
    assert md == markdown_report(meta, rows, memory)


def test_default_stem() -> None:
    import datetime as dt

    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    when = dt.datetime(2025, 3, 4, 12, 0, tzinfo=dt.timezone.utc)
    assert default_stem("NVIDIA H100 80GB HBM3", when) == "2025-03-04_nvidia-h100-80gb-hbm3"


def test_run_suite_cpu_with_stand_in() -> None:
    """The CPU path end to end, with the reference as a stand-in for the kernels."""

    def stand_in(q, k, v, causal=False):
        # (b, s, h, d) in and out, like flash_attn_func.
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
        )
        return out.transpose(1, 2)

    shapes = [Shape(1, 32, 2, 16, True, "fp32")]
    rows = run_suite(shapes, MODES, ["sdpa-math", "naive", "sdpa-flash"], "cpu", cpu_reps=1, ours_fn=stand_in)
    assert [r["mode"] for r in rows] == list(MODES)
    for r in rows:
        assert list(r["tflops"]) == [OURS, "sdpa-math", "naive", "sdpa-flash"]
        for name in (OURS, "sdpa-math", "naive"):
            assert r["ms"][name] is not None and r["ms"][name] > 0, r["notes"]
        assert r["tflops"]["sdpa-flash"] is None
        assert r["notes"]["sdpa-flash"] == "needs a CUDA device"
    assert "sdpa-math" in markdown_table(rows)


def _plot_script():
    """benchmarks/plot_bench.py, the plots kept outside the package."""
    pytest.importorskip("matplotlib")
    return _script("plot_bench")


def test_plot(tmp_path) -> None:
    write_plot = _plot_script().write_plot
    rows = _fake_rows()
    # A second seqlen so the lines have two points.
    rows += [dict(r, seqlen=4096) for r in rows]
    path = write_plot(tmp_path / "p.png", rows, _fake_memory(), title="test")
    assert path is not None and path.exists()
    assert 0 < path.stat().st_size < 1_000_000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not math.isnan(rows[0]["tflops"][OURS])


def _stand_in(q, k, v, causal=False):
    """flash_attn_func's contract ((b, s, h, d) in and out) on top of SDPA, for CPU runs."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
    )
    return out.transpose(1, 2)


def test_cli_without_cuda_exits_2(monkeypatch, capsys) -> None:
    from flashattn2.bench.__main__ import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--quick"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_cli_glue_on_cpu(monkeypatch, tmp_path, capsys) -> None:
    """The CLI end to end with the measurements redirected to the CPU path (no GPU here)."""
    import flashattn2.bench.__main__ as cli

    real_run_suite = run_suite

    def cpu_run_suite(shapes, modes, peers, device, **kw):
        kw.update(warmup_ms=0, rep_ms=0)
        return real_run_suite(shapes, modes, peers, "cpu", cpu_reps=1, ours_fn=_stand_in, **kw)

    def fake_memory(seqlens, peers, device, **kw):
        rows = [
            {"seqlen": s, "qkv_mib": 1.0, "mib": {OURS: 2.0, **dict.fromkeys(peers, None)}, "notes": {}}
            for s in seqlens
        ]
        for row in rows:
            kw["on_row"](row)
        return {
            "batch": kw["batch"],
            "nheads": kw["nheads"],
            "headdim": kw["headdim"],
            "dtype": kw["dtype"],
            "causal": False,
            "rows": rows,
        }

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU 9000")
    real_first_calls = measure_first_calls
    cache_dirs = []

    def cpu_first_calls(shapes, modes, device, **kw):
        # --cold-cache must already point Triton at a fresh, empty directory when the first call runs.
        path = os.environ.get("TRITON_CACHE_DIR")
        cache_dirs.append(path)
        assert path and os.path.isdir(path) and not os.listdir(path)
        return real_first_calls(shapes, modes, "cpu", ours_fn=_stand_in, **kw)

    monkeypatch.setattr(cli, "run_suite", cpu_run_suite)
    monkeypatch.setattr(cli, "measure_memory", fake_memory)
    monkeypatch.setattr(cli, "measure_first_calls", cpu_first_calls)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    argv = [
        "--seqlens",
        "32",
        "64",
        "--hdims",
        "16",
        "--dtypes",
        "fp32",
        "--causal",
        "1",
        "--peers",
        "sdpa-math",
        "naive",
        "--total-tokens",
        "64",
        "--hidden",
        "32",
        "--out-dir",
        str(tmp_path),
        "--tag",
        "smoke",
        "--cold-cache",
    ]
    assert cli.main(argv) == 0
    assert len(cache_dirs) == 1 and cache_dirs[0] != "/somewhere/else"
    assert not os.path.exists(cache_dirs[0])  # the temporary cache is removed afterwards
    assert os.environ["TRITON_CACHE_DIR"] == "/somewhere/else"  # and the variable restored
    out = capsys.readouterr().out
    assert "### fp32 fwd_bwd (TFLOP/s)" in out and "elapsed" in out
    assert "first call fp32 hdim 16 causal 1 seqlen 32: fwd " in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.json"]
    assert report_bench.main([str(tmp_path / "smoke.json")]) == 0  # the markdown report, from the JSON
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.json", "smoke.md"]
    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert doc["meta"]["device"] == "Fake GPU 9000"
    assert doc["meta"]["command"].startswith("python -m flashattn2.bench --seqlens 32 64")
    assert len(doc["rows"]) == 2 * 3
    assert {(r["batch"], r["nheads"]) for r in doc["rows"]} == {(2, 2), (1, 2)}
    assert all(r["tflops"][OURS] is not None for r in doc["rows"])
    assert doc["memory"]["rows"][0]["mib"][OURS] == 2.0
    assert doc["meta"]["cold_cache"] is True
    [first] = doc["first_call"]  # one (dtype, hdim, causal) combination: one entry, at its first seqlen
    assert (first["dtype"], first["hdim"], first["causal"], first["seqlen"]) == ("fp32", 16, True, 32)
    assert first["fwd_s"] > 0 and first["bwd_s"] > 0 and first["note"] is None
    md = (tmp_path / "smoke.md").read_text()
    assert "Fresh Triton cache (--cold-cache)" in md
    assert "| fp32 | 16 | yes | 32 |" in md


def test_feature_report_files(tmp_path):
    write = _script("bench_features").write

    rows = [{"feature": "window", "variant": "causal", "fwd_ms": 2.0, "bwd_ms": 5.0},
            {"feature": "window", "variant": "causal + window (1024, 0)", "fwd_ms": 0.3, "bwd_ms": 0.8}]
    meta = {"device": "test device", "torch": "x", "triton": "y", "date_utc": "2026-11-21"}
    paths = write(rows, meta, tmp_path, "stem")
    assert [p.name for p in paths] == ["stem_features.json", "stem_features.md"]
    text = paths[1].read_text()
    assert "| window | causal + window (1024, 0) | 0.300 | 0.800 |" in text and "test device" in text


def test_feature_plot_from_the_result_file(tmp_path):
    write = _script("bench_features").write

    rows = [{"feature": "window", "variant": "causal", "fwd_ms": 2.0, "bwd_ms": 5.0}]
    paths = write(rows, {"device": "test device"}, tmp_path, "stem")
    png = _plot_script().plot_file(paths[0])
    assert png.name == "stem_features.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------ summary tables

# ours / peer per (mode, seqlen); ours runs at 100 TFLOP/s, so the peer runs at 100 / ratio. None: not
# measured. Picked so that the seqlen windows matter: 512 is outside 1k-16k (fwd/cuDNN 0.50 must not show
# there), bwd 4096 (0.40) is inside 1k-16k but outside the short causal window, whose min (0.45) is bwd 1k.
_CUDNN = {
    "fwd": {512: 0.50, 1024: 0.85, 2048: 0.90, 4096: 0.97, 8192: 0.93, 16384: 0.88},
    "bwd": {512: 0.60, 1024: 0.45, 2048: 0.65, 4096: 0.40, 8192: 0.70, 16384: 0.75},
    "fwd_bwd": dict.fromkeys((512, 1024, 2048, 4096, 8192, 16384), 0.10),  # must not show anywhere
}
_FLASH = {
    "fwd": {512: 2.00, 1024: 1.30, 2048: 1.30, 4096: 1.30, 8192: 1.30, 16384: None},
    "bwd": dict.fromkeys((512, 1024, 2048, 4096, 8192, 16384)),
    "fwd_bwd": dict.fromkeys((512, 1024, 2048, 4096, 8192, 16384), 0.10),
}


def _summary_rows(dtype: str = "bf16", hdims: tuple[int, ...] = (128, 64)) -> list[dict]:
    rows = []
    for hdim in hdims:
        for causal in (True, False):
            for seqlen in (16384, 512, 1024, 2048, 4096, 8192):  # out of order on purpose
                shape = Shape(max(1, 16384 // seqlen), seqlen, 2048 // hdim, hdim, causal, dtype)
                for mode in MODES:
                    flops = attention_flops(shape.batch, shape.nheads, seqlen, seqlen, hdim, causal, mode)

                    def ms_for(ratio: float | None, flops: float = flops) -> float | None:
                        return None if ratio is None else flops / (100.0 / ratio * 1e12) * 1e3

                    ms = {
                        OURS: ms_for(1.0),
                        "sdpa-flash": ms_for(_FLASH[mode][seqlen]),
                        "sdpa-cudnn": ms_for(_CUDNN[mode][seqlen]),
                    }
                    rows.append(make_row(shape, mode, ms))
    return rows


RATIO_HEADER = (
    "| dtype | hdim | causal | fwd / cuDNN 1k-16k | fwd / SDPA-flash 1k-16k | bwd / cuDNN 1k-16k "
    "| bwd / SDPA-flash 1k-16k | causal 512-2k / cuDNN, min |"
)


def test_fmt_ratio_range() -> None:
    assert fmt_ratio_range([0.97, 0.851, 0.9]) == "0.85-0.97"
    assert fmt_ratio_range([1.304, 1.296]) == "1.30"  # both ends print the same: one number
    assert fmt_ratio_range([]) == "n/a"


def test_ratio_table_exact() -> None:
    rows = _summary_rows("bf16") + _summary_rows("fp16", hdims=(64,))
    lines = ratio_table(rows).splitlines()
    assert lines[0] == RATIO_HEADER
    assert lines[1] == "|---|---|---|---:|---:|---:|---:|---:|"
    assert lines[2:] == [
        "| bf16 | 64 | no | 0.85-0.97 | 1.30 | 0.40-0.75 | n/a |  |",
        "| bf16 | 64 | yes | 0.85-0.97 | 1.30 | 0.40-0.75 | n/a | 0.45 |",
        "| bf16 | 128 | no | 0.85-0.97 | 1.30 | 0.40-0.75 | n/a |  |",
        "| bf16 | 128 | yes | 0.85-0.97 | 1.30 | 0.40-0.75 | n/a | 0.45 |",
        "| fp16 | 64 | no | 0.85-0.97 | 1.30 | 0.40-0.75 | n/a |  |",
        "| fp16 | 64 | yes | 0.85-0.97 | 1.30 | 0.40-0.75 | n/a | 0.45 |",
    ]
    # Rows without a stored 'ratios' dict (hand-made) give the same table, recomputed from TFLOP/s.
    bare = [{k: v for k, v in r.items() if k != "ratios"} for r in rows]
    assert ratio_table(bare) == ratio_table(rows)
    # The stored ratios are what the table reads: raising the 1k ones moves both ranges and the short min.
    bumped = [dict(r, ratios=dict(r["ratios"], **{"sdpa-cudnn": 1.234})) if r["seqlen"] == 1024 else r for r in rows]
    assert ratio_table(bumped).splitlines()[3] == "| bf16 | 64 | yes | 0.88-1.23 | 1.30 | 0.40-1.23 | n/a | 0.50 |"


def test_tflops_table_exact() -> None:
    rows = _summary_rows("bf16") + _summary_rows("fp16", hdims=(64,))  # fp16 has no hdim 128: no lines
    assert tflops_table(rows).splitlines() == [
        "| dtype | mode | causal | seqlen | ours | cuDNN | SDPA-flash |",
        "|---|---|---|---:|---:|---:|---:|",
        "| bf16 | fwd | no | 8192 | 100.0 | 107.5 | 76.9 |",
        "| bf16 | fwd | no | 16384 | 100.0 | 113.6 | n/a |",
        "| bf16 | fwd | yes | 8192 | 100.0 | 107.5 | 76.9 |",
        "| bf16 | fwd | yes | 16384 | 100.0 | 113.6 | n/a |",
        "| bf16 | bwd | no | 8192 | 100.0 | 142.9 | n/a |",
        "| bf16 | bwd | no | 16384 | 100.0 | 133.3 | n/a |",
        "| bf16 | bwd | yes | 8192 | 100.0 | 142.9 | n/a |",
        "| bf16 | bwd | yes | 16384 | 100.0 | 133.3 | n/a |",
    ]
    assert tflops_table(_summary_rows("fp16", hdims=(64,))) == ""


def test_report_cli_prints_summary(tmp_path, capsys) -> None:
    def main(files):
        return report_bench.main(["--summary", *files])

    meta = {"device": "Fake GPU", "torch": "2.x", "triton": "3.y", "date_utc": "2026-01-02 03:04:05 UTC"}
    write_json(tmp_path / "a.json", dict(meta, git_commit="0123456789" * 4), _summary_rows("bf16"))
    write_json(tmp_path / "b.json", dict(meta, git_commit=None), _summary_rows("fp16", hdims=(64,)))
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert RATIO_HEADER in out
    assert "| fp16 | 64 | yes | 0.85-0.97 | 1.30 | 0.40-0.75 | n/a | 0.45 |" in out
    assert "| bf16 | bwd | yes | 16384 | 100.0 | 133.3 | n/a |" in out
    # Different set-ups: one meta line each, saying which dtypes it covers; under the tables.
    assert out[-2:] == [
        "- bf16: Fake GPU, torch 2.x, triton 3.y, 2026-01-02, commit 0123456",
        "- fp16: Fake GPU, torch 2.x, triton 3.y, 2026-01-02, commit unknown",
    ]
    assert main([str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "Measured on Fake GPU, torch 2.x, triton 3.y, 2026-01-02, commit 0123456."
    assert main([str(tmp_path / "missing.json")]) == 2


def test_markdown_report_summary_on_top_and_first_call(tmp_path) -> None:
    rows = _summary_rows("bf16", hdims=(128,))
    meta = {"device": "Fake GPU", "torch": "2.x", "triton": "3.y", "date_utc": "2026-01-02", "cold_cache": False}
    first = [
        {"dtype": "bf16", "hdim": 128, "causal": False, "seqlen": 512, "batch": 32, "nheads": 16,
         "fwd_s": 2.345, "bwd_s": 6.0, "note": None},
        {"dtype": "bf16", "hdim": 128, "causal": True, "seqlen": 512, "batch": 32, "nheads": 16,
         "fwd_s": None, "bwd_s": None, "note": "RuntimeError: boom"},
    ]
    json_path = write_json(tmp_path / "r.json", meta, rows, None, first)
    assert report_bench.main([str(json_path)]) == 0
    md = (tmp_path / "r.md").read_text()
    # The summary tables come first, the full per-row tables after them.
    assert md.index("## Summary") < md.index(RATIO_HEADER) < md.index("| dtype | mode | causal | seqlen | ours |")
    assert md.index("| bf16 | bwd | yes | 16384 | 100.0 | 133.3 | n/a |") < md.index("## bf16 fwd (TFLOP/s)")
    assert "Measured on Fake GPU, torch 2.x, triton 3.y, 2026-01-02, commit unknown." in md
    assert "| bf16 | 128 | no | 512 | 2.35 | 6.00 |" in md
    assert "| bf16 | 128 | yes | 512 | n/a | n/a |" in md
    assert "- bf16 d128 causal: RuntimeError: boom" in md
    assert "Triton's disk cache as found" in md
    assert json.loads(json_path.read_text())["first_call"] == first
    assert md == markdown_report(meta, rows, None, first)


# -------------------------------------------------------------------------------------------- first call


def test_measure_first_calls_one_call_per_combination() -> None:
    calls = []

    def counting(q, k, v, causal=False):
        calls.append((q.shape[1], causal, torch.is_grad_enabled()))
        return _stand_in(q, k, v, causal)

    shapes = make_shapes([64, 32], [16], [False, True], ["fp32"], total_tokens=64, hidden=32)
    entries = measure_first_calls(shapes, MODES, "cpu", ours_fn=counting)
    # One forward per (dtype, hdim, causal), on its first shape in run order, with autograd on for the backward.
    assert calls == [(64, False, True), (64, True, True)]
    assert [(e["dtype"], e["hdim"], e["causal"], e["seqlen"], e["batch"], e["nheads"]) for e in entries] == [
        ("fp32", 16, False, 64, 1, 2),
        ("fp32", 16, True, 64, 1, 2),
    ]
    for e in entries:
        assert e["fwd_s"] > 0 and e["bwd_s"] > 0 and e["note"] is None

    calls.clear()
    [entry] = measure_first_calls(shapes[:1], ["fwd"], "cpu", ours_fn=counting)
    assert calls == [(64, False, False)]  # forward-only runs time the no_grad forward, and no backward
    assert entry["fwd_s"] > 0 and entry["bwd_s"] is None


def test_measure_first_calls_records_failures() -> None:
    def broken(q, k, v, causal=False):
        raise RuntimeError("does not compile")

    [entry] = measure_first_calls([Shape(1, 32, 2, 16, False, "fp32")], MODES, "cpu", ours_fn=broken)
    assert (entry["fwd_s"], entry["bwd_s"]) == (None, None)
    assert entry["note"] == "RuntimeError: does not compile"


def test_fresh_triton_cache_restores_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    with fresh_triton_cache() as path:
        assert os.environ["TRITON_CACHE_DIR"] == path and os.path.isdir(path)
    assert "TRITON_CACHE_DIR" not in os.environ and not os.path.exists(path)


@pytest.mark.parametrize("script", ["bench_context_parallel", "bench_decode", "bench_features", "bench_fp8",
                                    "bench_overhead"])
def test_benchmark_scripts_help(script, capsys):
    """The benchmark scripts of benchmarks/ import (the package's public API, the kept bench helpers) and parse."""
    with pytest.raises(SystemExit) as exit_:
        _script(script).main(["--help"])
    assert exit_.value.code == 0
    assert f"python benchmarks/{script}.py" in capsys.readouterr().out


@pytest.mark.parametrize("script,stem", [
    ("report_bench", "2026-11-22_h200_bf16_back-to-back"),
    ("report_decode", "2026-11-22_h100_decode"),
    ("report_overhead", "2026-11-22_h200_overhead"),
])
def test_report_scripts_rewrite_the_committed_markdown(script, stem, tmp_path):
    """The report scripts of benchmarks/ turn a committed result JSON back into its committed markdown."""
    if script != "report_bench":
        pytest.importorskip("matplotlib")  # these scripts also draw the PNG
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    (tmp_path / f"{stem}.json").write_text((results / f"{stem}.json").read_text())
    assert _script(script).main([str(tmp_path / f"{stem}.json")]) == 0
    assert (tmp_path / f"{stem}.md").read_text() == (results / f"{stem}.md").read_text()
