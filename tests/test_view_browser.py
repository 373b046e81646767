"""``vfray view`` in a real browser (Debian's chromium driven by selenium): open a run made by
the scripted model, filter to the errored rollouts, open one, and see its conversation and its
error; see an episode where the infra-failed rollout has no advantage, and a second run compared
with the first; the main pages are saved as screenshots (under ``$VFRAY_ARTIFACTS_DIR`` when set,
as CI does, else under the test's tmp folder)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import vfray as vf
from vfray.endpoints.serving import serve_in_thread
from vfray.tasksets.arithmetic import ArithmeticTask, ArithmeticTaskset
from vfray.traces import table_to_traces, write_traces
from vfray.view import create_app

webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None, reason="needs chromium and chromedriver (apt)"
)


class Flaky(ArithmeticTask):
    def finalize(self, trace: vf.Trace, runtime: vf.Runtime) -> None:
        # One rollout of the group, so the episode shows the others' advantages next to it.
        if self.data.a % 3 == 0 and trace.rollout_index == 2:
            raise RuntimeError(f"checker for {self.data.a} is missing")


class FlakySums(vf.Taskset[Flaky]):
    def load(self) -> list[Flaky]:
        return [Flaky(t.data, key=t.key) for t in ArithmeticTaskset(num_tasks=8).load()]


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def click_and_load(driver: Any, element: Any) -> None:
    """Click a link or submit button and wait until the next page has replaced this one (read
    too early, an element of the old page goes stale under the test)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 30).until(expected_conditions.staleness_of(old))


def shots_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("VFRAY_ARTIFACTS_DIR") or tmp_path) / "view-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_filter_to_errored_rollouts_and_open_one_in_a_browser(
    tmp_path: Path, browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.wait import WebDriverWait

    driver: WebDriver = browser  # type: ignore[assignment]
    runs = []
    for accuracy in (0.6, 0.9):  # the second run is only for the comparison
        with vf.Farm(
            f"scripted:arithmetic?accuracy={accuracy}",
            harness="null",
            backend="local",
            output_dir=str(tmp_path / "outputs"),
            progress=False,
            sampling={"logprobs": True},
        ) as farm:
            runs.append(farm.run(FlakySums(), rollouts_per_task=3))
    result = runs[0]
    final = result.final_traces
    errored = sum(1 for ok in final.column("ok").to_pylist() if not ok)
    assert 0 < errored < final.num_rows
    shots = shots_dir(tmp_path)

    summary = result.summary()
    with serve_in_thread(create_app([r.run_dir for r in runs])) as url:
        driver.get(f"{url}/run/0")
        main = driver.find_element(By.TAG_NAME, "main").text
        assert "Counts" in main
        # The failed finalize is a TaskError: scored, but left out of the counted mean.
        counted = summary["reward_mean_counted"] != summary["reward_mean"]
        assert ("infra failures left out" in main) == counted
        assert "RuntimeError" in driver.find_element(By.ID, "errors").text
        driver.save_screenshot(str(shots / "summary.png"))

        driver.get(f"{url}/run/0/rollouts")
        Select(driver.find_element(By.NAME, "status")).select_by_value("error")
        click_and_load(driver, driver.find_element(By.ID, "apply"))
        count = driver.find_element(By.ID, "count").text
        assert count.startswith(f"{errored} rollouts match"), count
        driver.save_screenshot(str(shots / "rollouts-errored.png"))

        click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "a.open"))
        errors = driver.find_element(By.ID, "errors").text
        assert "RuntimeError" in errors and "finalize" in errors and "is missing" in errors
        conversation = driver.find_element(By.ID, "conversation").text
        assert "USER" in conversation and "What is" in conversation and "ASSISTANT" in conversation
        # Token ids and logprobs arrive on demand, fetched by the page's script.
        tokens = driver.find_element(By.CSS_SELECTOR, "details.tokens")
        tokens.find_element(By.TAG_NAME, "summary").click()
        slot = tokens.find_element(By.CLASS_NAME, "slot")
        driver.implicitly_wait(10)
        assert slot.find_element(By.CSS_SELECTOR, "table.tokens").text.startswith("#")
        driver.save_screenshot(str(shots / "rollout.png"))

        failed = [
            row["task_key"] for row in final.select(["task_key", "ok"]).to_pylist() if not row["ok"]
        ]
        driver.get(f"{url}/run/0/episode?task={quote(failed[0])}")
        lanes = driver.find_elements(By.CSS_SELECTOR, "div.lane")
        assert len(lanes) == 3
        # The infra-failed rollout keeps its reward but gets no advantage; the others do.
        assert "advantage \u2013" in lanes[2].text.replace("\n", " ")
        assert "TaskError" in lanes[2].text and "is missing" in lanes[2].text
        driver.save_screenshot(str(shots / "episode.png"))

        driver.get(f"{url}/compare?a=0&b=1")
        shared = driver.find_element(By.TAG_NAME, "main").text
        assert "tasks in both 8" in shared.replace("\n", " ")
        assert len(driver.find_elements(By.CSS_SELECTOR, "table.compare tbody tr")) == 8
        driver.save_screenshot(str(shots / "compare.png"))

        # The run goes on being written: the open page notices and offers a reload.
        driver.get(f"{url}/run/0")
        banner = driver.find_element(By.ID, "live-banner")
        assert not banner.is_displayed()
        more = [t.model_copy(update={"attempt": 1}) for t in table_to_traces(final.slice(0, 1))]
        write_traces(more, result.run_dir / "traces")
        WebDriverWait(driver, 30).until(lambda d: banner.is_displayed())
        click_and_load(driver, banner.find_element(By.TAG_NAME, "a"))
        WebDriverWait(driver, 30).until(
            lambda d: (
                f"attempts (with retries) {final.num_rows + 1}"
                in d.find_element(By.TAG_NAME, "main").text
            )
        )
    for name in ("summary", "rollouts-errored", "rollout", "episode", "compare"):
        assert (shots / f"{name}.png").stat().st_size > 10_000
