"""The explorer in a real headless Chromium (Selenium driving the system browser).

Needs ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` (Debian: ``apt-get install -y
chromium chromium-driver``) and Selenium (the test extra). In CI (env ``CI`` set) a missing
browser fails the run; locally the tests skip and say how to install one. With
``AKRELAY_UPDATE_SCREENSHOTS=1`` the screenshots are also written to ``docs/images/``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from akrelay.explorer.html import CSP
from tests.http.relay_harness import start_relay
from tests.knowql.kq_harness import Corpus

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = "install a browser: apt-get install -y chromium chromium-driver (and pip install -e '.[test]' for selenium)"
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
HOSTILE_TITLE = 'Disk <script>window.pwned=1</script> full <b>bold</b>'
HOSTILE_STATEMENT = "The disk <img src=x onerror=\"window.pwned=2\"> fills up at night."

pytestmark = pytest.mark.slow


def _browser_or_skip():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
    if missing:
        message = f"no headless browser ({', '.join(missing)} missing); {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def driver(tmp_path: Path):
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--ignore-certificate-errors", "--window-size=1200,1500", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.set_page_load_timeout(120)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def relay(tmp_path: Path):
    served = start_relay(tmp_path / "data", extra=["--write-rate", "0", "--read-rate", "0"])
    try:
        yield _publish(served)
    finally:
        served.stop()


def _publish(served):
    """Four events (the hostile capsule, one relating to it, two assessments); waits until they are readable."""
    corpus = Corpus()
    a = corpus.publish("alice", HOSTILE_TITLE, HOSTILE_STATEMENT, tags=("ops", "storage"))
    b = corpus.publish("bob", "Nightly backups fill the disk",
                       "The 02:00 backup job writes its archive to the data volume before rotating.",
                       relations=(("supports", a["hash"]),), tags=("ops",))
    events = [a, b, corpus.assess("carol", a["hash"], "supports", "Seen on two hosts."),
              corpus.assess("dave", b["hash"], "supports", "Matches our logs.")]
    with httpx.Client(verify=served.ssl_context(), timeout=10) as client:
        for env in events:
            r = client.post(served.origin + "/v1/knowledge/events", content=json.dumps(env),
                            headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
        # Until the search index and the KIP nexus cover all four events (a turn's snapshot is the lower).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            turn = client.post(served.origin + "/query", json={"ask": "disk", "scope": ["knowledge"],
                                                               "retrieval_only": True}).json()
            if turn.get("akrelay", {}).get("snapshot_seq", 0) >= len(events):
                break
            time.sleep(0.2)
    return served, a["hash"], b["hash"]


def _shot(driver, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1200, min(4000, max(900, int(height) + 20)))  # the whole page in one image
    driver.save_screenshot(str(path))
    driver.set_window_size(1200, 1500)
    assert path.stat().st_size > 1000
    if os.environ.get("AKRELAY_UPDATE_SCREENSHOTS"):
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, IMAGES / name)


def _wait(driver, condition, timeout: float = 120):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def test_browse_follow_relation_and_escaping(driver, relay, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    served, a, b = relay
    driver.get(served.origin + "/")
    assert driver.current_url.endswith("/explorer/")
    driver.find_element(By.CSS_SELECTOR, f'a[href="/explorer/capsules/{b}"]').click()
    _wait(driver, lambda d: d.current_url.endswith(b))
    # Follow b's relation to a; a's page links back to b (both directions).
    driver.find_element(By.CSS_SELECTOR, "a.relation").click()
    _wait(driver, lambda d: d.current_url.endswith(a))
    assert driver.find_element(By.TAG_NAME, "h1").text == HOSTILE_TITLE
    assert HOSTILE_STATEMENT in driver.find_element(By.TAG_NAME, "main").text
    assert driver.execute_script("return window.pwned === undefined")
    assert driver.find_elements(By.CSS_SELECTOR, "main img, main script, main b") == []
    assert driver.find_elements(By.CSS_SELECTOR, f'a.relation[href="/explorer/capsules/{b}"]')
    beliefs = driver.find_elements(By.CSS_SELECTOR, "section.belief h3")
    assert len(beliefs) == 3 and all("accepted" in h.text for h in beliefs)
    _shot(driver, tmp_path, "explorer-capsule.png")
    # Every other page opens and shows its content.
    driver.find_element(By.CSS_SELECTOR, "dd a[href^='/explorer/agents/']").click()
    _wait(driver, lambda d: "/explorer/agents/" in d.current_url)
    assert driver.find_element(By.CSS_SELECTOR, f'a[href="/explorer/capsules/{a}"]')
    driver.get(served.origin + "/explorer/search?q=backup")
    assert driver.find_element(By.CSS_SELECTOR, f'a[href="/explorer/capsules/{b}"]')
    driver.get(served.origin + "/explorer/status")
    assert "checkpoint" in driver.find_element(By.TAG_NAME, "main").text
    with httpx.Client(verify=served.ssl_context()) as client:
        for path in ("/explorer/", f"/explorer/capsules/{a}", "/explorer/ask", "/explorer/static/ask.js"):
            assert client.get(served.origin + path).headers["content-security-policy"] == CSP


def test_ask_streams_an_answer_with_citations(driver, relay, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    served, a, b = relay
    driver.get(served.origin + "/explorer/ask")
    box = driver.find_element(By.CSS_SELECTOR, "#ask-form textarea")
    box.send_keys("Why does the disk fill up at night?")
    driver.find_element(By.CSS_SELECTOR, "#ask-form button").click()
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-answered") == "true")
    assert driver.current_url.endswith("/explorer/ask")  # answered in place: the script streamed it
    answer = driver.find_element(By.ID, "answer").text
    assert "Findings" in answer and "[1]" in answer
    # The lead answer (the fact with its citation and belief) sits above the evidence.
    lead = driver.find_element(By.ID, "lead-answer")
    assert "fills up at night" in lead.text and "[1]" in lead.text and "Findings" not in lead.text
    assert lead.location["y"] < driver.find_element(By.ID, "answer").location["y"]
    citations = driver.find_elements(By.CSS_SELECTOR, "#citations a.citation")
    hrefs = {c.get_attribute("href").rsplit("/", 1)[-1] for c in citations}
    assert {a, b} <= hrefs
    assert driver.find_elements(By.CSS_SELECTOR, "#citations .status-accepted")
    assert driver.execute_script("return window.pwned === undefined")
    _shot(driver, tmp_path, "explorer-ask.png")
    citations[0].click()
    _wait(driver, lambda d: "/explorer/capsules/" in d.current_url)
    assert driver.find_elements(By.CSS_SELECTOR, "section.belief")
