"""A copy into gs:// whose source read breaks mid-file must not publish the partial object under its
final name (the copier's promise: an object store publishes an object only once its upload
completes). fsspec's buffered file commits what it has on ``__exit__`` even when the block raised."""

from __future__ import annotations

import os

import pytest

from sailor_tasks import storage
from sailor_tasks.data.copier import copy_dataset, seal
from sailor_tasks.data.manifest import read_manifest, verify
from tests.data.test_copier import copy_with_b_broken

pytestmark = pytest.mark.gcs


def test_an_interrupted_upload_never_appears_under_its_name_on_gcs(gcs, tmp_path, monkeypatch):
    src = f"file://{tmp_path}/src"
    storage.write_bytes(f"{src}/a.txt", b"alpha" * 1000)
    storage.write_bytes(f"{src}/sub/b.bin", os.urandom(50_000))
    seal(src)
    dst = f"{gcs()}/datasets/d"
    copy_with_b_broken(src, dst, monkeypatch)
    fs, path = storage.filesystem(f"{dst}/sub/b.bin")
    fs.invalidate_cache()
    # the 1,000 bytes read before the connection broke must not be an object named sub/b.bin
    assert not storage.exists(f"{dst}/sub/b.bin"), storage.info(f"{dst}/sub/b.bin")["size"]
    assert read_manifest(dst) is None
    again = copy_dataset(src, dst, max_workers=1)
    verify(dst, again.manifest)
