"""One code path for every byte SAILOR reads or writes: fsspec over ``file://`` and ``gs://`` URIs.

``sailor://<bucket>/<path>`` names a SAILOR bucket (a region, or ``source``) independently of the
backend; ``resolve()`` turns it into a concrete URI with the bucket template from ``Settings``.
Paths stay ``str`` URIs throughout (``pathlib`` mangles ``gs://``).
"""

from __future__ import annotations

import json
import posixpath
import uuid
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from sailor_tasks.settings import Settings

SAILOR_SCHEME = "sailor://"
ALLOWED_SCHEMES = ("sailor", "file", "gs")


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else ""


def resolve(uri: str, settings: Settings) -> str:
    """Turn ``sailor://bucket/path`` into the bucket's concrete URI; other URIs pass through."""
    if uri.startswith(SAILOR_SCHEME):
        bucket, _, rest = uri[len(SAILOR_SCHEME) :].partition("/")
        root = settings.bucket_uri(bucket)
        return f"{root}/{rest}".rstrip("/") if rest else root
    return uri


def join(uri: str, *parts: str) -> str:
    return posixpath.join(uri.rstrip("/"), *parts)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path) for a concrete URI; local writes create parent folders."""
    scheme = scheme_of(uri) or "file"
    kwargs: dict[str, Any] = {"auto_mkdir": True} if scheme == "file" else {}
    return url_to_fs(uri, **kwargs)


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.exists(path)


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    return fs.cat_file(path)


def write_bytes(uri: str, data: bytes) -> None:
    """Write an object so readers never see a partial file.

    Object stores publish an object only when its upload completes; on a local filesystem we write
    a temporary sibling and rename it into place (atomic on POSIX).
    """
    fs, path = filesystem(uri)
    if scheme_of(uri) in ("", "file"):
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, path)
    else:
        with fs.open(path, "wb") as f:
            f.write(data)


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri))


def write_json(uri: str, data: Mapping[str, Any] | list[Any]) -> None:
    write_bytes(uri, json.dumps(data, indent=2, sort_keys=True).encode())


def remove(uri: str, recursive: bool = False) -> None:
    fs, path = filesystem(uri)
    if fs.exists(path):
        fs.rm(path, recursive=recursive)


def listdir(uri: str) -> list[str]:
    """Names (not paths) of a folder's direct children; empty when the folder does not exist."""
    fs, path = filesystem(uri)
    if not fs.exists(path):
        return []
    return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))
