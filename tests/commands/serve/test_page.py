"""porter serve's page at ``/``, in a real headless browser (Debian's Chromium, driven
by selenium through chromedriver): the token asked once, a job submitted through the
form, its progress and live preview, cancel, a finished video playing in the page,
its run record, a refusal shown with its problems."""

import os
import shutil
import time

import httpx
import pytest

from support import TINY_RECIPE
from support.serving import TOKEN, Server

# heavy: a browser beside a server whose jobs are held to the memory free now (its
# headroom check); at the suite's end, beside two grown workers, a job was refused for
# want of 1 GiB (a full run of the suite). Run alone, and early, the machine has room.
pytestmark = [pytest.mark.slow, pytest.mark.heavy]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium; skipped where it is not installed (`apt install chromium
    chromium-driver`), except in CI, whose run installs it."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are missing: .ci/run installs them")
        pytest.skip("needs Chromium and ChromeDriver (apt install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--window-size=1280,860",
                 f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def until(check, seconds=120, what="the page"):
    """``check()``'s first true value within ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {seconds} s")


def test_a_video_made_through_the_page(browser, tmp_path):
    from selenium.webdriver.common.by import By

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_RECIPE)
    server = Server(recipe, tmp_path / "out")
    page = browser
    find = page.find_element

    def job_row(number):
        """The page's row of job ``number`` (waited for: the page polls every second)."""
        return until(lambda: page.find_elements(
            By.CSS_SELECTOR, f'li.job[data-job="{number:06d}"]'), what=f"job {number}")[0]

    def submit(**fields):
        for key, value in fields.items():
            box = find(By.ID, f"f-{key}")
            box.clear()
            box.send_keys(str(value))
        find(By.ID, "submit").click()

    try:
        # the page and its files are open; their data is behind the token
        opened = httpx.get(server.url + "/")
        assert opened.status_code == 200 and "script-src 'self'" in \
            opened.headers["content-security-policy"]
        assert httpx.get(server.url + "/settings").status_code == 401
        icon = httpx.get(server.url + "/favicon.svg")
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        page.get(server.url + "/")
        until(lambda: find(By.ID, "token").is_displayed(), what="the token's form")
        assert not find(By.ID, "app").is_displayed()
        find(By.ID, "token-input").send_keys("wrong\n")
        until(lambda: "refused" in find(By.ID, "token-said").text, what="a wrong token")
        find(By.ID, "token-input").send_keys(TOKEN + "\n")
        until(lambda: find(By.ID, "app").is_displayed(), what="the form")
        # the recipe's values; a text-to-video model takes no file
        assert find(By.ID, "f-prompt").get_attribute("value") == "a cat"
        assert find(By.ID, "f-width").get_attribute("value") == "32"
        assert find(By.ID, "model").text == "tiny (wan)"
        assert find(By.ID, "files").find_elements(By.TAG_NAME, "input") == []
        # each setting says what it does
        assert "follows the prompt" in find(By.ID, "d-guidance_scale").text
        fps = server.client.get("/settings").json()["fps"]
        assert f"the video's length ({fps} a second)" == find(By.ID, "d-frames").text

        # a long job: progress and live previews while it denoises, then cancelled
        submit(prompt="a long fox", steps=400)
        until(lambda: "step" in job_row(1).text, what="the running job's step")
        preview = job_row(1).find_element(By.CSS_SELECTOR, "img.preview")
        until(lambda: page.execute_script("return arguments[0].naturalWidth", preview) > 0,
              what="the live preview")
        steps = [int(job_row(1).find_element(By.TAG_NAME, "progress")
                     .get_attribute("value"))]
        steps.append(until(lambda: int(job_row(1).find_element(By.TAG_NAME, "progress")
                                       .get_attribute("value")) > steps[0] and 1))
        job_row(1).find_element(By.CSS_SELECTOR, "button.cancel").click()
        until(lambda: job_row(1).get_attribute("data-status") == "cancelled",
              what="the cancelled job")
        cancelled = server.client.get("/jobs/000001").json()
        assert cancelled["status"] == "cancelled" and 0 < cancelled["step"] < 400
        assert cancelled["error"].startswith("cancelled at step")

        # a short one: done, its video plays in the page, its record a click away
        submit(prompt="a red fox", steps=4, seed=3)
        # one numbering: the line under the form and the list both say #2
        until(lambda: find(By.ID, "said").text == "Job #2 queued.", what="the job queued")
        assert job_row(2).find_element(By.TAG_NAME, "strong").text == "#2"
        until(lambda: job_row(2).get_attribute("data-status") == "done", what="the video")
        until(lambda: find(By.ID, "said").text == "", what="the queued line cleared")
        video = job_row(2).find_element(By.TAG_NAME, "video")
        # its play controls fit (a 32-pixel video is drawn at least 18em wide), and it
        # can be saved
        assert video.get_attribute("controls") is not None and video.size["width"] >= 250
        download = job_row(2).find_element(By.CSS_SELECTOR, "a.download")
        until(lambda: download.is_displayed(), what="the download link")
        assert download.get_attribute("href").startswith("blob:")
        assert download.get_attribute("download") == "porter-000002.mp4"
        until(lambda: page.execute_script("return arguments[0].readyState", video) >= 2,
              what="the video's frames")
        assert page.execute_script("return [arguments[0].videoWidth, "
                                   "arguments[0].videoHeight]", video) == [32, 32]
        page.execute_script("arguments[0].play()", video)
        until(lambda: page.execute_script("return arguments[0].currentTime", video) > 0,
              what="the video playing")
        page.save_screenshot(str(tmp_path / "page.png"))  # docs/serve-page.png
        job_row(2).find_element(By.CSS_SELECTOR, "button.record").click()
        record = job_row(2).find_element(By.CSS_SELECTOR, "pre.record")
        until(lambda: '"a red fox"' in record.text, what="the run record")
        # the job holds what the form changed; the recipe gives the rest
        assert server.client.get("/jobs/000002").json()["settings"] == {
            "prompt": "a red fox", "steps": 4, "seed": 3}

        # a refusal: validate's message and its problem under the form, nothing queued
        submit(frames=10)
        until(lambda: find(By.ID, "said").text, what="the refusal")
        assert "generate.frames" in find(By.ID, "problems").text
        assert len(server.client.get("/jobs").json()["jobs"]) == 2

        # a reload: the token is not asked again
        page.refresh()
        until(lambda: find(By.ID, "app").is_displayed(), what="the page again")
        assert not find(By.ID, "token").is_displayed()
        until(lambda: len(page.find_elements(By.CSS_SELECTOR, "li.job")) == 2,
              what="the jobs after a reload")
    finally:
        assert server.stop() == 0, server.output()


def test_a_running_job_plays_as_it_is_decoded(browser, tmp_path):
    """The page plays a job's stream (Media Source Extensions) before the job is done:
    the first time the video's clock moves, in the browser's clock, comes before the
    time the server says the job finished (one machine, one clock)."""
    from selenium.webdriver.common.by import By

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(TINY_RECIPE)
    server = Server(recipe, tmp_path / "out")
    page = browser
    try:
        page.get(server.url + "/")
        until(lambda: page.find_element(By.ID, "token").is_displayed(), what="the form")
        page.find_element(By.ID, "token-input").send_keys(TOKEN + "\n")
        until(lambda: page.find_element(By.ID, "app").is_displayed(), what="the page")
        # media events do not bubble: caught on their way down (capture)
        page.execute_script("""
            window.firstMoved = null;
            document.addEventListener("timeupdate", (event) => {
              if (window.firstMoved === null && event.target.currentTime > 0)
                window.firstMoved = Date.now() / 1000;
            }, true);""")
        # a long video of a small model: 31 latent frames, each decoded and sent on
        job = server.client.post("/jobs", json={"prompt": "a long fox", "frames": 121,
                                                "height": 64, "width": 64,
                                                "steps": 2}).json()
        assert job.get("stream") == f"/jobs/{job.get('id')}/stream", job
        moved = until(lambda: page.execute_script("return window.firstMoved"),
                      what="the video playing")
        page.save_screenshot(str(tmp_path / "stream.png"))  # docs/serve-stream.png
        done = server.wait(job["id"])
        assert done["status"] == "done", done
        record = server.client.get(done["record"]).json()["timings"]
        print(f"played {done['finished'] - moved:.2f} s before the job finished; stream "
              f"{record['stream']}, decode {record['decode_s']} s")
        assert moved < done["finished"], (
            f"played {moved - done['finished']:.2f} s after the job finished; "
            f"stream {record['stream']}, decode {record['decode_s']} s")
        video = page.find_element(By.CSS_SELECTOR, f'li.job[data-job="{job["id"]}"] video')
        # then the finished video in its place, to keep
        until(lambda: page.find_element(By.CSS_SELECTOR, "a.download").is_displayed(),
              what="the finished video")
        assert page.execute_script("return arguments[0].videoWidth", video) == 64
    finally:
        assert server.stop() == 0, server.output()
