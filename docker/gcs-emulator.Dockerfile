# The local GCS API server the compose file's buckets live on (gcp-storage-emulator), at the version
# pinned in requirements.txt.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.txt /tmp/requirements.txt
RUN grep -E '^gcp-storage-emulator==' /tmp/requirements.txt > /tmp/emulator.txt \
 && pip install -r /tmp/emulator.txt \
 && useradd --uid 1000 --create-home emulator \
 && mkdir -p /data && chown emulator /data
USER emulator
EXPOSE 9023
CMD ["gcp-storage-emulator", "start", "--host", "0.0.0.0", "--port", "9023"]
