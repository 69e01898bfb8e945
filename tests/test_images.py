"""The training image installs every third-party package the training entrypoint imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distributions, requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OPTIONAL_IMPORTS = {
    "dill": "torch imports it when installed (datapipe pickling), works without",
    "tqdm": "torch imports it when installed (hub progress bars), works without",
    "chardet": "requests prefers it when installed, else charset-normalizer (a dependency)",
    "grpcio-status": "google-api-core imports it when installed (gRPC error details); gcsfs uses JSON",
    "pysocks": "urllib3 imports it when installed (SOCKS proxies; here via selenium), works without",
}
"""Packages the probe sees only because this venv has them; the image runs without them."""


def _train_image_packages() -> set[str]:
    text = (ROOT / "docker" / "train.Dockerfile").read_text()
    selections = re.findall(r"grep -E '\^\(([^)]*)\)==' requirements.txt", text)
    assert selections, "train.Dockerfile no longer selects its packages from requirements.txt"
    names = {name for selection in selections for name in selection.split("|")}
    pinned = {
        line.split("==")[0] for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line
    }
    assert names <= pinned, f"not pinned in requirements.txt: {names - pinned}"
    return {n.lower() for n in names}


def _imported_distributions() -> set[str]:
    """Distributions owning a file of a module the entrypoint imports (file-level: ``google`` is a
    namespace shared by many distributions)."""
    code = (
        "import sys, json, fsspec; import sailor_tasks.train.__main__, sailor_tasks.train.trainer; "
        # what the entrypoint imports lazily: gcsfs for gs:// URIs, crc32c for checksums
        "fsspec.get_filesystem_class('gs'); import crc32c_rs; "
        "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    files = {str(Path(f).resolve()) for f in json.loads(out.stdout.strip().splitlines()[-1]) if f}
    owners = set()
    for dist in distributions():
        for rel in dist.files or ():
            if rel.suffix == ".py" and str(Path(dist.locate_file(rel)).resolve()) in files:
                owners.add(dist.metadata["Name"].lower().replace("_", "-"))
                break
    owners.discard("sailor-tasks")
    return owners


def _closure(names: set[str]) -> set[str]:
    """``names`` and everything they depend on (what pip installs with them)."""
    closure, frontier = set(names), list(names)
    while frontier:
        try:
            reqs = requires(frontier.pop()) or ()
        except PackageNotFoundError:  # a dependency only for other Python versions or platforms
            continue
        for req in reqs:
            if "extra ==" in req:
                continue
            name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
            if name not in closure:
                closure.add(name)
                frontier.append(name)
    return closure


def test_training_image_covers_the_entrypoints_imports():
    needed = _imported_distributions()
    assert "torch" in needed and "gcsfs" in needed  # the probe sees real imports
    missing = needed - _closure(_train_image_packages()) - set(OPTIONAL_IMPORTS)
    assert not missing, (
        f"the training entrypoint imports packages the image does not install: {sorted(missing)}"
    )


TEST_TOOLS = {"pytest", "ruff", "deptry", "import-linter", "selenium", "gcp-storage-emulator"}
"""What the project's ``test`` extra installs for tests and lint: never in a service image."""


def _airflow_image_install() -> tuple[set[str], str]:
    """(extras, constraints source) of the Airflow image's one ``pip install`` of SAILOR."""
    text = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    assert not re.search(r"pip install[^\n]*\s-r\s", text), "the Airflow image installs a requirements file"
    installs = re.findall(r'pip install[^\n]*-c (\S+) "/opt/sailor\[([^\]]*)\]"', text)
    assert len(installs) == 1, "the Airflow image no longer installs SAILOR with constraints and extras"
    constraints, extras = installs[0]
    return set(extras.split(",")), constraints


def _project_requirements(extras: set[str]) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return {re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def test_the_airflow_image_installs_no_test_tools():
    extras, constraints = _airflow_image_install()
    assert "test" not in extras and {"airflow", "train"} <= extras
    installed = _closure(_project_requirements(extras))
    assert "apache-airflow" in installed and "torch" in installed  # the closure sees real packages
    assert installed & TEST_TOOLS == set(), sorted(installed & TEST_TOOLS)
    # the constraints are requirements.txt without extras (pip refuses extras in constraints)
    text = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    assert re.search(
        rf"sed -E 's/\\\[\[\^\]\]\*\\\]//' /opt/sailor/requirements.txt > {re.escape(constraints)}", text
    )


def test_the_test_tools_list_is_the_test_extra():
    assert (
        _project_requirements({"test"}) - _project_requirements(set()) - {"cryptography", "psycopg2-binary"}
        == TEST_TOOLS
    )


def test_the_gcs_emulator_image_installs_the_pinned_emulator_only():
    text = (ROOT / "docker" / "gcs-emulator.Dockerfile").read_text()
    assert re.search(r"grep -E '\^gcp-storage-emulator==' /tmp/requirements.txt", text)
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pinned = [line for line in lines if line.startswith("gcp-storage-emulator==")]
    assert len(pinned) == 1


def test_training_image_installs_torchs_cuda_wheel():
    """torch comes from PyTorch's CUDA index (a CUDA line, not ``cpu``), pinned by requirements.txt,
    and the build stops when the installed torch has no CUDA."""
    text = (ROOT / "docker" / "train.Dockerfile").read_text()
    cuda = re.search(r"^ARG TORCH_CUDA=(\S+)$", text, re.M)
    assert cuda and re.fullmatch(r"cu1\d{2}", cuda.group(1)), "TORCH_CUDA must name a CUDA wheel line (cuNNN)"
    install = re.search(r"grep -E '\^\(torch\)==' requirements.txt > (\S+)[^\n]*\n\s*&& pip install ([^\n]*)", text)
    assert install, "torch is not installed on its own from requirements.txt's pin"
    assert '--index-url "https://download.pytorch.org/whl/${TORCH_CUDA}"' in install.group(2)
    assert f"-r {install.group(1)}" in install.group(2)
    assert "torch.version.cuda" in text  # the build checks the wheel it got
