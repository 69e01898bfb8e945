"""The run request: one JSON-schema per ``sailor_train`` param, and the validated ``JobRequest``.

``dags/sailor_train.py`` wraps each schema of ``train_param_schemas`` in an Airflow ``Param``
(titles, descriptions and ``section`` drive the trigger form); ``from_params`` validates the same
schemas for callers outside Airflow (CLI, REST client), so there is one definition of what a valid
run is. Its checks, all reported together: unknown params; each param against its JSON schema;
cross-field rules; then the catalog (regions, GPU types, and a price cap that no offer meets, naming
the cheapest offer). Nothing here has side effects; torch-free and cheap to import.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from sailor_tasks import paths, storage
from sailor_tasks.backends.local_command import check_local_env, resolve_local_command
from sailor_tasks.catalog import Catalog, catalog_choices
from sailor_tasks.errors import InvalidRequestError, InvalidRequestErrors
from sailor_tasks.model import (
    ANY_GPU,
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_HOURS,
    MARKET_CHOICES,
    JobRequest,
)
from sailor_tasks.settings import BACKENDS, SOURCE_BUCKET, Settings
from sailor_tasks.strategies import MARKET_STRATEGIES, RECOVERY_STRATEGIES
from sailor_tasks.train.specs import MODEL_NAMES, MODEL_SPECS

DEMO_DATASET_URI = "sailor://source/datasets/demo-text"


def whole_string(body: str) -> str:
    """A JSON-schema ``pattern`` that matches only the whole string.

    Patterns are searches, so they are anchored; but Python's ``$`` (what ``jsonschema`` runs) also
    matches before a trailing newline, which ECMA-262's (the trigger form's) does not. ``(?!\\n)``
    after ``$`` closes that gap and means the same in both engines.
    """
    return f"^(?:{body})$(?!\\n)"


NAME_PATTERN = whole_string(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
"""Lowercase DNS label: safe in bucket paths, Kubernetes labels and pod names."""
DATASET_URI_PATTERN = whole_string(r"(sailor|gs|file)://[A-Za-z0-9._/-]+")
TRACE_URI_PATTERN = whole_string(r"|(gs|file)://[A-Za-z0-9._/-]+")

PATTERN_MEANING = {
    NAME_PATTERN: "must be 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
    DATASET_URI_PATTERN: "must be a sailor://, gs:// or file:// URI of letters, digits and . _ / -",
    TRACE_URI_PATTERN: "must be empty, or a gs:// or file:// URI of letters, digits and . _ / -",
}
"""What a string pattern asks for, in words: the error for a value that does not match says this
instead of the regular expression."""

FINITE: dict[str, Any] = {"not": {"type": "number", "minimum": 1, "maximum": 0}}
"""JSON-schema clause that refuses NaN: no finite number is both >= 1 and <= 0, but every bound
comparison with NaN is false, so NaN satisfies the inner schema. ±Infinity is refused by the
bounds every number param has. Non-standard JSON, but Python's ``json`` (and Airflow's REST API)
parse ``NaN`` and ``Infinity``."""

# OCI image reference grammar (github.com/distribution/reference, regexp.go), spelled with ASCII
# classes so Python's ``re`` and the browser's RegExp read it alike.
_OCI_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_OCI_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_OCI_DOMAIN = (
    rf"(?:{_OCI_DOMAIN_COMPONENT}(?:\.{_OCI_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
)
_OCI_NAME = rf"(?:{_OCI_DOMAIN}/)?{_OCI_PATH_COMPONENT}(?:/{_OCI_PATH_COMPONENT})*"
_OCI_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_OCI_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[a-fA-F0-9]{32,}"
IMAGE_PATTERN = whole_string(rf"|{_OCI_NAME}(?::{_OCI_TAG})?(?:@{_OCI_DIGEST})?")
"""An OCI image reference, ``[registry[:port]/]name[:tag][@digest]``, or empty."""
IMAGE_NAME_MAX = 255
"""Longest repository name (registry included) the reference grammar allows."""
ENV_NAME_PATTERN = whole_string(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIXES = ("SAILOR_", "TORCHELASTIC_", "PET_")
"""Env name prefixes SAILOR and torchrun set for every worker (the run contract), and torchrun's
own options (``PET_<OPTION>``: a run's env reaches torchrun too, and would restart or silence it)."""
RESERVED_ENV_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""Env names torchrun sets for every worker."""
ENV_MAX_NAMES = 32
ENV_NAME_MAX = 64
ENV_VALUE_MAX = 2048
"""Caps of ``env``: at most 32 names of 64 characters and values of 2048 (≤ 68 KiB in all, far
below the kernel's limits on a process's environment and Kubernetes' on a pod spec)."""
COMMAND_MAX_ARGS = 64
COMMAND_ARG_MAX = 1024

DATA_RESIDENCY_CHOICES = ("NA", "SA", "EU", "ASIA", "OC", "ME", "AF")
"""Continent codes of the transfer file (``catalog/data/transfer.yaml``)."""

SECTION_JOB = "Job"
SECTION_CODE = "Training code"
SECTION_DATA = "Data"
SECTION_RESOURCES = "Resources"
SECTION_MARKET = "Market and cost"
SECTION_CHECKPOINT = "Checkpointing"
SECTION_ADVANCED = "Advanced"
SECTION_RESILIENCE = "Spot resilience"


def train_param_schemas() -> dict[str, dict[str, Any]]:
    """name → {"default": ..., "description": ..., <JSON-schema keywords>} for ``sailor_train``."""
    regions, gpu_types = catalog_choices()
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
        "command": {
            "default": [],
            "type": ["null", "array"],
            "maxItems": COMMAND_MAX_ARGS,
            "items": {"type": "string", "minLength": 1, "maxLength": COMMAND_ARG_MAX, "pattern": r"^[^\x00]*$"},
            "title": "Command",
            "section": SECTION_CODE,
            "description": 'Your training command as an argv list (never a shell string), run under torchrun with '
            'SAILOR\'s run contract, e.g. ["python", "plain_ddp.py", "--lr", "0.1"] (in the trigger form: one argument '
            "per line). Empty: the built-in model. "
            "Local backend: only scripts or executables in the allowed folders (SAILOR_COMMAND_ROOTS); "
            "gke: run as given in the image (which needs torch).",
        },
        "image": {
            "default": "",
            "type": ["null", "string"],
            "maxLength": 512,
            "pattern": IMAGE_PATTERN,
            "title": "Container image",
            "section": SECTION_CODE,
            "description": "OCI image reference ([registry[:port]/]name[:tag][@digest]) for container backends; "
            "empty: SAILOR's training image.",
        },
        "env": {
            "default": {},
            "type": ["null", "object"],
            "maxProperties": ENV_MAX_NAMES,
            "propertyNames": {
                "pattern": ENV_NAME_PATTERN,
                "maxLength": ENV_NAME_MAX,
                "not": {
                    "anyOf": [
                        *({"pattern": f"^{p}"} for p in RESERVED_ENV_PREFIXES),
                        {"enum": list(RESERVED_ENV_NAMES)},
                    ]
                },
            },
            "additionalProperties": {"type": "string", "maxLength": ENV_VALUE_MAX, "pattern": r"^[^\x00]*$"},
            "title": "Environment",
            "section": SECTION_CODE,
            "description": 'Extra environment of every worker, {"NAME": "value"}; names [A-Za-z_][A-Za-z0-9_]*, '
            f"at most {ENV_MAX_NAMES}; SAILOR_*, TORCHELASTIC_* and torchrun's variables are reserved.",
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
            **FINITE,
            "exclusiveMinimum": 0,
            "maximum": 1_000_000,
            "title": "Max USD per hour",
            "section": SECTION_MARKET,
            "description": "Price cap for the whole run (all GPUs) in USD per hour.",
        },
        "deadline_hours": {
            "default": None,
            "type": ["null", "number"],
            **FINITE,
            "exclusiveMinimum": 0,
            "maximum": 100_000,
            "title": "Deadline (hours)",
            "section": SECTION_MARKET,
            "description": "Finish within this many hours of planning, or empty for no deadline. With market=auto, "
            "long jobs with little slack go on-demand, short or slack-rich jobs on spot.",
        },
        "priority": {
            "default": "normal",
            "type": "string",
            "enum": ["low", "normal", "high"],
            "title": "Queue priority",
            "section": SECTION_JOB,
            "description": "When capacity is full: a waiting run of higher priority is admitted before "
            "any of lower priority (as Kueue's priorities); within one priority the queue policy decides.",
        },
        "max_queue_hours": {
            "default": DEFAULT_MAX_QUEUE_HOURS,
            "type": "number",
            **FINITE,
            "minimum": 0,
            "maximum": 8760,
            "title": "Max hours in the queue",
            "section": SECTION_JOB,
            "description": "How long the run may wait in SAILOR's queue for capacity before it fails "
            "naming what it waited for (0: fail at once when nothing fits).",
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
            **FINITE,
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
            "pattern": TRACE_URI_PATTERN,
            "title": "Availability trace",
            "section": SECTION_RESILIENCE,
            "description": 'Local backend: replay an availability trace (JSON {"metadata": {"gap_seconds": N}, '
            '"data": [0, 1, ...]}, 1 = unavailable) from the first launch; each loss of capacity is a noticed preemption.',
        },
        "preemption_trace_time_scale": {
            "default": 1.0,
            "type": "number",
            **FINITE,
            "exclusiveMinimum": 0,
            "maximum": 1_000_000,
            "title": "Trace speed-up",
            "section": SECTION_RESILIENCE,
            "description": "Trace seconds replayed per wall second (3600: one hour of the trace per second).",
        },
        "preemption_notice_s": {
            "default": 30.0,
            "type": "number",
            **FINITE,
            "minimum": 0,
            "maximum": 3600,
            "title": "Preemption notice (s)",
            "section": SECTION_RESILIENCE,
            "description": "Local backend: seconds between an injected preemption's notice and its hard "
            "kill (GCE spot VMs give 30; on GKE the node's graceful shutdown window sets it).",
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
            "default": DEFAULT_BATCH_SIZE,
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
            **FINITE,
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


_NULL_MEANS_EMPTY: dict[str, Any] = {
    "exclude_regions": [],
    "data_residency": [],
    "inject_preemptions": [],
    "inject_kills": [],
    "preemption_trace_uri": "",
    "command": [],
    "image": "",
    "env": {},
}
"""Optional params whose null (an empty field in the trigger form) means the empty value."""

_NON_SCHEMA_KEYS = ("default", "description", "title", "section", "values_display")


def _schema_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in _NON_SCHEMA_KEYS}


_SHOWN_CHARS = 80
"""Longest value echoed back in an error message (hostile input may be megabytes)."""


HUGE_INT_BITS = 1024
"""Integers longer than this many bits are refused before anything prints them."""


def _short(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > HUGE_INT_BITS:
        return f"an integer of {value.bit_length()} bits"
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= _SHOWN_CHARS:
        return value
    return text[: _SHOWN_CHARS - 3] + f"... ({len(text)} chars)"


def _check_schema(name: str, value: Any, spec: Mapping[str, Any]) -> InvalidRequestError | None:
    if isinstance(value, float) and not math.isfinite(value):
        return InvalidRequestError(name, value, "must be a finite number (NaN and ±Infinity are not)")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > HUGE_INT_BITS:
        # Python cannot even print it (its digit limit); no param is anywhere near this size.
        return InvalidRequestError(name, _short(value), "is far too large a number")
    try:
        jsonschema.validate(value, _schema_of(spec))
    except jsonschema.ValidationError as exc:
        valid = spec.get("enum") or spec.get("items", {}).get("enum")
        shown = _short(value)
        message = exc.message
        if exc.validator == "pattern" and exc.validator_value in PATTERN_MEANING:
            message = PATTERN_MEANING[exc.validator_value]
        return InvalidRequestError(name, shown, message if len(message) < 300 else message[:297] + "...", valid)
    return None


def _check_command(value: Any) -> list[InvalidRequestError]:
    if isinstance(value, str):
        return [
            InvalidRequestError(
                "command",
                _short(value),
                'must be an argv list of strings, never a shell string: e.g. ["python", "train.py", "--lr", "0.1"]',
            )
        ]
    if not isinstance(value, list):
        return []  # the schema's own message
    if len(value) > COMMAND_MAX_ARGS:
        return [InvalidRequestError("command", _short(value), f"at most {COMMAND_MAX_ARGS} arguments")]
    bad = [a for a in value if not isinstance(a, str) or not a or len(a) > COMMAND_ARG_MAX or "\x00" in a]
    if bad:
        return [
            InvalidRequestError(
                "command",
                _short(bad[0]),
                f"every argument must be a non-empty string of at most {COMMAND_ARG_MAX} characters without NUL",
            )
        ]
    return []


def _check_image(value: Any) -> list[InvalidRequestError]:
    if not isinstance(value, str) or len(value) > 512:
        return []  # the schema's own message
    return [
        InvalidRequestError(
            "image",
            _short(value),
            "not an OCI image reference: [registry[:port]/]name[:tag][@digest], name components lowercase "
            "letters and digits separated by '.', '_', '__' or '-', no spaces or shell characters",
        )
    ]


def _check_env(value: Any) -> list[InvalidRequestError]:
    if not isinstance(value, dict):
        return [InvalidRequestError("env", _short(value), 'must be an object of names to strings, {"NAME": "value"}')]
    errors = []
    if len(value) > ENV_MAX_NAMES:
        errors.append(InvalidRequestError("env", f"{len(value)} names", f"at most {ENV_MAX_NAMES} names"))
    malformed = [n for n in value if not re.match(ENV_NAME_PATTERN, n) or len(n) > ENV_NAME_MAX]
    if malformed:
        errors.append(
            InvalidRequestError(
                "env",
                [_short(n) for n in malformed[:5]],
                f"names must match {ENV_NAME_PATTERN} and have at most {ENV_NAME_MAX} characters",
            )
        )
    reserved = [n for n in value if n in RESERVED_ENV_NAMES or n.startswith(RESERVED_ENV_PREFIXES)]
    if reserved:
        errors.append(
            InvalidRequestError(
                "env",
                [_short(n) for n in reserved[:5]],
                "reserved: SAILOR sets SAILOR_*, torchrun reads PET_* as its options and sets "
                "TORCHELASTIC_* and " + ", ".join(RESERVED_ENV_NAMES),
            )
        )
    bad_values = [
        n for n, v in value.items() if not isinstance(v, str) or len(v) > ENV_VALUE_MAX or "\x00" in v
    ]
    if bad_values:
        errors.append(
            InvalidRequestError(
                "env",
                [_short(n) for n in bad_values[:5]],
                f"values must be strings of at most {ENV_VALUE_MAX} characters without NUL",
            )
        )
    return errors


_CLEAR_CHECKS = {"command": _check_command, "image": _check_image, "env": _check_env}
"""Params whose schema errors are explained by a clearer check (the schema stays what decides)."""


def canonical_dataset_uri(uri: str) -> str:
    """The one spelling of a dataset folder's URI: no trailing ``/``, no empty path segments
    (``sailor://source/ds/`` and ``sailor://source//ds`` are ``sailor://source/ds``), so that its
    replicas, locality and ``data_residency`` are keyed alike whichever way a run wrote it."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    lead = "/" if rest.startswith("/") else ""  # file:///path keeps its root
    return f"{scheme}://{lead}{'/'.join(seg for seg in rest.split('/') if seg)}"


def check_dataset_uri(uri: str, regions: tuple[str, ...]) -> InvalidRequestError | None:
    """Reject traversal and unknown buckets; schemes are already limited by the schema pattern."""
    scheme, _, rest = uri.partition("://")
    segments = rest.split("/")
    if any(seg in ("..", ".") for seg in segments):
        return InvalidRequestError("dataset_uri", uri, "path segments '.' and '..' are not allowed")
    if scheme == "file" and not rest.startswith("/"):
        return InvalidRequestError("dataset_uri", uri, "file:// URIs must be absolute (file:///path)")
    if scheme == "sailor":
        bucket = segments[0]
        valid = (SOURCE_BUCKET, *regions)
        if bucket not in valid:
            return InvalidRequestError("dataset_uri", uri, f"unknown SAILOR bucket {bucket!r}", valid)
        if len(segments) < 2 or not segments[1]:
            return InvalidRequestError("dataset_uri", uri, "name a folder inside the bucket")
    return None


def _located(uri: str, settings: Settings, regions: Sequence[str]) -> tuple[str, str, dict[str, str]] | None:
    """Where ``uri`` points: (scheme, the path or ``bucket/object`` it names, symbolic links
    followed, and the same of each of SAILOR's own buckets of that scheme, by name); None for a
    scheme SAILOR does not read."""
    concrete = storage.resolve(uri, settings)
    scheme = storage.scheme_of(concrete)
    own = {b: settings.bucket_uri(b) for b in (SOURCE_BUCKET, *regions)}
    if scheme == "file":
        target = os.path.realpath(concrete[len("file://") :])
        roots = {b: os.path.realpath(u[len("file://") :]) for b, u in own.items() if u.startswith("file://")}
    elif scheme == "gs":
        target = concrete[len("gs://") :].rstrip("/")
        roots = {b: u[len("gs://") :].rstrip("/") for b, u in own.items() if u.startswith("gs://")}
    else:
        return None
    return scheme, target, roots


def check_data_access(
    field: str, uri: str, settings: Settings, regions: Sequence[str]
) -> InvalidRequestError | None:
    """Whether a run may read ``uri`` (a dataset folder or a trace file), before anything is opened.

    Readable: a folder or file inside one of SAILOR's own buckets (``source`` and ``regions``, through
    the bucket template) but never a whole bucket nor its ``runs/`` folder (other runs' configs and
    checkpoints); a ``file://`` path inside a data folder (``SAILOR_DATA_ROOTS``) but never the rest of
    the state folder (ledger, cluster records); a ``gs://`` object of an allowed bucket
    (``SAILOR_DATA_BUCKETS``). Symbolic links are followed first, so a link cannot lead out.
    """
    located = _located(uri, settings, regions)
    if located is None:
        return InvalidRequestError(field, uri, "unsupported URI scheme", ("sailor://", "gs://", "file:///"))
    scheme, target, roots = located
    for bucket, root in roots.items():
        if target == root or target.startswith(root + "/"):
            inside = target[len(root) :].strip("/")
            if not inside:
                return InvalidRequestError(
                    field, uri, f"name a folder inside SAILOR bucket {bucket!r}, not the bucket"
                )
            if inside.split("/")[0] == paths.RUNS:
                return InvalidRequestError(
                    field, uri, f"the run folders ({paths.RUNS}/) of SAILOR buckets are not readable by a run"
                )
            return None
    if scheme == "file":
        state = os.path.realpath(settings.state_dir)
        in_state = target == state or target.startswith(state + "/")
        if not in_state and any(
            target == r or target.startswith(r.rstrip("/") + "/") for r in settings.dataset_roots
        ):
            return None
        valid = [f"file://{r}" for r in settings.dataset_roots]
        valid += [f"file://{r}/<folder>" for b, r in roots.items() if b == SOURCE_BUCKET]
        return InvalidRequestError(
            field,
            uri,
            "file:// URIs must lie inside a data folder (SAILOR_DATA_ROOTS) or a SAILOR bucket"
            + ("; the rest of the state folder is never readable" if in_state else ""),
            valid or None,
        )
    bucket = target.split("/", 1)[0]
    if bucket in settings.data_buckets:
        return None
    valid = sorted({*(r.split("/", 1)[0] for r in roots.values()), *settings.data_buckets})
    return InvalidRequestError(
        field,
        uri,
        f"gs:// bucket {bucket!r} is not allowed; allow it with SAILOR_DATA_BUCKETS",
        [f"gs://{b}" for b in valid] or None,
    )


def dataset_key(uri: str, settings: Settings, regions: Sequence[str]) -> str:
    """The one URI of the folder ``uri`` names (``check_data_access`` let the run read it): inside
    one of SAILOR's buckets its ``sailor://<bucket>/<path>`` form, else the ``file://`` path with
    symbolic links followed, or the ``gs://`` object. A dataset's replicas, locality and
    ``data_residency`` are keyed by it: a run that spells the same folder another way (its
    concrete bucket path, a link to it) shares them, and never escapes a residency another run
    declared."""
    located = _located(uri, settings, regions)
    if located is None:
        return uri
    scheme, target, roots = located
    for bucket, root in roots.items():
        if target.startswith(root + "/"):
            return canonical_dataset_uri(f"sailor://{bucket}/{target[len(root) :].strip('/')}")
    return canonical_dataset_uri(f"{scheme}://{target}")


def check_local_command(command: tuple[str, ...], roots: tuple[str, ...]) -> InvalidRequestError | None:
    """A local run's ``command`` must start a script or executable inside ``roots`` (never a shell)."""
    if not command:
        return None
    try:
        resolve_local_command(command, roots)
    except InvalidRequestError as exc:
        return exc
    return None


def from_params(params: Mapping[str, Any], catalog: Catalog | None = None) -> JobRequest:
    """Validate ``params`` (missing ones take their defaults) and build the ``JobRequest``.

    Raises:
        InvalidRequestErrors: every problem found, each naming the field, value and valid choices.
    """
    schemas = train_param_schemas()
    errors: list[InvalidRequestError] = []
    unknown = sorted(set(params) - set(schemas))
    for name in unknown:
        errors.append(
            InvalidRequestError(_short(name), _short(params[name]), "unknown parameter", sorted(schemas))
        )
    values = {name: params.get(name, spec["default"]) for name, spec in schemas.items()}
    for name, spec in schemas.items():
        err = _check_schema(name, values[name], spec)
        if err:
            clearer = _CLEAR_CHECKS[name](values[name]) if name in _CLEAR_CHECKS else []
            errors.extend(clearer or [err])
    if errors:
        raise InvalidRequestErrors(errors)
    # JSON Schema counts an integral float (2.0, 1e2) as an integer; SAILOR stores an int (torchrun
    # refuses --nproc-per-node=2.0).
    values = {name: _integers_as_int(values[name], spec) for name, spec in schemas.items()}
    # Airflow's trigger form sends an untouched optional field as null; null means "none".
    for name, empty in _NULL_MEANS_EMPTY.items():
        if values[name] is None:
            values[name] = empty

    # A run's own command saves as it decides (the interval is the planner's estimate of the work an
    # unnoticed preemption loses): only the built-in trainer's interval must fit in the run.
    if not values["command"] and values["checkpoint_every_steps"] > values["total_steps"]:
        errors.append(
            InvalidRequestError(
                "checkpoint_every_steps",
                values["checkpoint_every_steps"],
                f"must not exceed total_steps={values['total_steps']}",
            )
        )
    for field in ("inject_preemptions", "inject_kills"):
        late = [s for s in values[field] if s >= values["total_steps"]]
        if late:
            errors.append(
                InvalidRequestError(
                    field, late, f"injection steps must be below total_steps={values['total_steps']}"
                )
            )
    if values["strategy"] == "on_demand" and values["market"] == "spot":
        errors.append(
            InvalidRequestError(
                "market",
                "spot",
                "strategy=on_demand never uses spot: ask for market on_demand or auto, or a spot strategy",
                [m for m in MARKET_CHOICES if m != "spot"],
            )
        )
    errors.extend(_check_code(values))
    regions = tuple(values["regions"])
    if catalog is not None:
        errors.extend(_check_catalog(values, catalog))
    values["dataset_uri"] = canonical_dataset_uri(values["dataset_uri"])
    uri_err = check_dataset_uri(values["dataset_uri"], catalog.regions if catalog else regions)
    if uri_err:
        errors.append(uri_err)
    if errors:
        raise InvalidRequestErrors(errors)
    return JobRequest(
        job_name=values["job_name"],
        team=values["team"],
        dataset_uri=values["dataset_uri"],
        model=values["model"],
        num_workers=values["num_workers"],
        gpu_type=values["gpu_type"],
        regions=regions,
        market=values["market"],
        max_usd_per_hour=float(values["max_usd_per_hour"]),
        total_steps=values["total_steps"],
        checkpoint_every_steps=values["checkpoint_every_steps"],
        seed=values["seed"],
        backend=values["backend"],
        batch_size=values["batch_size"],
        learning_rate=float(values["learning_rate"]),
        deadline_hours=None if values["deadline_hours"] is None else float(values["deadline_hours"]),
        priority=values["priority"],
        max_queue_hours=float(values["max_queue_hours"]),
        exclude_regions=tuple(values["exclude_regions"]),
        data_residency=tuple(values["data_residency"]),
        strategy=values["strategy"],
        recovery_strategy=values["recovery_strategy"],
        inject_preemptions=tuple(sorted(values["inject_preemptions"])),
        inject_kills=tuple(sorted(values["inject_kills"])),
        preemption_rate_per_hour=float(values["preemption_rate_per_hour"]),
        preemption_trace_uri=values["preemption_trace_uri"],
        preemption_trace_time_scale=float(values["preemption_trace_time_scale"]),
        preemption_notice_s=float(values["preemption_notice_s"]),
        async_checkpoint=values["async_checkpoint"],
        command=tuple(values["command"]),
        image=values["image"],
        env=dict(values["env"]),
    )


def _integers_as_int(value: Any, spec: Mapping[str, Any]) -> Any:
    """``value`` with the floats an ``integer`` schema (or its array's ``items``) accepted as ints."""

    def integer(schema: Mapping[str, Any]) -> bool:
        kind = schema.get("type")
        return kind == "integer" or (isinstance(kind, list) and "integer" in kind)

    if isinstance(value, float) and integer(spec):
        return int(value)
    if isinstance(value, list) and integer(spec.get("items") or {}):
        return [int(v) if isinstance(v, float) else v for v in value]
    return value


LOCAL_ONLY_PARAMS = {
    "inject_preemptions": [],
    "inject_kills": [],
    "preemption_rate_per_hour": 0,
    "preemption_trace_uri": "",
    "preemption_trace_time_scale": 1.0,
    "preemption_notice_s": 30.0,
}
"""The params of injected preemptions (the local backend's) and their unset value (the notice
window's: its default)."""


def _not_text(value: str) -> bool:
    """``value`` holds a lone surrogate (valid JSON, ``"\\ud800"``): no process can be given it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_code(values: Mapping[str, Any]) -> list[InvalidRequestError]:
    """Cross-field rules of the run's own code: what each backend can run."""
    errors = []
    command = values["command"]
    if any(_not_text(a) for a in command):
        errors.append(
            InvalidRequestError(
                "command",
                _short(next(a for a in command if _not_text(a)).encode("utf-8", "backslashreplace").decode()),
                "every argument must be Unicode text (no lone surrogate such as \\ud800)",
            )
        )
    if len(command) == 1 and any(c.isspace() for c in command[0].strip()):
        errors.append(
            InvalidRequestError(
                "command",
                _short(command),
                "one argument per list item (one per line in the trigger form): "
                '["python", "train.py", "--lr", "0.1"], never one string with spaces',
            )
        )
    bad_env = [n for n, v in values["env"].items() if _not_text(v)]
    if bad_env:
        errors.append(
            InvalidRequestError(
                "env", bad_env[:5], "values must be Unicode text (no lone surrogate such as \\ud800)"
            )
        )
    image, backend = values["image"], values["backend"]
    name = image.split("@", 1)[0]
    name = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    if len(name) > IMAGE_NAME_MAX:
        errors.append(
            InvalidRequestError("image", _short(image), f"the repository name is longer than {IMAGE_NAME_MAX}")
        )
    if image and backend == "local":
        errors.append(
            InvalidRequestError(
                "image", image, "the local backend runs no container: leave image empty and give command"
            )
        )
    if backend == "local":
        errors.extend(check_local_env(values["env"]))
        if not values["preemption_trace_uri"] and values["preemption_trace_time_scale"] != 1.0:
            errors.append(
                InvalidRequestError(
                    "preemption_trace_time_scale",
                    values["preemption_trace_time_scale"],
                    "speeds up an availability trace: give preemption_trace_uri too, or leave it 1",
                )
            )
    else:  # the local backend injects preemptions; on another one they would silently never come
        for field, unset in LOCAL_ONLY_PARAMS.items():
            if values[field] != unset:
                errors.append(
                    InvalidRequestError(
                        field,
                        _short(values[field]),
                        f"only the local backend injects preemptions (backend={backend})",
                        ["local"],
                    )
                )
    return errors


def _check_catalog(values: Mapping[str, Any], catalog: Catalog) -> list[InvalidRequestError]:
    errors = []
    for name in ("regions", "exclude_regions"):
        bad_regions = [r for r in values[name] if r not in catalog.regions]
        if bad_regions:
            errors.append(InvalidRequestError(name, bad_regions, "not in the catalog", catalog.regions))
    allowed = set(values["regions"] or catalog.regions) - set(values["exclude_regions"])
    if not allowed:
        errors.append(
            InvalidRequestError(
                "exclude_regions",
                values["exclude_regions"],
                "excludes every region the run may use"
                + (f" (regions={list(values['regions'])})" if values["regions"] else ""),
            )
        )
    if values["gpu_type"] != ANY_GPU and values["gpu_type"] not in catalog.gpu_types:
        errors.append(
            InvalidRequestError(
                "gpu_type", values["gpu_type"], "not in the catalog", (ANY_GPU, *catalog.gpu_types)
            )
        )
    return errors
