# Airflow 3.3 with SAILOR installed (extends the official image, as its compose docs recommend).
FROM apache/airflow:3.3.2-python3.11
USER airflow
COPY --chown=airflow:root requirements.txt /opt/sailor/requirements.txt
# torch first, pinned (CPU build), so the rest never pulls a different one.
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir -r /opt/sailor/requirements.txt
COPY --chown=airflow:root pyproject.toml README.md /opt/sailor/
COPY --chown=airflow:root sailor_tasks /opt/sailor/sailor_tasks
RUN pip install --no-cache-dir --no-deps -e /opt/sailor
