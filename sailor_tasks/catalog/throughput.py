"""Throughput matrix T[job][gpu_type] (training steps/s), shared by placement, policies and simulator.

Sources, in order of authority:

1. Gavel's measurements (``simulation_throughputs.json``, MIT, Narayanan et al., OSDI'20) for K80,
   P100 and V100: each job key ``"('<model> (batch size B)', scale_factor)"`` maps to ``null`` (the
   job alone on the GPU type) and to ``[self, other]`` pairs when two jobs share one GPU. The
   ``*_unconsolidated`` GPU entries are the same jobs with workers spread over servers.
2. For GPU types Gavel did not measure, a published speed relative to V100 (``RELATIVE_TO_V100``),
   applied to the job's V100 throughput.
3. Measured throughput recorded by SAILOR's own runs (``with_measurement``), learned in (``with_measured``: the median of the runs and the table; feedback).

GPU type names follow the catalog (``V100``, ``A100``, ...); Gavel's lowercase names are mapped.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources

JobKey = tuple[str, int]
"""(job type, scale factor), e.g. ("ResNet-50 (batch size 64)", 1)."""
GpuThroughput = dict[str, float]
"""GPU type → steps/s."""

GAVEL_GPUS = {"k80": "K80", "p100": "P100", "v100": "V100"}
PACKAGED_FILE = "gavel_throughputs_alone.json"

# Training speed relative to V100 for GPU types Gavel did not measure. Approximate, mixed-precision
# convnet/transformer training; sources: NVIDIA datasheets (dense FP16/BF16 tensor TFLOPS: V100 125,
# T4 65, L4 121, A100 312, H100 SXM 989, H200 989 with 1.4x memory bandwidth, B200 2250) tempered by
# Lambda Labs' published PyTorch training benchmarks (A100 ≈ 2.2x V100, H100 ≈ 2x A100), 2023-2025.
# TODO(sailor): replace each with SAILOR's own measured throughput as runs accumulate (with_measurement).
RELATIVE_TO_V100: Mapping[str, float] = {
    "P4": 0.30,
    "T4": 0.45,
    "L4": 1.00,
    "A100": 2.20,
    "A100-80GB": 2.40,
    "H100": 4.50,
    "H100-MEGA": 4.60,
    "H200": 5.40,
    "B200": 10.0,
}

# SAILOR's built-in models, mapped to the closest Gavel job type (byte-level language models).
MODEL_JOB_TYPES: Mapping[str, JobKey] = {
    "tiny_gpt": ("LM (batch size 20)", 1),
    "small_gpt": ("Transformer (batch size 32)", 1),
    "gpt_25m": ("Transformer (batch size 64)", 1),
}


def parse_job_key(text: str) -> JobKey:
    """``"('ResNet-18 (batch size 16)', 1)"`` → ``("ResNet-18 (batch size 16)", 1)``."""
    name, scale = ast.literal_eval(text)
    return str(name), int(scale)


@dataclass(frozen=True)
class ThroughputTable:
    """Steps/s per job and GPU type; space-sharing pairs when loaded from the full Gavel file."""

    alone: Mapping[JobKey, GpuThroughput]
    """Consolidated (workers packed on as few servers as possible)."""
    unconsolidated: Mapping[JobKey, GpuThroughput] = field(default_factory=dict)
    pairs: Mapping[tuple[JobKey, JobKey], Mapping[str, tuple[float, float]]] = field(default_factory=dict)
    """(job a, job b) → GPU type → (steps/s of a, steps/s of b) when sharing one GPU."""

    @property
    def job_types(self) -> tuple[JobKey, ...]:
        return tuple(sorted(self.alone))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({g for per_gpu in self.alone.values() for g in per_gpu}))

    def throughput(self, job: JobKey, gpu_type: str, consolidated: bool = True) -> float:
        """Steps/s of ``job`` on ``gpu_type`` (0.0 when the job cannot run there)."""
        source = self.alone if consolidated or job not in self.unconsolidated else self.unconsolidated
        return source.get(job, {}).get(gpu_type, 0.0)

    def pair(self, a: JobKey, b: JobKey, gpu_type: str) -> tuple[float, float] | None:
        """Steps/s of (a, b) sharing one GPU of ``gpu_type``, or None when not measured."""
        if (a, b) in self.pairs:
            return self.pairs[(a, b)].get(gpu_type)
        if (b, a) in self.pairs and gpu_type in self.pairs[(b, a)]:
            tb, ta = self.pairs[(b, a)][gpu_type]
            return ta, tb
        return None

    def speedup(self, job: JobKey, gpu_type: str, baseline: str = "V100") -> float:
        """Throughput on ``gpu_type`` relative to ``baseline`` for ``job`` (0.0 when unknown)."""
        base = self.throughput(job, baseline)
        return self.throughput(job, gpu_type) / base if base > 0 else 0.0

    def with_relative_gpus(
        self, relative: Mapping[str, float] = RELATIVE_TO_V100, baseline: str = "V100"
    ) -> ThroughputTable:
        """Add GPU types as multiples of the baseline's throughput (measured values are kept)."""

        def extend(table: Mapping[JobKey, GpuThroughput]) -> dict[JobKey, GpuThroughput]:
            out = {}
            for job, per_gpu in table.items():
                base = per_gpu.get(baseline, 0.0)
                out[job] = {**{g: base * f for g, f in relative.items()}, **per_gpu}
            return out

        return replace(self, alone=extend(self.alone), unconsolidated=extend(self.unconsolidated))

    def with_measurement(
        self, job: JobKey, gpu_type: str, steps_per_s: float, weight: float = 0.5
    ) -> ThroughputTable:
        """Blend a measured throughput into the table: new = (1 - weight) · old + weight · measured.
        The job's other entries on ``gpu_type`` (its other scale factors, consolidated and spread)
        move by the same factor new / old, so that a run of several GPUs sees the measurement too
        and the packaged scaling and spread penalty are kept."""
        if steps_per_s <= 0 or not 0 < weight <= 1:
            raise ValueError(f"measurement {steps_per_s} steps/s with weight {weight}: need > 0 and (0, 1]")
        old = self.throughput(job, gpu_type)
        new = steps_per_s if old <= 0 else (1 - weight) * old + weight * steps_per_s

        def moved(table: Mapping[JobKey, GpuThroughput]) -> dict[JobKey, dict[str, float]]:
            out = {k: dict(v) for k, v in table.items()}
            for key, per_gpu in out.items():
                if key[0] == job[0] and key != job and per_gpu.get(gpu_type, 0.0) > 0 and old > 0:
                    per_gpu[gpu_type] *= new / old
            return out

        alone = moved(self.alone)
        alone.setdefault(job, {})[gpu_type] = new
        unconsolidated = self.unconsolidated
        if job in unconsolidated or any(k[0] == job[0] for k in unconsolidated):
            spread = unconsolidated.get(job, {}).get(gpu_type, 0.0)
            unconsolidated = moved(unconsolidated)
            if job in unconsolidated:
                unconsolidated[job][gpu_type] = spread * new / old if old > 0 and spread > 0 else new
        return replace(self, alone=alone, unconsolidated=unconsolidated)

    def with_measured(self, measurements: Iterable[tuple[str, str, float]]) -> ThroughputTable:
        """The table with measured ``(model, GPU type, steps/s)`` triples (e.g.
        ``Ledger.measured_throughputs``) learned into the job types of SAILOR's built-in models
        (other models are ignored): each (model, GPU type)'s speed becomes the median of its
        measurements and the table's own value (``with_measurement``), so that one run's speed
        moves the entry halfway, and a few runs far off (a slow host, a busy disk) move it no
        further than the good ones around them allow."""
        samples: dict[tuple[JobKey, str], list[float]] = {}
        for model, gpu_type, steps_per_s in measurements:
            key = MODEL_JOB_TYPES.get(model)
            if key is not None and steps_per_s > 0 and math.isfinite(steps_per_s):
                samples.setdefault((key, gpu_type), []).append(float(steps_per_s))
        table = self
        for (key, gpu_type), values in samples.items():
            prior = table.throughput(key, gpu_type)
            learned = statistics.median([prior, *values] if prior > 0 else values)
            table = table.with_measurement(key, gpu_type, learned, weight=1.0)
        return table


def load_gavel(path: str, include_pairs: bool = True) -> ThroughputTable:
    """Load Gavel's ``simulation_throughputs.json`` (K80/P100/V100, alone, unconsolidated, pairs).

    Raises:
        ValueError: the file is not that JSON (naming the file and the first bad entry).
    """
    with open(path) as f:
        try:
            raw = json.load(f)
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(
            f"{path}: expected Gavel's simulation_throughputs.json, an object keyed by GPU type "
            f"({', '.join(GAVEL_GPUS)}, optionally with _unconsolidated); got {str(raw)[:80]!r}"
        )
    alone: dict[JobKey, GpuThroughput] = {}
    unconsolidated: dict[JobKey, GpuThroughput] = {}
    pairs: dict[tuple[JobKey, JobKey], dict[str, tuple[float, float]]] = {}
    for gavel_gpu, jobs in raw.items():
        base, _, variant = gavel_gpu.partition("_")
        if base not in GAVEL_GPUS or variant not in ("", "unconsolidated"):
            raise ValueError(
                f"{path}: GPU type key {gavel_gpu!r} is not one of Gavel's: "
                + ", ".join(f"{g}, {g}_unconsolidated" for g in GAVEL_GPUS)
            )
        gpu = GAVEL_GPUS[base]
        target = unconsolidated if variant == "unconsolidated" else alone
        try:
            for job_text, entries in jobs.items():
                job = parse_job_key(job_text)
                for other_text, value in entries.items():
                    if other_text == "null":
                        target.setdefault(job, {})[gpu] = float(value)
                    elif include_pairs and not variant:
                        pairs.setdefault((job, parse_job_key(other_text)), {})[gpu] = (
                            float(value[0]),
                            float(value[1]),
                        )
        except (AttributeError, TypeError, ValueError, SyntaxError, IndexError) as exc:
            raise ValueError(
                f"{path}: {gavel_gpu!r} is not job key → {{other job key or 'null': steps/s}} "
                f"as in Gavel's file ({type(exc).__name__}: {exc})"
            ) from None
    if not alone:
        raise ValueError(f"{path}: no job has a throughput alone on a GPU (no 'null' entries)")
    return ThroughputTable(alone=alone, unconsolidated=unconsolidated, pairs=pairs)


def derive_packaged(gavel_path: str, dest: str) -> int:
    """Write the alone/unconsolidated throughputs (no pairs) as the packaged JSON; return job count."""
    table = load_gavel(gavel_path, include_pairs=False)

    def dump(t: Mapping[JobKey, GpuThroughput]) -> dict[str, GpuThroughput]:
        return {repr(k): dict(sorted(v.items())) for k, v in sorted(t.items())}

    doc = {
        "provenance": f"derived by sailor_tasks/catalog/throughput.py from {os.path.basename(gavel_path)} "
        "(Gavel, MIT license, Narayanan et al. OSDI'20): steps/s of each job alone on K80/P100/V100",
        "alone": dump(table.alone),
        "unconsolidated": dump(table.unconsolidated),
    }
    with open(dest, "w") as f:
        json.dump(doc, f, indent=1)
    return len(table.alone)


def load_packaged() -> ThroughputTable:
    """The packaged Gavel-derived table, extended with the newer GPU types of the catalog."""
    path = resources.files("sailor_tasks.catalog").joinpath("data", PACKAGED_FILE)
    doc = json.loads(path.read_text())

    def load(section: Mapping[str, Mapping[str, float]]) -> dict[JobKey, GpuThroughput]:
        return {parse_job_key(k): dict(v) for k, v in section.items()}

    table = ThroughputTable(alone=load(doc["alone"]), unconsolidated=load(doc["unconsolidated"]))
    return table.with_relative_gpus()


@functools.lru_cache(maxsize=4)
def packaged_with_measured(measurements: tuple[tuple[str, str, float], ...]) -> ThroughputTable:
    """The one matrix both placement (``stages.plan``) and live admission's policies
    (``stages.queueing``) use: the packaged table with SAILOR's measured
    ``(model, GPU type, steps/s)`` learned in (``Ledger.measured_throughputs``). Cached per
    measurements, so the placement index built on it is reused until a new measurement lands."""
    return load_packaged().with_measured(measurements)


def model_speed(table: ThroughputTable, model: str, gpu_types: Iterable[str]) -> dict[str, float]:
    """Steps/s of a built-in SAILOR model on each GPU type (through its Gavel job type)."""
    job = MODEL_JOB_TYPES[model]
    return {g: table.throughput(job, g) for g in gpu_types}
