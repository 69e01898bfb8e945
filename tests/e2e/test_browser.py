"""Headless Chromium against the real Airflow UI: log in, open sailor_train's trigger form and the SAILOR
page, save screenshots under ``artifacts/ui/``, and check what a person would see."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, RUN_TIMEOUT_S

pytestmark = pytest.mark.e2e

ARTIFACTS = ROOT / "artifacts" / "ui"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1500",
)
SECTIONS = ("Job", "Data", "Resources", "Market and cost", "Checkpointing", "Advanced")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    assert not missing, f"{missing} not installed: `make test` installs Debian's chromium and chromium-driver"
    profile = tempfile.mkdtemp(prefix="sailor-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def logged_in(stack, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 120)
    browser.get(f"{stack.url}/auth/login")
    wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("admin")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: "/auth/login" not in d.current_url)
    return browser


def _open_section(browser, wait, title: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    xpath = f"//button[.//*[normalize-space(text())='{title}'] or normalize-space(text())='{title}']"
    wait.until(ec.element_to_be_clickable((By.XPATH, xpath))).click()
    time.sleep(0.5)  # the accordion animates open


def test_trigger_form_shows_the_params_by_section(stack, logged_in):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser, wait = logged_in, WebDriverWait(logged_in, 120)
    browser.get(f"{stack.url}/dags/sailor_train")
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid=trigger-dag-button]"))).click()
    wait.until(ec.presence_of_element_located((By.XPATH, "//*[normalize-space(text())='Market and cost']")))

    seen = {}
    for title in (*[s for s in SECTIONS if s != "Resources"], "Resources"):  # end on Resources
        _open_section(browser, wait, title)
        seen[title] = browser.find_element(By.TAG_NAME, "body").text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "trigger_form.png"))

    expected = {
        "Job": ("Job name", "Team", "Model", "Total steps", "Seed"),
        "Data": ("Dataset URI",),
        "Resources": ("Workers", "GPU type", "Allowed regions", "us-central1"),
        "Market and cost": ("Market", "Max USD per hour"),
        "Checkpointing": ("Checkpoint every N steps",),
        "Advanced": ("Batch size per worker", "Learning rate", "Backend"),
    }
    for section, labels in expected.items():
        for label in labels:
            assert label in seen[section], f"{label!r} not shown under {section!r}"
    # The regions param is a multi-select of chips (one per allowed region), not a textarea.
    chips = browser.find_elements(By.XPATH, "//*[normalize-space(text())='europe-west4']")
    assert chips, "the regions multi-select shows its chosen regions"
    assert (ARTIFACTS / "trigger_form.png").stat().st_size > 10_000


def test_trigger_form_starts_a_run_with_typed_params(stack, client, logged_in):
    """Fill two fields, press Trigger: the run's conf carries typed values (int, list of regions)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser, wait = logged_in, WebDriverWait(logged_in, 120)
    browser.get(f"{stack.url}/dags/sailor_train")
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid=trigger-dag-button]"))).click()
    wait.until(ec.presence_of_element_located((By.XPATH, "//*[normalize-space(text())='Market and cost']")))
    for _ in range(3):  # the accordion may come back with another section open: open Job
        if [e for e in browser.find_elements(By.NAME, "element_job_name") if e.is_displayed()]:
            break
        _open_section(browser, wait, "Job")
    for name, value in (("element_job_name", "ui-form"), ("element_total_steps", "60")):
        field = wait.until(ec.visibility_of_element_located((By.NAME, name)))
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(value)
    time.sleep(0.5)
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid=trigger-dag-submit]"))).click()

    deadline = time.monotonic() + 120
    run = None
    while run is None and time.monotonic() < deadline:
        runs = client.request("GET", "/api/v2/dags/sailor_train/dagRuns", params={"limit": 100})["dag_runs"]
        run = next((r for r in runs if (r.get("conf") or {}).get("job_name") == "ui-form"), None)
        time.sleep(1)
    assert run is not None, "pressing Trigger created no run"
    conf = run["conf"]
    assert conf["total_steps"] == 60 and conf["num_workers"] == 2
    assert isinstance(conf["regions"], list) and "us-central1" in conf["regions"]
    assert client.wait("sailor_train", run["dag_run_id"], timeout_s=RUN_TIMEOUT_S) == "success"


def test_sailor_page_shows_the_regions(stack, logged_in):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser, wait = logged_in, WebDriverWait(logged_in, 120)
    browser.set_window_size(1400, 2600)
    try:
        browser.get(f"{stack.url}/plugin/sailor")
        frame = wait.until(ec.presence_of_element_located((By.TAG_NAME, "iframe")))
        browser.switch_to.frame(frame)
        regions = wait.until(ec.presence_of_element_located((By.ID, "regions"))).text
        text = browser.find_element(By.TAG_NAME, "body").text
        browser.switch_to.default_content()
        time.sleep(1)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "sailor_page.png"))
    finally:
        browser.set_window_size(1400, 1500)
    assert "us-central1" in regions and "europe-west4" in regions and "asia-east1" in regions
    for heading in ("Regions", "Live reservations", "Current assignment", "Recent placements"):
        assert heading in text
    assert "Recent preemptions and recoveries" in text and "Last rebalance report" in text
    assert (ARTIFACTS / "sailor_page.png").stat().st_size > 10_000
