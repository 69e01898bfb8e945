"""Typed configuration of one training process group (what ``python -m sailor_tasks.train`` runs)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from sailor_tasks import paths
from sailor_tasks.train.specs import MODEL_NAMES


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainConfig:
    run_id: str
    """SAILOR run id (the Airflow dag_run's run_id); names the run's folder in the region bucket."""
    model: str
    """Built-in model name (see ``specs.MODEL_SPECS``)."""
    data_uri: str
    """Concrete URI of the placed dataset folder (holds a SAILOR manifest)."""
    output_uri: str
    """Concrete URI of the run's folder: checkpoints/, result.json, metrics.jsonl."""
    total_steps: int
    """Optimizer steps of the whole run (across restarts)."""
    checkpoint_every_steps: int
    """Save a checkpoint every N steps (and always at the last step and on a preemption notice)."""
    seed: int = 0
    """Seed of parameter init, data order and dropout; fixed seed → bit-identical results on CPU."""
    batch_size: int = 16
    """Sequences per worker per step (global batch = batch_size × world size)."""
    learning_rate: float = 3e-3
    """Peak AdamW learning rate (linear warmup, then cosine decay to 10%)."""
    warmup_steps: int = 10
    """Linear LR warmup steps."""
    keep_latest_k: int = 2
    """Committed checkpoints to keep; at least 2 so a corrupt newest one has a fallback."""
    num_eval_batches: int = 4
    """Held-out batches for the loss reported before and after training."""
    log_every_steps: int = 10
    """Progress line every N steps (step, loss, samples/s, ETA)."""
    async_checkpoint: bool = False
    """Write periodic checkpoints in the background: the copy of the state into reused CPU buffers
    overlaps the next step's forward/backward, and only that step's optimizer step waits for it
    (CheckFreq). Saves on a preemption notice and at the end stay synchronous."""
    attempt: int = 1
    """Attempt of the run this config is for (``SAILOR_ATTEMPT``; 1 = first launch)."""
    command: Sequence[str] = ()
    """The run's own command (argv) run under torchrun instead of the built-in trainer; empty: built-in."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment of every worker (validated by the request)."""

    def __post_init__(self) -> None:
        if self.model not in MODEL_NAMES:
            raise ValueError(f"model={self.model!r} is not built in; valid: {', '.join(MODEL_NAMES)}")
        if self.total_steps < 1:
            raise ValueError(f"total_steps={self.total_steps} must be >= 1")
        if self.checkpoint_every_steps < 1:
            raise ValueError(f"checkpoint_every_steps={self.checkpoint_every_steps} must be >= 1")
        if self.keep_latest_k < 2:
            raise ValueError(
                f"keep_latest_k={self.keep_latest_k} must be >= 2 (fallback for a corrupt newest checkpoint)"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        if self.num_eval_batches < 1:
            raise ValueError(f"num_eval_batches={self.num_eval_batches} must be >= 1")
        if self.log_every_steps < 1:
            raise ValueError(f"log_every_steps={self.log_every_steps} must be >= 1")

    @property
    def checkpoint_uri(self) -> str:
        return paths.checkpoint_uri(self.output_uri)

    @property
    def result_uri(self) -> str:
        return paths.result_uri(self.output_uri)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        return cls(**json.loads(text))
