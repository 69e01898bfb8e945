from __future__ import annotations

import os

import pytest

from sailor_tasks import storage
from sailor_tasks.data.copier import copy_dataset, seal
from sailor_tasks.data.manifest import MANIFEST_NAME, read_manifest, verify
from sailor_tasks.errors import DataIntegrityError


@pytest.fixture
def src(tmp_path):
    root = f"file://{tmp_path}/src"
    storage.write_bytes(f"{root}/a.txt", b"alpha" * 1000)
    storage.write_bytes(f"{root}/sub/b.bin", os.urandom(50_000))
    seal(root)
    return root


def test_copy_writes_files_and_matching_manifest_last(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    result = copy_dataset(src, dst)
    assert [f.path for f in result.manifest.files] == ["a.txt", "sub/b.bin"]
    assert read_manifest(dst).files == read_manifest(src).files
    verify(dst, read_manifest(dst))
    assert result.bytes_copied == 5000 + 50_000


def test_second_copy_is_a_no_op_and_partial_copy_resumes(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    assert copy_dataset(src, dst).bytes_copied == 0
    storage.remove(f"{dst}/{MANIFEST_NAME}")  # as if killed before the manifest was written
    storage.remove(f"{dst}/sub/b.bin")
    again = copy_dataset(src, dst)
    assert again.bytes_skipped == 5000 and again.bytes_copied == 50_000


def test_incomplete_copy_has_no_manifest(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    storage.write_bytes(f"{dst}/a.txt", b"alpha")
    assert read_manifest(dst) is None


def test_source_that_changed_since_sealing_is_rejected(src, tmp_path):
    storage.write_bytes(f"{src}/a.txt", b"tampered")
    with pytest.raises(DataIntegrityError, match="a.txt"):
        copy_dataset(src, f"file://{tmp_path}/dst")


def test_verify_detects_a_flipped_byte(src, tmp_path):
    dst = f"file://{tmp_path}/dst"
    copy_dataset(src, dst)
    path = tmp_path / "dst" / "sub" / "b.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataIntegrityError, match="b.bin"):
        verify(dst, read_manifest(dst))
