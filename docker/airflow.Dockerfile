# Airflow 3.3 with SAILOR installed (extends the official image, as its compose docs recommend).
# Only what the services run: SAILOR with its airflow, gke and train extras at the versions pinned in
# requirements.txt (used as constraints, so nothing else from it is installed: no test or lint
# tools; tests/test_images.py checks this).
FROM apache/airflow:3.3.2-python3.11
USER airflow
COPY --chown=airflow:root requirements.txt /opt/sailor/requirements.txt
# Constraints take no extras: "apache-airflow[postgres]==3.3.2" becomes "apache-airflow==3.3.2".
RUN sed -E 's/\[[^]]*\]//' /opt/sailor/requirements.txt > /opt/sailor/constraints.txt
# torch first, pinned (CPU build), so the rest never pulls a different one.
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
COPY --chown=airflow:root pyproject.toml README.md /opt/sailor/
COPY --chown=airflow:root sailor_tasks /opt/sailor/sailor_tasks
# The examples a run's own command may start (SAILOR_COMMAND_ROOTS in docker-compose.yaml): an
# installed SAILOR allows no folder by default.
COPY --chown=airflow:root examples /opt/sailor/examples
RUN pip install --no-cache-dir -c /opt/sailor/constraints.txt "/opt/sailor[airflow,gke,train]"
