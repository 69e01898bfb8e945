"""One code path for every byte SAILOR reads or writes: fsspec over ``file://`` and ``gs://`` URIs.

``sailor://<bucket>/<path>`` names a SAILOR bucket (a region, or ``source``) independently of the
backend; ``resolve()`` turns it into a concrete URI with the bucket template from ``Settings``.
Paths stay ``str`` URIs throughout (``pathlib`` mangles ``gs://``).
"""

from __future__ import annotations

import base64
import glob
import json
import os
import posixpath
import stat
import uuid
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.core import strip_protocol, url_to_fs

from sailor_tasks import gcp_auth
from sailor_tasks.settings import Settings

SAILOR_SCHEME = "sailor://"
ALLOWED_SCHEMES = ("sailor", "file", "gs")
TMP_MARK = ".sailor-tmp-"
"""Infix of a local file still being written (``<name>.sailor-tmp-<hex>``), renamed when complete:
a file with it in its name is never data (``is_temporary``), and one a killed writer left is
removed by the next writer that owns the folder."""


def is_temporary(name: str) -> bool:
    """Whether a file name (or path) is a temporary of an unfinished local write."""
    return TMP_MARK in posixpath.basename(name.rstrip("/"))


def temporary_name(path: str) -> str:
    """A fresh temporary sibling of ``path`` (same folder, so the final rename is atomic)."""
    return f"{path}{TMP_MARK}{uuid.uuid4().hex[:8]}"


def fs_options(scheme: str) -> dict[str, Any]:
    """Keyword arguments for the filesystem of ``scheme``.

    ``file``: parent folders are created on write. ``gs``: credentials and project from
    ``gcp_auth.current()`` (an Airflow connection when the glue installed one), else gcsfs's own
    default (application default credentials). Against a local GCS API server
    (``STORAGE_EMULATOR_HOST``) requests are anonymous, so no credential is ever sent to it.
    """
    if scheme in ("", "file"):
        return {"auto_mkdir": True}
    if scheme != "gs":
        return {}
    creds = gcp_auth.current()
    # No listing cache: gcsfs never expires one and clears it only for this instance's own writes,
    # so a process that listed a folder once would miss what other processes (the workers) wrote.
    options: dict[str, Any] = {"use_listings_cache": False}
    if creds.project:
        options["project"] = creds.project
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        options["token"] = "anon"
    elif creds.credentials is not None:
        options["token"] = creds.credentials
    return options


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
    """(filesystem, path) for a concrete URI; local writes create parent folders.

    On ``gs://`` the path is the object's name as written: ``url_to_fs`` would read a name
    ending in ``#<digits>`` (or holding ``?generation=<digits>``) as an object version. A local
    path is taken as written too: ``url_to_fs`` would read ``::`` in a file's name as a chain of
    filesystems (``a::b.txt`` as ``a``)."""
    scheme = scheme_of(uri) or "file"
    if scheme == "gs":
        return fsspec.filesystem("gs", **fs_options(scheme)), strip_protocol(uri)
    if scheme == "file":
        fs = fsspec.filesystem("file", **fs_options(scheme))
        return fs, fs._strip_protocol(uri)
    return url_to_fs(uri, **fs_options(scheme))


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.exists(path)


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    return fs.cat_file(path)


def read_regular_file(uri: str, max_bytes: int) -> bytes:
    """Bytes of a regular file (or object) of at most ``max_bytes``.

    A FIFO, a device or a folder is refused before a byte is read: a local path is opened without
    blocking (a FIFO would wait for a writer) and checked on its descriptor, so a swap between the
    check and the read cannot slip a device in; the read itself stops after ``max_bytes + 1``.

    Raises:
        ValueError: not a regular file, or larger than ``max_bytes``.
        OSError: the file cannot be opened (missing, no permission).
    """
    fs, path = filesystem(uri)
    if scheme_of(uri) in ("", "file"):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{uri!r} is not a regular file")
            if st.st_size > max_bytes:
                raise ValueError(f"{uri!r} is {st.st_size} bytes, over the limit of {max_bytes} bytes")
            data = f.read(max_bytes + 1)
    else:
        meta = fs.info(path)
        if meta.get("type") != "file":
            raise ValueError(f"{uri!r} is not a file")
        if int(meta.get("size") or 0) > max_bytes:
            raise ValueError(f"{uri!r} is {meta['size']} bytes, over the limit of {max_bytes} bytes")
        with fs.open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew after the size check
        raise ValueError(f"{uri!r} is over the limit of {max_bytes} bytes")
    return data


def write_bytes(uri: str, data: bytes) -> None:
    """Write an object so readers never see a partial file.

    Object stores publish an object only when its upload completes; on a local filesystem we write
    a temporary sibling and rename it into place (atomic on POSIX).
    """
    fs, path = filesystem(uri)
    if scheme_of(uri) in ("", "file"):
        tmp = temporary_name(path)
        try:
            with fs.open(tmp, "wb") as f:
                f.write(data)
            fs.mv(tmp, path)
        except BaseException:
            if fs.exists(tmp):
                fs.rm(tmp)
            raise
    else:  # never rename on an object store (no atomic rename; the emulator answers moveTo with 501)
        with fs.open(path, "wb") as f:
            f.write(data)


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri))


def write_json(uri: str, data: Mapping[str, Any] | list[Any]) -> None:
    write_bytes(uri, json.dumps(data, indent=2, sort_keys=True).encode())


def _local(uri: str) -> bool:
    return scheme_of(uri) in ("", "file")


def remove(uri: str, recursive: bool = False) -> None:
    """Remove a file (or, ``recursive``, a folder and everything under it); nothing when absent.

    fsspec's ``rm`` reads the path as a glob pattern on an object store ('?', '*', '[...]' in a
    name would match other objects): one object goes by name (``rm_file``), and a folder's path
    is escaped (its contents are found by listing, so their names are taken as they are)."""
    fs, path = filesystem(uri)
    if not fs.exists(path):
        return
    if _local(uri):
        fs.rm(path, recursive=recursive)
    elif not recursive or fs.isfile(path):
        fs.rm_file(path)
    else:
        fs.rm(glob.escape(path) if glob.has_magic(path) else path, recursive=True)


def listdir(uri: str) -> list[str]:
    """Names (not paths) of a folder's direct children; empty when the folder does not exist."""
    fs, path = filesystem(uri)
    if not fs.exists(path):
        return []
    return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))


def info(uri: str) -> dict[str, Any]:
    fs, path = filesystem(uri)
    return fs.info(path)


def rename(src: str, dst: str) -> None:
    """Move an object or file. Local: an atomic rename. Object stores have no rename: a server-side
    copy then a delete (what gcsfs falls back to anyway, without its moveTo round trip)."""
    fs, spath = filesystem(src)
    _, dpath = filesystem(dst)
    if _local(src):
        fs.mv(spath, dpath)
    else:  # by name: copy and rm would read glob characters in it as a pattern
        fs.cp_file(spath, dpath)
        fs.rm_file(spath)


def copy_object(src: str, dst: str) -> None:
    """Server-side copy between two objects of the same object store (GCS rewrite; bytes never
    pass through this process, even between regions)."""
    if scheme_of(src) != scheme_of(dst) or scheme_of(src) in ("", "file"):
        raise ValueError(f"copy_object needs two object-store URIs of one scheme, got {src!r} and {dst!r}")
    fs, spath = filesystem(src)
    _, dpath = filesystem(dst)
    fs.cp_file(spath, dpath)  # by name: copy would read glob characters in it as a pattern


def stored_crc32c(uri: str) -> str | None:
    """Hex crc32c the object store recorded for ``uri`` (GCS object metadata), without reading the
    object; None on a local filesystem or when the store does not report one."""
    if scheme_of(uri) != "gs":
        return None
    value = info(uri).get("crc32c")
    return base64.b64decode(value).hex() if value else None


def crc32c(uri: str, chunk_bytes: int = 1024 * 1024) -> tuple[str, int]:
    """(hex crc32c, size) of a file: from GCS metadata where available, else computed by reading
    it into one reused buffer of ``chunk_bytes`` (no new bytes object per chunk)."""
    import crc32c_rs

    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes {chunk_bytes}: need >= 1")
    if scheme_of(uri) == "gs":
        meta = info(uri)
        if meta.get("crc32c"):
            return base64.b64decode(meta["crc32c"]).hex(), int(meta["size"])
    fs, path = filesystem(uri)
    crc, size = 0, 0
    with fs.open(path, "rb") as f:
        length = f.seek(0, os.SEEK_END)
        f.seek(0)
        # No larger than the file: a small file's check does not zero a whole chunk.
        view = memoryview(bytearray(max(1, min(chunk_bytes, length))))
        while n := f.readinto(view):
            crc = crc32c_rs.crc32c(view[:n], crc)
            size += n
    return f"{crc:08x}", size


def ensure_bucket(uri: str, location: str | None = None) -> bool:
    """Create the bucket (``gs://``) or folder (``file://``) holding ``uri`` unless it exists;
    True when it was created. A GCS bucket is created in ``location`` (a region keeps data next to
    the GPUs that read it)."""
    fs, path = filesystem(uri)
    if scheme_of(uri) in ("", "file"):
        if fs.exists(path):
            return False
        fs.makedirs(path, exist_ok=True)
        return True
    bucket = path.split("/", 1)[0]
    if fs.exists(bucket):
        return False
    try:
        fs.mkdir(bucket, location=location)
    except FileExistsError:  # created concurrently, or owned elsewhere (then the next write says so)
        return False
    return True
