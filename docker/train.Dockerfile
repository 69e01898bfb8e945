# SAILOR training image: `python -m sailor_tasks.train` (or a run's own command) under torchrun, in
# GKE pods on GPU node pools. Build from the repository root:
#   docker build -f docker/train.Dockerfile -t REGION-docker.pkg.dev/PROJECT/sailor/sailor-train:0.1.0 .
# torch is PyTorch's CUDA wheel (CUDA runtime, cuDNN and NCCL bundled; GKE installs the NVIDIA
# driver on the nodes): the trainer uses nccl and the GPUs when they are there, gloo on the CPU
# otherwise (sailor_tasks/train/device.py). TORCH_CUDA picks the wheel's CUDA line: the nodes'
# driver must support it (see the PyTorch install matrix for the pinned torch version).
FROM python:3.11-slim

ARG TORCH_CUDA=cu128

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/sailor
COPY requirements.txt /opt/sailor/requirements.txt
# Only what the training entrypoint imports (tests/test_images.py checks these lists against the
# entrypoint's real imports), at the versions pinned in requirements.txt: torch from PyTorch's
# CUDA index (the build fails if the installed torch has no CUDA), the rest from PyPI.
RUN grep -E '^(torch)==' requirements.txt > torch-requirements.txt \
 && pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" -r torch-requirements.txt \
 && python -c "import sys, torch; sys.exit(None if torch.version.cuda else 'torch ' + torch.__version__ + ' has no CUDA')"
RUN grep -E '^(numpy|fsspec|gcsfs|google-crc32c|crc32c-rs|PyYAML)==' requirements.txt > train-requirements.txt \
 && pip install -r train-requirements.txt

COPY pyproject.toml README.md /opt/sailor/
COPY sailor_tasks /opt/sailor/sailor_tasks
RUN pip install --no-deps /opt/sailor \
 && useradd --uid 1000 --create-home sailor
USER sailor

# The pod's command (built by sailor_tasks.backends.gke.build_training_pods) is
# `python -m torch.distributed.run ... -m sailor_tasks.train --config gs://...`.
ENTRYPOINT []
CMD ["python", "-m", "sailor_tasks.train", "--help"]
