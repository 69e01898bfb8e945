"""Dataset copies on gs:// against a local GCS API server: serial vs parallel upload, streamed vs
server-side replication between region buckets, and the resume check (object-metadata crc32c vs
re-reading every byte). Prints one JSON object as its last line.

Run: .venv/bin/python bench/gcs_copy.py [--files 48] [--file-kb 512]

The emulator is a single Python process on this machine, so absolute MB/s are far below real GCS;
the ratios show what parallelism, server-side copies and metadata checks save in round trips.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=48)
    parser.add_argument("--file-kb", type=int, default=512)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()

    from sailor_tasks.testing.gcs_emulator import gcs_emulator

    with gcs_emulator() as url, tempfile.TemporaryDirectory() as tmp:
        os.environ["STORAGE_EMULATOR_HOST"] = url
        from sailor_tasks import storage
        from sailor_tasks.data.copier import copy_dataset, seal
        from sailor_tasks.data.manifest import MANIFEST_NAME, read_manifest, verify

        src = f"file://{tmp}/src"
        for i in range(args.files):
            storage.write_bytes(f"{src}/part-{i:04d}.bin", os.urandom(args.file_kb * 1024))
        seal(src)
        mb = args.files * args.file_kb / 1024
        for bucket in ("bench-a", "bench-b", "bench-c", "bench-d"):
            storage.ensure_bucket(f"gs://{bucket}")

        def timed(fn) -> float:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        serial = timed(lambda: copy_dataset(src, "gs://bench-a/d", progress=None, max_workers=1))
        parallel = timed(lambda: copy_dataset(src, "gs://bench-b/d", progress=None, max_workers=args.workers))
        streamed = timed(
            lambda: copy_dataset("gs://bench-b/d", "gs://bench-c/d", progress=None, server_side=False)
        )
        server_side = timed(lambda: copy_dataset("gs://bench-b/d", "gs://bench-d/d", progress=None))
        # Resume after a kill just before the manifest: every object is already there.
        storage.remove(f"gs://bench-d/d/{MANIFEST_NAME}")
        resumed: list = []
        resume_check = timed(
            lambda: resumed.append(copy_dataset("gs://bench-b/d", "gs://bench-d/d", progress=None))
        )
        reread = timed(lambda: verify("gs://bench-d/d", read_manifest("gs://bench-d/d")))

    print(
        json.dumps(
            {
                "dataset_mb": round(mb, 1),
                "files": args.files,
                "upload_serial_mb_s": round(mb / serial, 1),
                "upload_parallel_mb_s": round(mb / parallel, 1),
                "parallel_speedup": round(serial / parallel, 2),
                "replicate_streamed_mb_s": round(mb / streamed, 1),
                "replicate_server_side_mb_s": round(mb / server_side, 1),
                "resume_check_s": round(resume_check, 3),
                "resume_bytes_copied": resumed[0].bytes_copied,
                "resume_bytes_skipped": resumed[0].bytes_skipped,
                # the target: a resume after the last object finds every one by its metadata
                "resume_target_met": resumed[0].bytes_copied == 0
                and resumed[0].bytes_skipped == args.files * args.file_kb * 1024,
                "sha256_reread_s": round(reread, 3),
                "workers": args.workers,
            }
        )
    )


if __name__ == "__main__":
    main()
