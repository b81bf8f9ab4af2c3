"""Headless Chromium for the browser tests (the report page, the docs site): found, installed when missing and
we are root with apt-get (Debian: `apt-get install chromium chromium-driver`), else the test is skipped with the
reason. `make browser` installs the same packages. The `browser` fixture (tests/conftest.py) yields a driver."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


def _browser_binaries() -> tuple[str, str] | None:
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (chrome, driver) if chrome and driver else None


def _install_chromium() -> str:
    """apt-get install chromium chromium-driver (Debian) as root; returns why it could not, or ""."""
    if os.environ.get("ARITHMECH_NO_BROWSER_INSTALL"):
        return "ARITHMECH_NO_BROWSER_INSTALL is set"
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return "not root on a machine with apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"]
    for commands in ([install], [["apt-get", "update"], install]):
        try:
            done = [subprocess.run(c, env=env, capture_output=True, text=True, timeout=900) for c in commands]
        except (OSError, subprocess.SubprocessError) as err:
            return f"apt-get failed ({err})"
        if done[-1].returncode == 0:
            return ""
    return f"apt-get install failed: {(done[-1].stderr.strip().splitlines() or ['?'])[-1]}"


def chrome_driver() -> Iterator[Any]:
    """A headless Chromium driver (1200 x 900), quit afterwards; skips the test when it cannot be had."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    if _browser_binaries() is None:
        why = _install_chromium()
        if _browser_binaries() is None:
            pytest.skip(f"Chromium and chromedriver are not installed and could not be installed: {why or '?'}")
    chrome, driver_path = _browser_binaries()  # type: ignore[misc]
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()
