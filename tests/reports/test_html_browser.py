"""The HTML report and the scoreboard in a real browser: Debian's chromium, headless, driven
by selenium through /usr/bin/chromedriver. Opens a report with a failure from a file://
URL, sees the summary grid and the failure, filters, expands a section, follows a link
into a closed section and saves screenshots (to tmp_path; also to the folder in
GRADVERIFY_SCREENSHOT_DIR where set, as report.png and board.png). Skipped, saying what is
missing, without chromium, chromedriver or selenium (.ci/run installs Debian's)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from reports import Result, render_html, render_json
from reports.scoreboard import merge, read_results, render_board

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900")

pytestmark = pytest.mark.skipif(
    not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
    reason=f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}); "
           ".ci/run installs them")


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver",
                                    reason="needs selenium (the test extra)")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="gradverify-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def case(op, dtype, status="pass", message="", err=3e-7):
    metrics = {"checked": 12, "max_abs_err": err, "max_rel_err": 2 * err}
    if status == "fail":
        metrics["repro"] = f"gradcheck --op {op} -k '{op}(type={dtype},x=[3,4])'"
    return Result("gradcheck", f"{op}(type={dtype},x=[3,4])", status, metrics, message,
                  {"op": op, "backend": "cpu", "dtype": dtype, "mode": "full"})


def results() -> list[Result]:
    rows = [case(op, dtype) for op in ("abs", "relu", "softmax", "conv_2d")
            for dtype in ("f16", "bf16", "f32", "f64")]
    rows[5] = case("relu", "bf16", "fail", "numerical: backprop of x is off (3/12 "
                   "elements), worst x[0, 2]: num 1.25, bp 1.2625", err=0.0125)
    rows.append(case("argmax", "f32", "skip", "no gradient: integer output"))
    return rows


def keep(driver, tmp_path, name):
    path = tmp_path / name
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 1000
    folder = os.environ.get("GRADVERIFY_SCREENSHOT_DIR")
    if folder:
        shutil.copy(path, os.path.join(folder, name))


def no_script_errors(driver):
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_report_in_a_browser_filters_expands_and_shows_the_failure(browser, tmp_path):
    from selenium.webdriver.common.by import By
    page = tmp_path / "report.html"
    page.write_text(render_html(results(), "gradcheck report"))
    browser.get(page.as_uri())
    grid = browser.find_element(By.CSS_SELECTOR, "table.grid")
    assert grid.is_displayed() and "relu" in grid.text
    assert browser.find_element(By.CSS_SELECTOR, "table.grid td.w-fail").is_displayed()
    failures = browser.find_element(By.ID, "failures")
    assert "relu(type=bf16,x=[3,4])" in failures.text and "FAIL" in failures.text
    assert "gradcheck --op relu" in failures.text
    shown = browser.find_element(By.ID, "shown")
    assert shown.text == "17 of 17 rows shown"

    # a section: closed when it all passed, open when it failed; a click expands it
    abs_section = browser.find_element(By.ID, "g0")
    assert abs_section.get_attribute("open") is None
    assert browser.find_element(By.ID, "g1").get_attribute("open") == "true"
    abs_section.find_element(By.TAG_NAME, "summary").click()
    assert abs_section.get_attribute("open") == "true"
    assert browser.find_element(By.ID, "r0").is_displayed()

    # a row's other columns open under it
    browser.find_element(By.ID, "r0").click()
    detail = browser.find_element(By.CSS_SELECTOR, "tr.detail")
    assert "backend" in detail.text and "cpu" in detail.text

    # the filter: rows and sections that do not match hide
    box = browser.find_element(By.ID, "filter")
    box.send_keys("f32")
    browser.implicitly_wait(0)
    for _ in range(50):
        if shown.text != "17 of 17 rows shown":
            break
        browser.execute_script("return new Promise(r => setTimeout(r, 50))")
    assert shown.text == "5 of 17 rows shown"
    assert not browser.find_element(By.ID, "r1").is_displayed()     # abs f16 hidden
    assert browser.find_element(By.ID, "r2").is_displayed()         # abs f32 shown
    box.clear()
    box.send_keys("backprop")
    for _ in range(50):
        if shown.text == "1 of 17 rows shown":
            break
        browser.execute_script("return new Promise(r => setTimeout(r, 50))")
    assert shown.text == "1 of 17 rows shown"
    assert not browser.find_element(By.ID, "g0").is_displayed()     # abs: no match
    assert browser.find_element(By.ID, "r5").is_displayed()
    browser.execute_script("window.scrollTo(0, 0)")
    keep(browser, tmp_path, "report.png")

    # the status selector, then a link into a closed, filtered-out section
    box.clear()
    browser.execute_script("var s = document.getElementById('status'); s.value = 'skip';"
                           "s.dispatchEvent(new Event('change'));")
    assert shown.text == "1 of 17 rows shown"
    assert not browser.find_element(By.ID, "g2").is_displayed()     # softmax: no skip
    browser.execute_script("document.getElementById('close-all').click();"
                           "location.hash = '#r9';")             # softmax bf16
    for _ in range(50):
        if shown.text == "17 of 17 rows shown":
            break
        browser.execute_script("return new Promise(r => setTimeout(r, 50))")
    assert shown.text == "17 of 17 rows shown"                       # the filter let go
    assert browser.find_element(By.ID, "g2").get_attribute("open") == "true"
    assert browser.find_element(By.ID, "r9").is_displayed()
    no_script_errors(browser)


def test_scoreboard_in_a_browser(browser, tmp_path):
    from selenium.webdriver.common.by import By
    ours, theirs = results(), [case(r.labels["op"], r.labels["dtype"]) for r in results()]
    theirs[-1] = case("argmax", "f32", "crash", "crash: worker killed by SIGSEGV")
    files = []
    for name, rows, engine in (("ours.json", ours, "engine 0.1.0 (cpu backend)"),
                               ("ggml.json", theirs, "ggml 0.20.2 (CPU)")):
        path = tmp_path / name
        path.write_text(render_json(rows, "gradcheck", {"engine": engine}))
        files.append(read_results(path))
    page = tmp_path / "board.html"
    page.write_text(render_board(merge(files), files, "html"))
    browser.get(page.as_uri())
    grid = browser.find_element(By.CSS_SELECTOR, "table.grid")
    assert grid.text.splitlines()[0].split() == ["op", "engine", "ggml"]
    assert browser.find_element(By.CSS_SELECTOR, "table.grid td.w-crash").is_displayed()
    failures = browser.find_element(By.ID, "failures").text
    assert "ggml" in failures and "CRASH" in failures and "FAIL" in failures
    link = browser.find_element(By.CSS_SELECTOR, "#failures a")
    link.click()
    target = browser.find_element(By.ID, link.get_attribute("href").split("#")[1])
    assert target.is_displayed()
    browser.execute_script("window.scrollTo(0, 0)")
    keep(browser, tmp_path, "board.png")
    no_script_errors(browser)
