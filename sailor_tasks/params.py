"""The run request's schema: one JSON-schema per param, shared by the Airflow form and the CLI.

``dags/sailor_train.py`` wraps each entry in an Airflow ``Param`` (titles, descriptions and
``section`` drive the trigger form); ``request.from_params`` validates the same schemas for callers
outside Airflow, so there is one definition of what a valid run is. Torch-free and cheap to import.
"""

from __future__ import annotations

from typing import Any

from sailor_tasks.catalog import packaged_choices
from sailor_tasks.model import ANY_GPU, MARKET_CHOICES
from sailor_tasks.settings import BACKENDS
from sailor_tasks.strategies import MARKET_STRATEGIES, RECOVERY_STRATEGIES
from sailor_tasks.train.specs import MODEL_NAMES, MODEL_SPECS

DEMO_DATASET_URI = "sailor://source/datasets/demo-text"
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""Lowercase DNS label: safe in bucket paths, Kubernetes labels and pod names."""
DATASET_URI_PATTERN = r"^(sailor|gs|file)://[A-Za-z0-9._/-]+$"

DATA_RESIDENCY_CHOICES = ("NA", "SA", "EU", "ASIA", "OC", "ME", "AF")
"""Continent codes of the transfer file (``catalog/data/transfer.yaml``)."""

SECTION_JOB = "Job"
SECTION_DATA = "Data"
SECTION_RESOURCES = "Resources"
SECTION_MARKET = "Market and cost"
SECTION_CHECKPOINT = "Checkpointing"
SECTION_ADVANCED = "Advanced"
SECTION_RESILIENCE = "Spot resilience"


def train_param_schemas() -> dict[str, dict[str, Any]]:
    """name → {"default": ..., "description": ..., <JSON-schema keywords>} for ``sailor_train``."""
    regions, gpu_types = packaged_choices()
    return {
        "job_name": {
            "default": "demo-lm",
            "type": "string",
            "pattern": NAME_PATTERN,
            "maxLength": 63,
            "title": "Job name",
            "section": SECTION_JOB,
            "description": "Short name of the job (lowercase letters, digits, '-'; at most 63).",
        },
        "team": {
            "default": "research",
            "type": "string",
            "pattern": NAME_PATTERN,
            "maxLength": 63,
            "title": "Team",
            "section": SECTION_JOB,
            "description": "Team (workload class) charged for the run; the nightly rebalance assigns regions per team.",
        },
        "model": {
            "default": "tiny_gpt",
            "type": "string",
            "enum": list(MODEL_NAMES),
            "values_display": {n: f"{n}: {MODEL_SPECS[n].description}" for n in MODEL_NAMES},
            "title": "Model",
            "section": SECTION_JOB,
            "description": "Built-in model to train (byte-level transformer language models).",
        },
        "total_steps": {
            "default": 300,
            "type": "integer",
            "minimum": 1,
            "maximum": 10_000_000,
            "title": "Total steps",
            "section": SECTION_JOB,
            "description": "Optimizer steps for the whole run, across preemptions and restarts.",
        },
        "seed": {
            "default": 0,
            "type": "integer",
            "minimum": 0,
            "maximum": 2**31 - 1,
            "title": "Seed",
            "section": SECTION_JOB,
            "description": "Seed of init, data order and dropout; a fixed seed reproduces a run bit for bit on CPU.",
        },
        "dataset_uri": {
            "default": DEMO_DATASET_URI,
            "type": "string",
            "maxLength": 1024,
            "pattern": DATASET_URI_PATTERN,
            "title": "Dataset URI",
            "section": SECTION_DATA,
            "description": "Folder of the training data: sailor://<bucket>/<path>, gs://<bucket>/<path> or file:///<path>.",
        },
        "num_workers": {
            "default": 2,
            "type": "integer",
            "minimum": 1,
            "maximum": 256,
            "title": "Workers",
            "section": SECTION_RESOURCES,
            "description": "Training processes (one GPU each); on the local backend, torchrun processes on this machine.",
        },
        "gpu_type": {
            "default": ANY_GPU,
            "type": "string",
            "enum": [ANY_GPU, *gpu_types],
            "title": "GPU type",
            "section": SECTION_RESOURCES,
            "description": "GPU type to run on, or 'any' to let the planner choose.",
        },
        "regions": {
            "default": list(regions),
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {"type": "string", "enum": list(regions)},
            # The Airflow 3 form renders an array as a multi-select only when the array itself lists
            # its choices (``examples``, a non-validating annotation); ``items.enum`` alone gives a textarea.
            "examples": list(regions),
            "title": "Allowed regions",
            "section": SECTION_RESOURCES,
            "description": "Regions the run may be placed in (default: all regions of the catalog).",
        },
        "market": {
            "default": "auto",
            "type": "string",
            "enum": list(MARKET_CHOICES),
            "title": "Market",
            "section": SECTION_MARKET,
            "description": "spot (cheap, preemptible), on_demand, or auto (the planner decides per offer).",
        },
        "max_usd_per_hour": {
            "default": 20.0,
            "type": "number",
            "minimum": 0,
            "title": "Max USD per hour",
            "section": SECTION_MARKET,
            "description": "Price cap for the whole run (all GPUs) in USD per hour.",
        },
        "deadline_hours": {
            "default": None,
            "type": ["null", "number"],
            "exclusiveMinimum": 0,
            "title": "Deadline (hours)",
            "section": SECTION_MARKET,
            "description": "Finish within this many hours of planning, or empty for no deadline. With market=auto, "
            "long jobs with little slack go on-demand, short or slack-rich jobs on spot.",
        },
        "exclude_regions": {
            "default": [],
            "type": ["null", "array"],
            "examples": list(regions),
            "uniqueItems": True,
            "items": {"type": "string", "enum": list(regions)},
            "title": "Excluded regions",
            "section": SECTION_RESOURCES,
            "description": "Regions the run must not use (deny list, applied after the allowed regions).",
        },
        "data_residency": {
            "default": [],
            "type": ["null", "array"],
            "examples": list(DATA_RESIDENCY_CHOICES),
            "uniqueItems": True,
            "items": {"type": "string", "enum": list(DATA_RESIDENCY_CHOICES)},
            "title": "Data residency",
            "section": SECTION_DATA,
            "description": "Continents the dataset may be copied to (NA, SA, EU, ASIA, OC, ME, AF); empty: anywhere.",
        },
        "checkpoint_every_steps": {
            "default": 50,
            "type": "integer",
            "minimum": 1,
            "title": "Checkpoint every N steps",
            "section": SECTION_CHECKPOINT,
            "description": "Checkpoint interval; at most the steps one can afford to redo after an unnoticed preemption.",
        },
        "strategy": {
            "default": "sailor",
            "type": "string",
            "enum": list(MARKET_STRATEGIES),
            "title": "Market strategy",
            "section": SECTION_MARKET,
            "description": "Spot or on-demand at launch and after each preemption: sailor (spot while the "
            "deadline's slack covers the expected preemption loss, else on-demand), on_demand, spot_restart "
            "(spot; wait for the preempted zone) or eager_next_region (spot; move to the next region).",
        },
        "recovery_strategy": {
            "default": None,
            "type": ["null", "string"],
            "enum": [None, *RECOVERY_STRATEGIES],
            "title": "Recovery strategy (override)",
            "section": SECTION_RESILIENCE,
            "description": "Where a preempted run resumes, overriding the market strategy's own rule: "
            "same_zone_first (retry the zone; block it after 2 preemptions) or eager_next_region (block the "
            "preempted region, move to the next one). Empty: the market strategy decides.",
        },
        "inject_preemptions": {
            "default": [],
            "type": ["null", "array"],
            "items": {"type": "integer", "minimum": 1},
            "uniqueItems": True,
            "title": "Inject preemptions at steps",
            "section": SECTION_RESILIENCE,
            "description": "Local backend: deliver a preemption notice (SIGTERM to the workers, SIGKILL when "
            "the notice window ends) once training reaches each of these steps.",
        },
        "inject_kills": {
            "default": [],
            "type": ["null", "array"],
            "items": {"type": "integer", "minimum": 1},
            "uniqueItems": True,
            "title": "Inject kills without notice at steps",
            "section": SECTION_RESILIENCE,
            "description": "Local backend: SIGKILL the workers with no notice at these steps "
            "(work since the last checkpoint is lost).",
        },
        "preemption_rate_per_hour": {
            "default": 0.0,
            "type": "number",
            "minimum": 0,
            "maximum": 3600,
            "title": "Injected preemptions per hour",
            "section": SECTION_RESILIENCE,
            "description": "Local backend: noticed preemptions as a Poisson process (seeded by the run's seed).",
        },
        "preemption_trace_uri": {
            "default": "",
            "type": ["null", "string"],
            "maxLength": 1024,
            "pattern": r"^$|^(gs|file)://[A-Za-z0-9._/-]+$",
            "title": "Availability trace",
            "section": SECTION_RESILIENCE,
            "description": 'Local backend: replay an availability trace (JSON {"metadata": {"gap_seconds": N}, '
            '"data": [0, 1, ...]}, 1 = unavailable) from the first launch; each loss of capacity is a noticed preemption.',
        },
        "preemption_trace_time_scale": {
            "default": 1.0,
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1_000_000,
            "title": "Trace speed-up",
            "section": SECTION_RESILIENCE,
            "description": "Trace seconds replayed per wall second (3600: one hour of the trace per second).",
        },
        "preemption_notice_s": {
            "default": 30.0,
            "type": "number",
            "minimum": 0,
            "maximum": 3600,
            "title": "Preemption notice (s)",
            "section": SECTION_RESILIENCE,
            "description": "Seconds between the preemption notice and the hard kill (GCE spot VMs: 30).",
        },
        "async_checkpoint": {
            "default": False,
            "type": "boolean",
            "title": "Asynchronous checkpoints",
            "section": SECTION_CHECKPOINT,
            "description": "Write periodic checkpoints in the background (the state copy overlaps the next "
            "step's forward/backward); saves on a preemption notice and at the end stay synchronous.",
        },
        "batch_size": {
            "default": 16,
            "type": "integer",
            "minimum": 1,
            "maximum": 4096,
            "title": "Batch size per worker",
            "section": SECTION_ADVANCED,
            "description": "Sequences per worker per step.",
        },
        "learning_rate": {
            "default": 0.003,
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
            "title": "Learning rate",
            "section": SECTION_ADVANCED,
            "description": "Peak AdamW learning rate (warmup then cosine decay).",
        },
        "backend": {
            "default": "local",
            "type": "string",
            "enum": list(BACKENDS),
            "title": "Backend",
            "section": SECTION_ADVANCED,
            "description": "local: everything on this machine; gke: Google Kubernetes Engine + GCS.",
        },
    }
