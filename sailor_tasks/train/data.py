"""Deterministic batches from a placed byte corpus.

Batches are a pure function of (seed, step, rank): resuming at step N reproduces the exact data
order of an uninterrupted run with no loader state beyond the step counter.
"""

from __future__ import annotations

import hashlib
import logging
import math

import torch

from sailor_tasks import storage
from sailor_tasks.data.manifest import read_manifest
from sailor_tasks.errors import DataIntegrityError

logger = logging.getLogger(__name__)

EVAL_FRACTION = 0.05
"""Tail of the corpus held out for the before/after loss."""


class ByteCorpus:
    def __init__(self, tokens: torch.Tensor, seq_len: int, seed: int):
        split = int(tokens.numel() * (1 - EVAL_FRACTION))
        # Each split needs one window of seq_len + 1 bytes and a start to draw (``_sample``).
        if tokens.numel() < 4 * (seq_len + 1) or min(split, tokens.numel() - split) < seq_len + 2:
            need = math.ceil((seq_len + 2) / EVAL_FRACTION)
            raise ValueError(
                f"corpus of {tokens.numel()} bytes is too small for seq_len={seq_len} "
                f"(its {EVAL_FRACTION:.0%} eval split needs {seq_len + 2} bytes: about {need} bytes in all)"
            )
        self.train_tokens, self.eval_tokens = tokens[:split], tokens[split:]
        self.seq_len, self.seed = seq_len, seed

    @classmethod
    def load(cls, data_uri: str, seq_len: int, seed: int) -> ByteCorpus:
        """Read every file listed in the dataset's manifest (a placed copy must be complete), each
        checked against the manifest's sha256 and size.

        Raises:
            FileNotFoundError: the replica has no manifest (a copy in progress or interrupted).
            DataIntegrityError: a file differs from its manifest entry (torn or corrupt replica).
        """
        manifest = read_manifest(data_uri)
        if manifest is None:
            raise FileNotFoundError(f"{data_uri} has no SAILOR manifest: the dataset copy is incomplete")
        parts = []
        for entry in manifest.files:
            uri = storage.join(data_uri, entry.path)
            data = storage.read_bytes(uri)
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry.sha256 or len(data) != entry.size:
                raise DataIntegrityError(uri, f"{entry.sha256} ({entry.size} B)", f"{digest} ({len(data)} B)")
            parts.append(data)
        blob = b"".join(parts)
        if not blob:
            raise ValueError(f"{data_uri} holds no bytes ({len(manifest.files)} files, all empty)")
        logger.info("loaded %d files, %.1f MB from %s", len(manifest.files), len(blob) / 1e6, data_uri)
        return cls(torch.frombuffer(bytearray(blob), dtype=torch.uint8).long(), seq_len, seed)

    def _sample(self, tokens: torch.Tensor, gen_seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(gen_seed)
        starts = torch.randint(0, tokens.numel() - self.seq_len - 1, (n,), generator=g)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
        window = tokens[idx]
        return window[:, :-1], window[:, 1:]

    def train_batch(self, step: int, rank: int, world_size: int, batch_size: int):
        """The rank's slice of the global batch of ``step`` (same for every restart)."""
        x, y = self._sample(self.train_tokens, self.seed * 1_000_003 + step, batch_size * world_size)
        sl = slice(rank * batch_size, (rank + 1) * batch_size)
        return x[sl], y[sl]

    def eval_batches(self, n: int, batch_size: int):
        return [self._sample(self.eval_tokens, 7_919 * (i + 1) + self.seed, batch_size) for i in range(n)]
