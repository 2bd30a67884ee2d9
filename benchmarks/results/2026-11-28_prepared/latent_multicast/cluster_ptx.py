"""PTX rewrites that turn a triton 3.6 Gluon kernel compiled for ONE CTA (num_ctas=1) into a cluster-of-2 kernel
with TMA multicast of one descriptor's loads and mbarrier arrivals on the peer CTA (a prototype, compile-only).

- `.explicitcluster` / `.reqnctapercluster 2, 1, 1` after `.reqntid`: the cluster shape is in the cubin, so the
  driver launches clusters of 2 along x without a launch attribute (CUDA's compile-time __cluster_dims__);
- every `cp.async.bulk.tensor` reading the kernel's `desc_param`-th tensor descriptor becomes the
  `.multicast::cluster` form with ctaMask 0b11, issued only by the CTA that owns it (group=None: the kernel's own
  pred= decides; else box n of each group of `group` loads in program order is CTA (n % group) % 2's), so each box
  is read from L2 once and lands in both CTAs' shared memory at the same offset, completing bytes on the barrier
  at the same offset in both;
- the first `mbarrier.arrive.shared::cta` after each `// @peer_arrive` marker (peer_arrive_marker() in the kernel)
  goes to the peer CTA's barrier at the same offset instead (mapa + mbarrier.arrive.release.cluster).
"""

import contextlib
import re

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

PEER_MARK = "// @peer_arrive"
_MARK_ASM = gl.constexpr(PEER_MARK + "\nmov.u32 $0, 0;")
_TMA = re.compile(
    r"^(?P<ind>[ \t]*)@(?P<pred>%p\d+) cp\.async\.bulk\.tensor\.(?P<dim>\d)d\.shared::cluster\.global\."
    r"mbarrier::complete_tx::bytes \[(?P<dst>%r\d+)\], \[(?P<desc>%rd\d+), \{(?P<crd>[^}]*)\}\], "
    r"\[(?P<bar>%r\d+)\];[ \t]*$", re.MULTILINE)
_ARRIVE = re.compile(r"^(?P<ind>[ \t]*)@(?P<pred>%p\d+) mbarrier\.arrive\.shared::cta\.b64 _, \[(?P<bar>%r\d+)\];",
                     re.MULTILINE)


def descriptor_register(ptx: str, ordinal: int) -> str:
    """The register holding the generic address of the kernel's `ordinal`-th tensor descriptor (Triton passes
    one by value as `.param .align 64 .b8 NAME_param_i[128]`, a CUtensorMap, and takes its address by
    cvta.param; the TMA instructions name that register)."""
    name = re.search(r"\.entry (\w+)\(", ptx).group(1)
    index = re.findall(rf"\.param \.align 64 \.b8 {name}_param_(\d+)\[128\]", ptx)[ordinal]
    mov = re.search(rf"mov\.b64\s+(%rd\d+), {name}_param_{index};", ptx).group(1)
    return re.search(rf"cvta\.param\.u64\s+(%rd\d+), {re.escape(mov)};", ptx).group(1)


def add_cluster_dims(ptx: str, n: int = 2) -> str:
    ptx, count = re.subn(r"^(\.reqntid[^\n]*\n)", rf"\1.explicitcluster\n.reqnctapercluster {n}, 1, 1\n", ptx,
                         flags=re.MULTILINE)
    assert count == 1, "no .reqntid"
    return ptx


def multicast_loads(ptx: str, desc_reg: str, group: int | None) -> tuple[str, int]:
    """Loads through desc_reg to multicast. group: box n (program order) of each `group` issued by CTA
    (n % group) % 2 only; None: every load kept under its own predicate (the kernel's pred= picks the owner)."""
    seen = [0]

    def one(m):
        if m["desc"] != desc_reg:
            return m.group(0)
        owner = None if group is None else (seen[0] % group) % 2
        seen[0] += 1
        i = m["ind"]
        pick = (f"{i}mov.u32 %mc_r, %cluster_ctarank;\n{i}setp.eq.and.u32 %mc_p, %mc_r, {owner}, {m['pred']};\n"
                if owner is not None else f"{i}mov.pred %mc_p, {m['pred']};\n")
        return (f"{i}{{\n{i}.reg .b32 %mc_r;\n{i}.reg .pred %mc_p;\n{i}.reg .b16 %mc_m;\n"
                f"{pick}"
                f"{i}mov.b16 %mc_m, 3;\n"
                f"{i}@%mc_p cp.async.bulk.tensor.{m['dim']}d.shared::cluster.global.mbarrier::complete_tx::bytes"
                f".multicast::cluster [{m['dst']}], [{m['desc']}, {{{m['crd']}}}], [{m['bar']}], %mc_m;\n{i}}}")

    return _TMA.sub(one, ptx), seen[0]


def peer_arrivals(ptx: str) -> tuple[str, int]:
    """The first local arrive after each marker to the peer CTA's barrier at the same shared-memory offset."""
    out, pos, n = [], 0, 0
    while (mark := ptx.find(PEER_MARK, pos)) >= 0:
        m = _ARRIVE.search(ptx, mark)
        assert m is not None, "a peer_arrive marker without an arrive after it"
        i = m["ind"]
        out.append(ptx[pos:m.start()])
        out.append(f"{i}{{\n{i}.reg .b32 %pa_r, %pa_a;\n{i}mov.u32 %pa_r, %cluster_ctarank;\n"
                   f"{i}xor.b32 %pa_r, %pa_r, 1;\n{i}mapa.shared::cluster.u32 %pa_a, {m['bar']}, %pa_r;\n"
                   f"{i}@{m['pred']} mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%pa_a];\n{i}}}")
        pos, n = m.end(), n + 1
    out.append(ptx[pos:])
    return "".join(out), n


def clusterize(ptx: str, desc_param: int, group: int | None, log: dict | None = None) -> str:
    ptx = add_cluster_dims(ptx)
    ptx, loads = multicast_loads(ptx, descriptor_register(ptx, desc_param), group)
    ptx, arrivals = peer_arrivals(ptx)
    if log is not None:
        log.update(multicast_loads=loads, peer_arrivals=arrivals)
    return ptx


@contextlib.contextmanager
def cluster_hook(desc_param: int, group: int | None, log: dict, extra=None):
    """While compiling: the PTX stage's output through `extra` (e.g. common.strip_maxnreg) then clusterize
    (desc_param: which tensor descriptor argument, 0 the first). Triton 3.6 leaves the hook out of its cache
    key: compile with TRITON_ALWAYS_COMPILE=1 or a constexpr that differs from the unhooked kernel's."""
    runtime = triton.knobs.runtime
    previous = runtime.add_stages_inspection_hook

    def hook(*args):
        stages = args[1]
        make_ptx = stages["ptx"]

        def ptx_stage(src, metadata):
            ptx = make_ptx(src, metadata)
            log["before"] = ptx
            ptx = clusterize(extra(ptx) if extra else ptx, desc_param, group, log)
            log["after"] = ptx
            return ptx

        stages["ptx"] = ptx_stage

    runtime.add_stages_inspection_hook = hook
    try:
        yield
    finally:
        runtime.add_stages_inspection_hook = previous


# Gluon side: what inline asm can do by itself (none of it needs a shared_memory_descriptor's address)


@gluon.jit
def cluster_rank():
    """%cluster_ctarank (0 or 1 in a cluster of 2), an int32 scalar."""
    return gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32, is_pure=True,
                                     pack=1)


@gluon.jit
def cluster_sync():
    """The barrier inits visible cluster-wide, then a cluster barrier. Every thread of both CTAs must come here:
    not usable around gl.warp_specialize, whose worker warps never run the code before or after it."""
    gl.inline_asm_elementwise("fence.mbarrier_init.release.cluster;\n"
                              "barrier.cluster.arrive.release.aligned;\n"
                              "barrier.cluster.wait.acquire.aligned;\n"
                              "mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def peer_arrive_marker():
    """Marks the next mbarrier.arrive for peer_arrivals (it goes to the peer CTA's barrier)."""
    gl.inline_asm_elementwise(_MARK_ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def peer_address(rank):
    """mapa by inline asm: the cluster-window address of the peer's shared memory at this CTA's global_smem
    (an inline asm can name the module's global_smem, but not a Gluon shared_memory_descriptor)."""
    return gl.inline_asm_elementwise("{ .reg .b32 l; mov.u32 l, global_smem; mapa.shared::cluster.u32 $0, l, $1; }",
                                     "=r,r", [rank ^ 1], dtype=gl.int32, is_pure=True, pack=1)
