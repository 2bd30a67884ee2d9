"""Compile one variant of mla_bwd_64row_2stage.py for sm_90 (triton 3.6 under /tmp/t36) and count its spills:
python analyze_2stage.py NAME KEY=V ... (outputs under /tmp/mla2/NAME; the summary is printed)."""

import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mla_bwd_64row_2stage as M  # noqa: E402

BIN = "/tmp/t36/triton/backends/nvidia/bin/"
STEP_FUNCTIONS = ("_step", "_dq32_block", "_probs", "_ds", "_score_tail", "mask.py")


def run(*cmd):
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    return r.stdout + r.stderr


def func_of(src_lines, line):
    """The `def` a source line sits in."""
    for i in range(line - 1, -1, -1):
        m = re.match(r"^def (\w+)", src_lines[i])
        if m:
            return m.group(1)
    return "?"


def main():
    name = sys.argv[1]
    flags = {k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])}
    out = f"/tmp/mla2/{name}"
    os.makedirs(out, exist_ok=True)
    k = M.compile_for_sm90(**flags)
    with open(f"{out}/k.ptx", "w") as f:
        f.write(k.asm["ptx"])
    with open(f"{out}/k.cubin", "wb") as f:
        f.write(k.asm["cubin"])
    log = run(BIN + "ptxas", "-arch=sm_90a", "-v", f"{out}/k.ptx", "-o", f"{out}/re.cubin")
    sass = run(BIN + "cuobjdump", "-sass", f"{out}/k.cubin")
    dis = run(BIN + "nvdisasm", "-g", "-c", f"{out}/k.cubin")  # with line info: spills by function
    src_lines = open(M.__file__).read().split("\n")
    cur, st, ld = None, {}, {}
    for ln in dis.split("\n"):
        m = re.search(r'//## File "([^"]+)", line (\d+)', ln)
        if m:
            f, line = m.group(1), int(m.group(2))
            if "mla_bwd_64row_2stage" in f:
                cur = func_of(src_lines, line)
            elif "scores" in f:
                cur = "_score_tail"
            else:
                cur = os.path.basename(f)
            continue
        if re.search(r"\bSTL", ln):
            st[cur] = st.get(cur, 0) + 1
        if re.search(r"\bLDL", ln):
            ld[cur] = ld.get(cur, 0) + 1
    regs = [int(x) for x in re.findall(r"\bR(\d+)\b", sass)]
    res = dict(name=name, flags=flags, shared=k.metadata.shared, maxR=max(regs) if regs else None,
               stack=re.findall(r"(\d+) bytes stack frame", log),
               spill_bytes=re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log),
               c75=sorted(set(re.findall(r"C75\d\d", log))), STL=sass.count("STL"), LDL=sass.count("LDL"),
               step_STL=sum(v for kk, v in st.items() if kk in STEP_FUNCTIONS),
               step_LDL=sum(v for kk, v in ld.items() if kk in STEP_FUNCTIONS),
               HGMMA=len(re.findall(r"HGMMA", sass)), DEPBAR=len(re.findall(r"WARPGROUP.DEPBAR", sass)),
               stl_by=st, ldl_by=ld)
    with open(f"{out}/summary.json", "w") as f:
        json.dump(res, f, indent=1)
    with open(f"{out}/ptxas.log", "w") as f:
        f.write(log)
    print(json.dumps({k_: v for k_, v in res.items() if k_ not in ("stl_by", "ldl_by")}))
    print("STL by", st, "LDL by", ld)


if __name__ == "__main__":
    main()
