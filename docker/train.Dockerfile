# SAILOR training image: `python -m sailor_tasks.train` under torchrun, in GKE pods on GPU node pools.
# Build from the repository root:
#   docker build -f docker/train.Dockerfile -t REGION-docker.pkg.dev/PROJECT/sailor/sailor-train:0.1.0 .
# torch from PyPI (Linux x86_64 wheels bundle CUDA; GKE installs the NVIDIA driver on the nodes).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/sailor
COPY requirements.txt /opt/sailor/requirements.txt
# Only what the training entrypoint imports (tests/test_images.py checks this list against the
# entrypoint's real imports), at the versions pinned in requirements.txt.
RUN grep -E '^(torch|numpy|fsspec|gcsfs|google-crc32c|crc32c|PyYAML)==' requirements.txt > train-requirements.txt \
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
