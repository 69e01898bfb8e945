"""The built-in models on one GPU: training samples/s and GPU utilisation of SAILOR's own trainer step.

For each built-in model (``sailor_tasks.train.specs.MODEL_SPECS``) a ``Trainer`` on GPU 0 with the
device plan the workers use (``train.device.detect_device_plan``: cuda:0, bf16 autocast where the
GPU supports it, pinned-memory batch copies) runs ``--warmup`` steps, then ``--steps`` timed steps
of ``Trainer.train_step`` (forward, backward, clipping, AdamW, LR schedule; no checkpoints) over the
demo corpus, then as many of ``Trainer.run_step`` (the step as ``Trainer.train`` runs it: the same
plus the periodic log line, which reads the loss back, and the preemption check; no checkpoint
falls due). A thread samples the GPU's utilisation every 0.1 s during the timed steps
(``torch.cuda.utilization``, which needs pynvml, else ``nvidia-smi``).

Prints one JSON object as its last line: ``{"gpu": {"name", "bf16", "models": {model: {"samples_per_s",
"gpu_util_pct_mean", "loop_samples_per_s", "loop_gpu_util_pct_mean", "batch_size", "steps",
"params_m"}}, "util_source"}}``, or on a machine without a usable GPU ``{"gpu": null, "reason": "..."}``.

Run: .venv/bin/python bench/gpu_train.py [--steps 200] [--warmup 20] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the benchmark, or None when it can."""
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else " (a CPU-only build)")
        return f"no CUDA device visible to {build}"
    return None


def utilization_reader() -> tuple[Callable[[], float | None], str | None]:
    """A function reading GPU 0's utilisation in percent, and where it reads it from."""
    import torch

    try:
        torch.cuda.utilization(0)
        return (lambda: float(torch.cuda.utilization(0))), "torch.cuda.utilization (pynvml)"
    except Exception:  # noqa: BLE001 - no pynvml / NVML: try the command-line tool
        pass
    smi = shutil.which("nvidia-smi")
    if smi:

        def read() -> float | None:
            out = subprocess.run(
                [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "--id=0"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            try:
                return float(out.stdout.strip().splitlines()[0])
            except (IndexError, ValueError):
                return None

        if read() is not None:
            return read, "nvidia-smi"
    return (lambda: None), None


class Sampler(threading.Thread):
    def __init__(self, read: Callable[[], float | None], every_s: float = 0.1):
        super().__init__(daemon=True)
        self.read, self.every_s, self.samples = read, every_s, []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            value = self.read()
            if value is not None:
                self.samples.append(value)


def bench_model(model: str, data_uri: str, out: str, args: argparse.Namespace, read) -> dict:
    import torch

    from sailor_tasks.train.config import TrainConfig
    from sailor_tasks.train.device import detect_device_plan, select_device
    from sailor_tasks.train.specs import MODEL_SPECS
    from sailor_tasks.train.trainer import Trainer

    plan = detect_device_plan(0, 1)
    select_device(plan)
    total = args.warmup + 2 * args.steps + 1  # never the last step: no final save while timed
    config = TrainConfig(
        run_id=f"gpu-{model}",
        model=model,
        data_uri=data_uri,
        output_uri=f"{out}/{model}",
        total_steps=total,
        checkpoint_every_steps=total,
        batch_size=args.batch_size,
        warmup_steps=max(1, total // 10),
    )
    trainer = Trainer(config, device_plan=plan)
    for _ in range(args.warmup):  # kernel selection, allocator, autocast caches
        trainer.train_step()
    torch.cuda.synchronize()
    sampler = Sampler(read)
    sampler.start()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = trainer.train_step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    assert torch.isfinite(loss), f"{model}: loss {loss.item()} after {trainer.step} steps"
    # The same number of steps as a run takes them (progress, log line, checkpoint and
    # preemption checks around each step; no checkpoint falls due).
    loop_sampler = Sampler(read)
    loop_sampler.start()
    start = time.perf_counter()
    for _ in range(args.steps):
        assert not trainer.run_step()
    torch.cuda.synchronize()
    loop_wall = time.perf_counter() - start
    loop_sampler.done.set()
    loop_sampler.join()
    return {
        "samples_per_s": round(args.steps * args.batch_size / wall, 1),
        "gpu_util_pct_mean": round(statistics.fmean(sampler.samples), 1) if sampler.samples else None,
        "util_samples": len(sampler.samples),
        "loop_samples_per_s": round(args.steps * args.batch_size / loop_wall, 1),
        "loop_gpu_util_pct_mean": round(statistics.fmean(loop_sampler.samples), 1)
        if loop_sampler.samples
        else None,
        "batch_size": args.batch_size,
        "seq_len": MODEL_SPECS[model].seq_len,
        "steps": args.steps,
        "params_m": round(sum(p.numel() for p in trainer.model.parameters()) / 1e6, 2),
        "device_plan": plan.reason,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per model first")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per step")
    parser.add_argument("--models", nargs="*", help="built-in models (default: all)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    reason = no_gpu_reason()
    if reason is not None:
        print(json.dumps({"gpu": None, "reason": reason}))
        return

    import torch

    from sailor_tasks.data.demo import write_demo_dataset
    from sailor_tasks.train.specs import MODEL_NAMES

    models = args.models or list(MODEL_NAMES)
    unknown = sorted(set(models) - set(MODEL_NAMES))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; valid: {', '.join(MODEL_NAMES)}")
    read, source = utilization_reader()
    root = tempfile.mkdtemp(prefix="sailor-bench-gpu-")
    try:
        data_uri = f"file://{root}/data"
        write_demo_dataset(data_uri)
        results = {m: bench_model(m, data_uri, f"file://{root}/runs", args, read) for m in models}
        for m, r in results.items():
            print(
                f"{m}: {r['samples_per_s']} samples/s, GPU {r['gpu_util_pct_mean']}% (train_step); "
                f"{r['loop_samples_per_s']} samples/s, GPU {r['loop_gpu_util_pct_mean']}% (run_step)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "gpu": {
                    "name": torch.cuda.get_device_name(0),
                    "bf16": torch.cuda.is_bf16_supported(),
                    "torch": torch.__version__,
                    "util_source": source,
                    "models": results,
                }
            }
        )
    )


if __name__ == "__main__":
    main()
