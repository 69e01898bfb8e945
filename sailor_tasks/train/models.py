"""Torch modules for the built-in specs: a small causal transformer language model over bytes."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from sailor_tasks.train.specs import ModelSpec


class Block(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads = spec.n_heads
        self.ln1 = nn.LayerNorm(spec.d_model)
        self.qkv = nn.Linear(spec.d_model, 3 * spec.d_model)
        self.proj = nn.Linear(spec.d_model, spec.d_model)
        self.ln2 = nn.LayerNorm(spec.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(spec.d_model, 4 * spec.d_model),
            nn.GELU(),
            nn.Linear(4 * spec.d_model, spec.d_model),
        )
        self.dropout = nn.Dropout(spec.dropout)
        self.attn_dropout = spec.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.attn_dropout if self.training else 0.0
        )
        x = x + self.dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.dropout(self.mlp(self.ln2(x)))


class ByteGPT(nn.Module):
    """Decoder-only transformer: token + position embeddings, N blocks, tied output head."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok = nn.Embedding(spec.vocab_size, spec.d_model)
        self.pos = nn.Embedding(spec.seq_len, spec.d_model)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.n_layers))
        self.ln = nn.LayerNorm(spec.d_model)
        self.drop = nn.Dropout(spec.dropout)
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.ln(x) @ self.tok.weight.T
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def _init_weights(module: nn.Module) -> None:
    # GPT-2 initialisation: small normal weights keep the tied output head's logits near zero,
    # so the first loss is close to ln(vocab_size).
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build_model(spec: ModelSpec) -> ByteGPT:
    return ByteGPT(spec)
