"""`autotune ui` in a real browser: the study's parent run lists its trials."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ._services import free_port
from .conftest import ROOT, run_cli

pytestmark = pytest.mark.browser
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOTS = ROOT / "tests" / "screenshots"


def _browser():
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip("needs Chromium and ChromeDriver: apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow  # 2 minutes: a study, mlflow ui and Chromium
def test_the_ui_shows_the_study_run_with_its_trials_nested(tmp_path):
    browser = _browser()
    try:
        result = run_cli("start", "study", "quickstart", "--n-trials", "2",
                         "--max-trial-seconds", "10", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        port = free_port()
        ui = subprocess.Popen([sys.executable, "-m", "autotune", "ui", "--tracking-uri",
                               str(tmp_path / "mlruns"), "--port", str(port)],
                              cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        try:
            line = ui.stdout.readline()
            url = re.search(r"http://127\.0\.0\.1:\d+/#/experiments/\d+/runs", line)
            assert url, line
            _check_page(browser, url.group(0))
        finally:
            ui.terminate()
            ui.wait(20)
    finally:
        browser.quit()


def _check_page(browser, url: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url)

    def link(name: str):  # a run's link in the runs table (not the breadcrumb's)
        return next((a for a in browser.find_elements(By.TAG_NAME, "a")
                     if (a.text == name or a.text.startswith(f"{name} "))
                     and "/runs/" in (a.get_attribute("href") or "")), None)

    parent = _wait(lambda: link("quickstart"), 60, "the study's parent run")
    cell = parent.find_element(By.XPATH, "./ancestor::*[@role='gridcell'][1]")
    cell.find_element(By.TAG_NAME, "button").click()          # expand the nested trials
    _wait(lambda: link("trial-0") and link("trial-1"), 30, "the trials under the parent run")
    # each trial's outcome reads in the runs table, in its name, without opening it
    names = [link(f"trial-{i}").text for i in (0, 1)]
    assert all(re.fullmatch(r"trial-\d+ (reached [\d.]+ s|censored \(\w+\)( after [\d.]+ s)?"
                            r"|failed \(\w+\))", n) for n in names), names
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / "mlflow_study_runs.png"
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
