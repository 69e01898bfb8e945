"""Turn a run's params (Airflow conf, CLI JSON) into a validated ``JobRequest``, or explain why not.

Checks, in order, all reported together: unknown params; each param against its JSON schema
(``params.train_param_schemas``); cross-field rules; then the catalog (regions, GPU types, and a
price cap that no offer meets, naming the cheapest offer). Nothing here has side effects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jsonschema

from sailor_tasks.catalog import Catalog
from sailor_tasks.errors import InvalidRequestError, InvalidRequestErrors
from sailor_tasks.model import ANY_GPU, JobRequest
from sailor_tasks.params import train_param_schemas
from sailor_tasks.settings import SOURCE_BUCKET

_NULL_MEANS_EMPTY: dict[str, Any] = {
    "exclude_regions": [],
    "data_residency": [],
    "inject_preemptions": [],
    "inject_kills": [],
    "preemption_trace_uri": "",
}
"""Optional params whose null (an empty field in the trigger form) means the empty value."""

_NON_SCHEMA_KEYS = ("default", "description", "title", "section", "values_display")


def _schema_of(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in _NON_SCHEMA_KEYS}


_SHOWN_CHARS = 80
"""Longest value echoed back in an error message (hostile input may be megabytes)."""


def _short(value: Any) -> Any:
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= _SHOWN_CHARS:
        return value
    return text[: _SHOWN_CHARS - 3] + f"... ({len(text)} chars)"


def _check_schema(name: str, value: Any, spec: Mapping[str, Any]) -> InvalidRequestError | None:
    try:
        jsonschema.validate(value, _schema_of(spec))
    except jsonschema.ValidationError as exc:
        valid = spec.get("enum") or spec.get("items", {}).get("enum")
        shown = _short(value)
        return InvalidRequestError(
            name, shown, exc.message if len(exc.message) < 300 else exc.message[:297] + "...", valid
        )
    return None


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


def check_file_roots(uri: str, roots: tuple[str, ...]) -> InvalidRequestError | None:
    """A ``file://`` dataset must lie inside one of ``roots`` (the state folder and configured data
    folders), so a run cannot copy arbitrary files of the machine (``file:///etc``) into a bucket."""
    if not uri.startswith("file://"):
        return None
    path = os.path.realpath(uri[len("file://") :])
    for root in roots:
        real = os.path.realpath(root)
        if path == real or path.startswith(real.rstrip("/") + "/"):
            return None
    return InvalidRequestError("dataset_uri", uri, "file:// datasets must lie inside a data folder", roots)


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
            errors.append(err)
    if errors:
        raise InvalidRequestErrors(errors)
    # Airflow's trigger form sends an untouched optional field as null; null means "none".
    for name, empty in _NULL_MEANS_EMPTY.items():
        if values[name] is None:
            values[name] = empty

    if values["checkpoint_every_steps"] > values["total_steps"]:
        errors.append(
            InvalidRequestError(
                "checkpoint_every_steps",
                values["checkpoint_every_steps"],
                f"must not exceed total_steps={values['total_steps']}",
            )
        )
    late = [s for s in (*values["inject_preemptions"], *values["inject_kills"]) if s >= values["total_steps"]]
    if late:
        errors.append(
            InvalidRequestError(
                "inject_preemptions" if set(late) & set(values["inject_preemptions"]) else "inject_kills",
                late,
                f"injection steps must be below total_steps={values['total_steps']}",
            )
        )
    regions = tuple(values["regions"])
    if catalog is not None:
        errors.extend(_check_catalog(values, catalog))
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
    )


def _check_catalog(values: Mapping[str, Any], catalog: Catalog) -> list[InvalidRequestError]:
    errors = []
    for name in ("regions", "exclude_regions"):
        bad_regions = [r for r in values[name] if r not in catalog.regions]
        if bad_regions:
            errors.append(InvalidRequestError(name, bad_regions, "not in the catalog", catalog.regions))
    if values["gpu_type"] != ANY_GPU and values["gpu_type"] not in catalog.gpu_types:
        errors.append(
            InvalidRequestError(
                "gpu_type", values["gpu_type"], "not in the catalog", (ANY_GPU, *catalog.gpu_types)
            )
        )
    return errors
