"""A/B of the MLA (192/128) Gluon backward's tunings inside the whole backward, beside cuDNN, interleaved per shape.

    PYTHONPATH=src python scripts/ab_mla_bwd.py --out DIR [--try NAME:KEY=V,KEY=V ...] [--seqlens 2048 ...]
        [--packed DOCS]

bf16, causal, 16 heads, 16k tokens a batch; cuDNN and FlexAttention (torch.compile'd, causal block mask) time the
same backward in the same rounds. "base" is the package's tuning at each length (tuning_for: CONFIGS_MLA with
CONFIGS_MLA_SHORT_CAUSAL's keys where they apply); each --try variant changes keys of it
(host keys such as L2_SECTIONS too). Every variant's gradients are checked against the base's first; rounds run in
alternating order and each variant's median and best ms are kept, with the section the plan launched with.
--packed DOCS: each length's tokens as DOCS equal documents of one packed (varlen) call, whose items keep one program
each; no peer there (cuDNN's SDPA takes no packed batch, FlexAttention is left out).
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
import triton
from result_rows import write_rows
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import flashattn2
from flashattn2.kernels import backends
from flashattn2.kernels.params import AttnOptions
from flashattn2.kernels.portable import forward
from flashattn2.kernels.sm90 import backward as bwd_sm90

KEY = (192, 128)
FLEX = torch.compile(flex_attention)
torch._functorch.config.donated_buffer = False  # the timing loop calls backward with retain_graph=True


def measure(seqlen: int, variants: dict, rounds: int, flex: bool = True, packed: int = 0) -> dict:
    batch, nheads = 16384 // seqlen, 16
    torch.manual_seed(seqlen)
    q, k = (torch.randn(batch, seqlen, nheads, 192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v, dout = (torch.randn(batch, seqlen, nheads, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    opts = AttnOptions(softmax_scale=192 ** -0.5, window_left=-1, window_right=0)
    if packed:  # the same tokens as `packed` documents of seqlen // packed in one varlen call
        q, k, v, dout = (x.reshape(batch * seqlen, nheads, x.shape[-1]) for x in (q, k, v, dout))
        doc = seqlen // packed
        cu = torch.arange(0, batch * seqlen + 1, doc, device="cuda", dtype=torch.int32)
        opts = AttnOptions(softmax_scale=192 ** -0.5, window_left=-1, window_right=0, cu_seqlens_q=cu,
                           cu_seqlens_k=cu, max_seqlen_q=doc, max_seqlen_k=doc)
    out, lse, _ = forward.attention_forward(q, k, v, opts)
    flops = 2.5 * 2 * batch * nheads * seqlen * seqlen * (192 + 128) / 2 / max(packed, 1)
    base = bwd_sm90.tuning_for(KEY[0], opts, KEY[1], seqlen)
    variants = {name: dict(base, **changes) for name, changes in variants.items()}
    row = dict(seqlen=seqlen, batch=batch, packed=packed, errors={}, section={}, ms={}, variants=variants)
    saved, saved_short = dict(bwd_sm90.CONFIGS_MLA), dict(bwd_sm90.CONFIGS_MLA_SHORT_CAUSAL)
    fns, ref = {}, None
    try:
        bwd_sm90.CONFIGS_MLA_SHORT_CAUSAL.clear()  # each variant runs as written
        for name, tuning in variants.items():
            bwd_sm90.CONFIGS_MLA[KEY] = tuning
            flashattn2.set_backend("gluon")  # drops the plans made with the last tuning
            try:
                plan = backends.backward_plan(dout, q, k, v, out, lse, opts)
                assert plan.gluon is not None
                grads = [g.clone() for g in plan(dout, q, k, v, out, lse, opts)]
            except Exception as exc:  # a variant that does not compile or launch is recorded, not fatal
                row["errors"][name] = str(exc).splitlines()[0][:300] if str(exc) else repr(exc)
                print(f"FAILED {name} s{seqlen}: {row['errors'][name]}", flush=True)
                continue
            ref = ref or grads
            row["errors"][name] = [(g.float() - r.float()).abs().max().item() for g, r in zip(grads, ref, strict=True)]
            row["section"][name] = plan.gluon.launch.named.get("section")
            if not all(e < 5e-2 for e in row["errors"][name]):  # NaN fails too
                print(f"WRONG {name} s{seqlen}: {row['errors'][name]}", flush=True)
                continue
            fns[name] = (lambda p: lambda: p(dout, q, k, v, out, lse, opts))(plan)
    finally:
        bwd_sm90.CONFIGS_MLA.clear()
        bwd_sm90.CONFIGS_MLA.update(saved)
        bwd_sm90.CONFIGS_MLA_SHORT_CAUSAL.update(saved_short)
        flashattn2.set_backend("auto")
    if packed:
        return _timed(row, fns, rounds, flops)
    qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    dot = dout.transpose(1, 2).contiguous()
    fns["cudnn"] = lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)
    try:  # FlexAttention's backward is a peer users have today; a failure to compile is recorded, not fatal
        if not flex:
            raise RuntimeError("left out (--no-flex)")
        block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seqlen, seqlen, device="cuda")
        of = FLEX(qt, kt, vt, block_mask=block_mask, scale=192 ** -0.5)
        fns["flex"] = lambda: torch.autograd.grad(of, (qt, kt, vt), dot, retain_graph=True)
        fns["flex"]()
    except Exception as exc:
        fns.pop("flex", None)
        row["errors"]["flex"] = str(exc).splitlines()[0][:300] if str(exc) else repr(exc)
        print(f"FAILED flex s{seqlen}: {row['errors']['flex']}", flush=True)
    return _timed(row, fns, rounds, flops)


def _timed(row: dict, fns: dict, rounds: int, flops: float) -> dict:
    """Each function's ms over `rounds` alternating rounds into `row`."""
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in (reversed if r % 2 else iter)(list(fns.items())):
            times[name].append(triton.testing.do_bench(fn, warmup=25, rep=100))
    for name, ts in times.items():
        row["ms"][name] = dict(median=statistics.median(ts), best=min(ts), all=ts)
    row["tflops_median"] = {n: round(flops / t["median"] / 1e9, 1) for n, t in row["ms"].items()}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--try", dest="tries", nargs="*", default=[], help="NAME:KEY=VALUE,... variants")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-flex", action="store_true", help="leave FlexAttention out (its compile takes a minute)")
    ap.add_argument("--packed", type=int, default=0, help="each length as this many packed documents (no peers)")
    args = ap.parse_args()
    variants = {"base": {}}  # changes over the package's tuning at each length
    for spec in args.tries:
        name, changes = spec.split(":")
        variants[name] = {k: int(v) for k, v in (c.split("=") for c in changes.split(","))}
    rows = []
    for seqlen in args.seqlens:
        rows.append(measure(seqlen, variants, args.rounds, flex=not args.no_flex, packed=args.packed))
        r = rows[-1]
        med = {n: t["median"] for n, t in r["ms"].items()}
        print(f"s{seqlen}: " + "  ".join(f"{n} {t:.3f} ms (sec {r['section'].get(n)})" for n, t in med.items())
              + "  | time over base: " + " ".join(f"{n} {t / med['base']:.3f}" for n, t in med.items()), flush=True)
    write_rows(f"{args.out}/ab_mla_bwd.json", rows, variants=variants)


if __name__ == "__main__":
    main()
