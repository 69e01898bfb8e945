"""``make airflow`` serves the UI (admin/admin) on the loopback interface only."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_airflow_binds_the_api_server_to_localhost():
    out = subprocess.run(
        ["make", "-n", "-W", ".airflow/.migrated", "airflow"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (line,) = [ln for ln in out.splitlines() if "airflow standalone" in ln]
    assert "AIRFLOW__API__HOST=127.0.0.1" in line, line
