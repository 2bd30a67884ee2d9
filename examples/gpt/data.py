"""Token streams: a synthetic one with learnable structure (no network needed), or a tokenised corpus on disk."""

import numpy as np
import torch


class SyntheticStream:
    """Sequences from a sparse random Markov chain over the first `active` token ids: each has `branching`
    equally likely successors, so the loss falls from log(vocab) to about log(active) within a few steps (which
    ids occur), then towards log(branching) as the model learns the transitions."""

    def __init__(self, vocab_size: int, seed: int = 0, branching: int = 4, active: int = 2048):
        g = torch.Generator().manual_seed(seed)
        self.active = min(active, vocab_size)
        self.successors = torch.randint(0, self.active, (self.active, branching), generator=g)
        self.g = torch.Generator().manual_seed(seed + 1)

    def batch(self, batch: int, seqlen: int) -> torch.Tensor:
        out = torch.empty(batch, seqlen + 1, dtype=torch.long)
        out[:, 0] = torch.randint(0, self.active, (batch,), generator=self.g)
        choice = torch.randint(0, self.successors.shape[1], (batch, seqlen), generator=self.g)
        for t in range(seqlen):
            out[:, t + 1] = self.successors[out[:, t], choice[:, t]]
        return out


class MemmapStream:
    """Random windows of a flat array of token ids (a numpy memmap, e.g. uint16 written by a tokeniser)."""

    def __init__(self, path: str, vocab_size: int, dtype: str = "uint16", seed: int = 0):
        self.data = np.memmap(path, dtype=dtype, mode="r")
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)

    def batch(self, batch: int, seqlen: int) -> torch.Tensor:
        starts = self.rng.integers(0, len(self.data) - seqlen - 1, batch)
        rows = np.stack([self.data[s:s + seqlen + 1] for s in starts]).astype(np.int64)
        if rows.max() >= self.vocab_size:
            raise ValueError(f"token id {rows.max()} in {self.data.filename} is past vocab_size {self.vocab_size}")
        return torch.from_numpy(rows)
