"""The demo dataset: a seeded synthetic English-like corpus, generated locally (no download).

Sentences come from a small probabilistic grammar, so a byte-level language model has real
structure to learn (spelling, word order, agreement of numbers and plurals) and its loss falls.
"""

from __future__ import annotations

import random

from sailor_tasks import storage
from sailor_tasks.data.copier import seal
from sailor_tasks.model import DatasetManifest

DEMO_DATASET = "sailor://source/datasets/demo-text"

_ADJ = "red quick lazy bright quiet old young small large happy curious silent brave".split()
_NOUN = "fox dog cat bird river mountain engineer planner region cluster model robot".split()
_VERB = "jumps over|runs past|watches|follows|trains beside|waits for|talks to|moves toward".split("|")
_PLACE = "in the valley|near the sea|at the station|under the bridge|across the field|in the cloud".split("|")
_NUM = "two three four five six seven eight nine".split()


def _sentence(rng: random.Random) -> str:
    subj = f"the {rng.choice(_ADJ)} {rng.choice(_NOUN)}"
    if rng.random() < 0.3:
        obj = f"{rng.choice(_NUM)} {rng.choice(_ADJ)} {rng.choice(_NOUN)}s"
    else:
        obj = f"the {rng.choice(_NOUN)}"
    tail = f" {rng.choice(_PLACE)}" if rng.random() < 0.5 else ""
    return f"{subj} {rng.choice(_VERB)} {obj}{tail}."


def generate_text(num_bytes: int, seed: int) -> bytes:
    rng = random.Random(seed)
    parts, size = [], 0
    while size < num_bytes:
        s = _sentence(rng).capitalize() + ("\n" if rng.random() < 0.2 else " ")
        parts.append(s)
        size += len(s)
    return "".join(parts).encode()[:num_bytes]


def write_demo_dataset(
    root: str, num_shards: int = 4, shard_bytes: int = 1 << 20, seed: int = 0
) -> DatasetManifest:
    """Write ``num_shards`` text shards under the concrete URI ``root`` and seal them with a manifest."""
    for i in range(num_shards):
        storage.write_bytes(
            storage.join(root, f"shard-{i:05d}.txt"), generate_text(shard_bytes, seed * 1000 + i)
        )
    return seal(root)
