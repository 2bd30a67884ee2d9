"""A GPT-style decoder (pre-norm, learned positions, GELU MLP) whose attention backend is a constructor argument."""

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# sdpa-flashattn2: SDPA's FLASH_ATTENTION backend with flashattn2 activated as its kernels (flashattn2.sdpa_backend,
# torch >= 2.10; train.py activates it around the run)
BACKENDS = ("flashattn2", "sdpa-flash", "sdpa-cudnn", "sdpa-math", "sdpa-flashattn2")
_SDPA = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
         "sdpa-math": SDPBackend.MATH, "sdpa-flashattn2": SDPBackend.FLASH_ATTENTION}


@dataclass
class GPTConfig:
    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int = 32768
    max_seqlen: int = 2048

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


CONFIGS = {
    # the FlashAttention-2 paper's GPT3-1.3B shape: 24 layers, hidden 2048, 16 heads of 128
    "gpt-1.3b": dict(n_layer=24, n_head=16, d_model=2048),
    "gpt-125m": dict(n_layer=12, n_head=12, d_model=768),
    "tiny": dict(n_layer=2, n_head=2, d_model=64, vocab_size=256),
}


def causal_attention(q, k, v, backend: str):
    """q, k, v: (batch, seqlen, heads, head_dim) -> same layout."""
    if backend == "flashattn2":
        from flashattn2 import flash_attn_func

        return flash_attn_func(q, k, v, causal=True)
    with sdpa_kernel(_SDPA[backend]) if backend in _SDPA else nullcontext():
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, backend: str):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.fc_out = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        batch, seqlen, _ = x.shape
        # (batch, seqlen, 3, heads, head_dim): q, k, v are strided views, no copies
        qkv = self.qkv(self.ln1(x)).view(batch, seqlen, 3, self.cfg.n_head, self.cfg.head_dim)
        att = causal_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], self.backend)
        x = x + self.proj(att.reshape(batch, seqlen, -1))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, backend: str):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_seqlen, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, backend) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(("proj.weight", "fc_out.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, ids, targets=None):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def flops_per_token(self, seqlen: int) -> float:
        """Training FLOPs per token as the FlashAttention-2 paper counts them (Megatron-LM's formula):
        6 x parameters for the matmuls with weights, plus 12 x layers x hidden x seqlen for attention (forward
        and backward, the causal half not discounted)."""
        n_params = sum(p.numel() for p in self.parameters()) - self.pos.weight.numel()
        return 6 * n_params + 12 * self.cfg.n_layer * self.cfg.d_model * seqlen
