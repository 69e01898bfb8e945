"""storage.crc32c on files it has to read: the same checksum as google-crc32c's, whatever the chunking."""

import os

import google_crc32c
import pytest

from sailor_tasks import storage


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 3500])
def test_crc32c_of_a_local_file_matches_google_crc32c(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    expected = (google_crc32c.Checksum(data).hexdigest().decode(), size)
    assert storage.crc32c(str(path), chunk_bytes=1000) == expected  # several chunks, the last short
    assert storage.crc32c(f"file://{path}") == expected  # one chunk


def test_crc32c_of_a_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        storage.crc32c(str(tmp_path / "missing.bin"))


def test_crc32c_refuses_an_empty_chunk(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"data")
    with pytest.raises(ValueError, match="chunk_bytes 0"):
        storage.crc32c(str(path), chunk_bytes=0)
