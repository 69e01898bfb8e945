"""Built-in model specs. Torch-free, so DAG files can list the model names for the Param enum."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer language model over bytes (vocabulary 256)."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    dropout: float = 0.1
    vocab_size: int = 256
    description: str = ""

    @property
    def approx_params(self) -> int:
        # 12·d² per block (attention 4d², MLP 8d²) plus token and position embeddings.
        return self.n_layers * 12 * self.d_model**2 + (self.vocab_size + self.seq_len) * self.d_model


MODEL_SPECS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(
            "tiny_gpt",
            d_model=64,
            n_layers=2,
            n_heads=4,
            seq_len=64,
            description="~0.1M params; trains in seconds on a CPU (demo, tests)",
        ),
        ModelSpec(
            "small_gpt",
            d_model=128,
            n_layers=4,
            n_heads=4,
            seq_len=128,
            description="~0.8M params; a few minutes on a CPU",
        ),
        ModelSpec(
            "gpt_25m",
            d_model=512,
            n_layers=8,
            n_heads=8,
            seq_len=256,
            description="~25M params (100 MB of fp32 weights); GPU-sized",
        ),
    )
}
MODEL_NAMES: tuple[str, ...] = tuple(MODEL_SPECS)
