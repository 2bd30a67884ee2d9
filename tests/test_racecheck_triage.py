"""scripts/racecheck_triage.py on a made-up racecheck log: the dispatch state word, a barrier invalidated over it
after the region, an mbarrier-ordered pair and an unexplained report each land in their own group, and only the last
fails the run."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import racecheck_triage  # noqa: E402


def _report(kind, w_thread, w_line, r_thread, r_line):
    """One racecheck report as compute-sanitizer prints it (the triage reads kind, threads and lines)."""
    return (f"========= Error: Potential {kind} hazard detected at __shared__ 0x100 in block (0,0,0) :\n"
            f"=========     Write Thread ({w_thread},0,0) at k_kernel+0x10 in k.py:{w_line}\n"
            f"=========     Read Thread ({r_thread},0,0) at k_kernel+0x20 in k.py:{r_line}\n")


LOG = ("========= COMPUTE-SANITIZER\n" + _report("RAW", 31, 3, 576, 3) + _report("RAW", 35, 5, 416, 6)
       + _report("WAR", 40, 6, 130, 5) + _report("RAW", 0, 7, 256, 3) + _report("RAW", 0, 5, 256, 3)
       + "========= RACECHECK SUMMARY: 5 hazards displayed (5 errors, 0 warnings)\n")
SOURCE = ("import x\n\ndef k_kernel(a):\n    pass\n    store\n    load\n    for i in range(2):\n"
          "        mbarrier.invalidate(bar.index(i))\n")


def _run(tmp_path, capsys, *extra, log=LOG, source=SOURCE):
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "k.py").write_text(source)
    (tmp_path / "race.log").write_text(log)
    rc = racecheck_triage.main([str(tmp_path / "race.log"), "--src", str(tmp_path / "src"), *extra])
    return rc, capsys.readouterr().out


def test_triage_groups_and_fails_on_unexplained_reports(tmp_path, capsys):
    rc, out = _run(tmp_path, capsys, "--ordered", "k.py:5,k.py:6")
    assert rc == 1
    assert "ws-state     RAW write k.py:3" in out
    assert "ordered      RAW write k.py:5" in out
    assert "unexplained  WAR write k.py:6" in out
    assert "ws-exit      RAW write k.py:7" in out
    assert "unexplained  RAW write k.py:5" in out  # a plain store over the state is not explained
    assert "5 reports parsed, 5 errors" in out


def test_triage_names_an_invalidate_under_a_constexpr_branch_ws_exit(tmp_path, capsys):
    # the Gluon FP8 forward's last invalidate sits under `if IS_FP8 and V_TRANSPOSE:`, the line racecheck names
    source = SOURCE + "    if FLAG:\n        mbarrier.invalidate(extra.index(0))\n    if FLAG:\n        pass\n"
    log = _report("RAW", 31, 9, 128, 3) + _report("RAW", 31, 11, 128, 3)
    rc, out = _run(tmp_path, capsys, log=log, source=source)
    assert rc == 1
    assert "ws-exit      RAW write k.py:9" in out
    assert "unexplained  RAW write k.py:11" in out  # an `if` over no invalidate is not explained


def test_triage_passes_when_every_report_is_explained(tmp_path, capsys):
    rc, out = _run(tmp_path, capsys, "--ordered", "k.py:5,k.py:6", "--ordered", "k.py:6,k.py:5",
                   "--ordered", "k.py:5,k.py:3")
    assert rc == 0 and "unexplained" not in out


HANDOFF_SOURCE = """def k_kernel(a):
    pass
    mbarrier.wait(sm.free, 0)
    sm.alpha.store(x)
    fence_async_shared()
    mbarrier.arrive(sm.ready, count=1)
    sm.beta.store(x)
    mbarrier.wait(sm.ready, 0)
    y = sm.alpha.load(layout)
    z = sm.beta.load(layout)
    mbarrier.arrive(sm.free, count=1)
"""


def _triage(tmp_path, capsys, log):
    return _run(tmp_path, capsys, log=log, source=HANDOFF_SOURCE)


def test_triage_handoff_needs_one_mbarrier_between_two_warpgroups(tmp_path, capsys):
    # alpha: stored, `ready` arrived; `ready` waited, loaded (RAW); loaded, `free` arrived; `free` waited, stored (WAR)
    rc, out = _triage(tmp_path, capsys, _report("RAW", 5, 4, 130, 9) + _report("WAR", 5, 4, 130, 9))
    assert rc == 0 and "handoff      RAW write k.py:4" in out and "handoff      WAR write k.py:4" in out
    # beta is stored after the arrive: nothing orders its load
    rc, out = _triage(tmp_path, capsys, _report("RAW", 5, 7, 130, 10))
    assert rc == 1 and "unexplained  RAW write k.py:7" in out
    # one warpgroup on both sides: a barrier of its own would order it, not the mbarrier
    rc, out = _triage(tmp_path, capsys, _report("RAW", 5, 4, 6, 9))
    assert rc == 1 and "unexplained" in out


def test_triage_handoff_holds_on_the_latent_kernels_buffers():
    src = racecheck_triage.SRC
    text = (src / "flashattn2" / "kernels" / "sm90" / "latent.py").read_text().splitlines()

    def line(code):
        (n,) = [i + 1 for i, t in enumerate(text) if t.strip().startswith(code)]
        return f"latent.py:{n}"

    alpha_w, alpha_r = line("sm.alpha.store("), line("alpha = sm.alpha.load(")
    stats_w, stats_r = line("sm.stats.store("), line("l_i = sm.stats.load(")
    assert racecheck_triage.is_handoff("RAW", alpha_w, alpha_r, src)
    assert racecheck_triage.is_handoff("WAR", alpha_w, alpha_r, src)
    assert racecheck_triage.is_handoff("RAW", stats_w, stats_r, src)
    assert not racecheck_triage.is_handoff("RAW", alpha_w, stats_r, src)  # two buffers
