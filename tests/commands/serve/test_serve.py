"""porter serve: a real server process on loopback, a real HTTP client (httpx)."""

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from support import ROOT, TINY_RECIPE
from support.serving import TOKEN, Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "tiny.yaml"
    path.write_text(TINY_RECIPE + "output: {checkpoint_every: 5}\n")
    return path


def test_jobs_over_http_and_a_restart_mid_job(recipe, tmp_path):
    out = tmp_path / "out"
    server = Server(recipe, out)
    client = server.client
    try:
        refused = httpx.get(server.url + "/health")  # no token: the header to send
        assert refused.status_code == 401 and "Authorization: Bearer <token>" in \
            refused.json()["error"]
        # the scheme's case is free (RFC 9110); the token's is not
        assert httpx.get(server.url + "/health", headers={
            "Authorization": f"bearer {TOKEN}"}).status_code == 200
        assert httpx.get(server.url + "/health", headers={
            "Authorization": f"Bearer {TOKEN.upper()}x"}).status_code == 401
        schema = client.get("/openapi.json").json()
        body = schema["paths"]["/jobs"]["post"]["requestBody"]["content"]
        taken = set(body["application/json"]["schema"]["properties"])
        assert {"prompt", "seed", "frames", "pose_video"} <= taken
        assert not {"conditions", "reference_conditions", "latents"} & taken  # paths
        bad = client.post("/jobs", json={"prompt": "x", "latents": "/etc/passwd"})
        assert bad.status_code == 400 and "a request cannot set it" in bad.json()["error"]

        # malformed requests: 400 with validate's messages, nothing queued
        assert client.post("/jobs", content=b"{not json").status_code == 400
        assert client.post("/jobs", json=[1, 2]).status_code == 400
        twice = client.post("/jobs", content=b'{"prompt": "x", "seed": 1, "seed": 2}')
        assert twice.status_code == 400 and "names 'seed' twice" in twice.json()["error"]
        bad = client.post("/jobs", json={"prompt": "x", "framez": 9})
        assert bad.status_code == 400 and "did you mean 'frames'" in bad.json()["error"]
        # one line for a client to show, not the terminal's rendering
        assert bad.json()["error"].startswith("generate.framez: unknown key")
        assert "\n" not in bad.json()["error"] and "(hint: did you mean" in bad.json()["error"]
        bad = client.post("/jobs", json={"prompt": "x", "frames": 10})
        assert bad.status_code == 400 and bad.json()["problems"][0]["path"] == "generate.frames"
        assert client.get("/jobs").json() == {"jobs": []}
        # the log holds each refusal (a client's polling it leaves out)
        logged = server.output()
        assert "POST /jobs -> 400" in logged and "GET /health -> 401" in logged
        assert "GET /jobs -> 200" not in logged

        # concurrent submissions: all taken, in one order, run one at a time
        answers = [None] * 2

        def submit(i):
            answers[i] = client.post("/jobs", json={"prompt": f"fox {i}", "seed": i})
        threads = [threading.Thread(target=submit, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(a.status_code for a in answers) == [201, 201]
        ids = sorted(a.json()["id"] for a in answers)
        for job_id in ids:
            assert server.wait(job_id)["status"] == "done"
        first = client.get(f"/jobs/{ids[0]}").json()
        video = client.get(first["video"])
        assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
        assert video.content[4:8] == b"ftyp"
        assert client.get(first["record"]).json()["recipe"]["generate"]["prompt"] \
            .startswith("fox")
        # its frames as they were decoded: the whole fragmented MP4, once it is done
        streamed = client.get(first["stream"])
        assert streamed.status_code == 200 and streamed.headers["content-type"] == "video/mp4"
        assert streamed.content == (out / "jobs" / ids[0] / "stream.mp4").read_bytes()
        assert streamed.content.count(b"moof") == 9  # a fragment a frame
        assert client.get("/jobs/nope/stream").status_code == 404

        # a long job runs; one waits and is cancelled; the queue (2) refuses a third
        long = client.post("/jobs", json={"prompt": "long", "steps": 400}).json()
        server.wait(long["id"], step=1)
        waiting = client.post("/jobs", json={"prompt": "waits"}).json()
        more = [client.post("/jobs", json={"prompt": "more"}) for _ in range(2)]
        assert [r.status_code for r in more] == [201, 429]
        # a stream asked for while its job waits: it ends (empty) when the job does
        ended = {}
        watcher = threading.Thread(target=lambda: ended.update(
            answer=client.get(waiting["stream"])))
        watcher.start()
        time.sleep(0.5)
        cancelled = client.delete(f"/jobs/{waiting['id']}").json()
        assert cancelled["status"] == "cancelled"
        assert cancelled["error"] == "cancelled before it started"
        watcher.join(30)
        assert ended["answer"].status_code == 200 and ended["answer"].content == b""
        assert client.get(waiting["stream"]).status_code == 404  # ended without one
        assert client.delete(f"/jobs/{ids[0]}").status_code == 409  # done (a running
        # job is cancelled at its step end: tests/commands/serve/test_page.py)
        assert client.delete("/jobs/nope").json() == {"error": "no job 'nope'"}
        early = client.get(f"/jobs/{long['id']}/video")
        assert early.status_code == 404 and "has no video yet" in early.json()["error"]
        # live previews while it denoises (serve.preview_every: 2 steps), no decode
        server.wait(long["id"], step=4)
        running = client.get(f"/jobs/{long['id']}").json()
        picture = client.get(running["preview"])
        assert picture.status_code == 200 and picture.headers["content-type"] == "image/png"
        assert picture.content[:8] == b"\x89PNG\r\n\x1a\n"
        assert client.get(f"/jobs/{waiting['id']}/preview").status_code == 404  # none yet

        # SIGTERM mid-job: the job stops at a step end with a checkpoint; exit 0
        at = server.wait(long["id"], step=12)["step"]
    finally:
        code = server.stop()
    assert code == 0, server.output()
    saved = json.loads((out / "jobs" / long["id"] / "job.json").read_text())
    assert saved["status"] == "queued" and saved["step"] >= at
    assert list((out / "jobs" / long["id"]).glob("progress-*.json"))

    # restarted: finished jobs are served, the interrupted job continues, then the rest
    again = Server(recipe, out)
    try:
        assert again.client.get(f"/jobs/{ids[0]}/video").status_code == 200
        done = again.wait(long["id"], seconds=600)
        assert done["status"] == "done" and done["resumed"] == 1
        record = again.client.get(f"/jobs/{long['id']}/record").json()
        segments = [s for s in record["history"] if s["stage"] == "denoise"]
        assert len(segments) == 2 and segments[0]["steps"][1] == segments[1]["steps"][0] > 0
        assert again.wait(more[0].json()["id"])["status"] == "done"
        statuses = {j["id"]: j["status"] for j in again.client.get("/jobs").json()["jobs"]}
        assert statuses[waiting["id"]] == "cancelled"
    finally:
        assert again.stop() == 0


def test_listening_beyond_loopback_needs_a_token(recipe, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PORTER_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "porter.cli", "serve", str(recipe),
                           "--host", "0.0.0.0", f"output.dir={tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "without a token" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_address_in_use_is_refused_before_the_model_loads(recipe, tmp_path):
    """Binding comes first: at real size the load takes minutes, and uvicorn's own
    refusal came after it, with its exit code (3) and no hint."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with taken:
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "porter.cli", "serve", str(recipe),
                               "--port", str(port), f"output.dir={tmp_path}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "give another --port" in done.stderr and "Traceback" not in done.stderr
    assert "loading" not in done.stderr and "serving" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "porter.cli", "serve", str(recipe),
                           "--port", "99999"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "a TCP port is 0 to 65535, got 99999" in done.stderr


def test_a_client_reaches_no_file_and_no_hostile_body_harms_the_server(tmp_path):
    """An image-to-video server: images come as bytes or from --inputs only; the API
    description is behind the token; deep, huge and broken bodies get JSON 4xx."""
    inputs, outside = tmp_path / "inputs", ROOT / "recipes" / "assets" / "first_frame.png"
    inputs.mkdir()
    (inputs / "frame.png").write_bytes(outside.read_bytes())
    (inputs / "link.png").symlink_to(outside)  # a PNG, but outside the folder
    server = Server(ROOT / "recipes" / "wan22-i2v-tiny.yaml", tmp_path / "out", 4,
                    "--inputs", str(inputs))
    client = server.client
    try:
        for path in ("/openapi.json", "/docs"):
            assert httpx.get(server.url + path).status_code == 401
            assert client.get(path).status_code == 200
        assert str(ROOT) not in client.get("/openapi.json").text
        assert str(ROOT) not in client.get("/health").text
        # the page's form: the files the model takes, not where the recipe's lie
        form = client.get("/settings").json()
        assert form["inputs"] == {"image": {"kind": "image", "recipe_has": True},
                                  "last_image": {"kind": "image", "recipe_has": False}}
        assert "first_frame" not in json.dumps(form)

        answers = {path: client.post("/jobs", json={"image": path}) for path in (
            "/etc/passwd", "/etc/shadow", "/proc/self/environ", "../../../../etc/passwd",
            "link.png", "missing.png", str(outside))}
        assert {a.status_code for a in answers.values()} == {400}
        # the same answer whether the path exists or not: nothing learnt about the disk
        assert {a.json()["error"].replace(repr(p), "NAME") for p, a in answers.items()} \
            == {"image: no image file NAME in this server's inputs folder"}

        for body in (b"[" * 100_000, b'{"a":' * 100_000, b'{"prompt": "x"' + b"}" * 9):
            answer = client.post("/jobs", content=body)
            assert answer.status_code == 400 and "error" in answer.json()
        huge = client.post("/jobs", content=b'{"prompt": "' + b"x" * (16 << 20) + b'"}')
        assert huge.status_code == 413 and "larger than" in huge.json()["error"]
        assert client.get("/health").json()["status"] == "ok"
        assert client.get("/jobs").json() == {"jobs": []}

        sent = outside.read_bytes()
        by_bytes = client.post("/jobs", json={
            "image": "data:image/png;base64," + base64.b64encode(sent).decode()})
        by_name = client.post("/jobs", json={"image": "frame.png"})
        assert (by_bytes.status_code, by_name.status_code) == (201, 201), by_bytes.text
        jobs = [server.wait(a.json()["id"]) for a in (by_bytes, by_name)]
        assert [j["status"] for j in jobs] == ["done", "done"], jobs
        assert all(j["settings"]["image"] == "inputs/image.png" for j in jobs)
        folders = [tmp_path / "out" / "jobs" / j["id"] for j in jobs]
        assert all((f / "inputs" / "image.png").read_bytes() == sent for f in folders)
        # the same first frame both ways: the same latents
        records = [client.get(j["record"]).json() for j in jobs]
        assert records[0]["outputs"]["files"]["denoise.safetensors"] == \
            records[1]["outputs"]["files"]["denoise.safetensors"]
    finally:
        assert server.stop() == 0, server.output()


def test_a_cogvideox_job_continues_after_a_restart(tmp_path):
    """CogVideoX runs in Porter's stages, so a server job killed mid-denoise continues
    from its last checkpoint when the server comes back, as a Wan job does."""
    recipe = tmp_path / "cogvideox.yaml"
    recipe.write_text((ROOT / "recipes" / "cogvideox-tiny.yaml").read_text().replace(
        "output: {fps: 8}", "output: {fps: 8, checkpoint_every: 5}"))
    out = tmp_path / "out"
    server = Server(recipe, out)
    try:
        job = server.client.post("/jobs", json={"prompt": "a fox", "steps": 300}).json()
        at = server.wait(job["id"], step=12)["step"]
    finally:
        assert server.stop() == 0, server.output()
    assert list((out / "jobs" / job["id"]).glob("progress-*.json"))
    again = Server(recipe, out)
    try:
        done = again.wait(job["id"], seconds=600)
        assert done["status"] == "done" and done["resumed"] == 1
        record = again.client.get(f"/jobs/{job['id']}/record").json()
        segments = [s for s in record["history"] if s["stage"] == "denoise"]
        assert len(segments) == 2 and segments[1]["steps"][0] >= at - at % 5 > 0
    finally:
        assert again.stop() == 0


def test_warmed_up_shapes_compile_nothing_when_asked_for(tmp_path):
    """serve.warmup's jobs run before /health says ready (the warm-up's own count shows
    the compile counter counting); a request of their shape then compiles nothing."""
    recipe = tmp_path / "warm.yaml"
    recipe.write_text(TINY_RECIPE + "serve:\n  warmup:\n    - {height: 32, width: 48}\n")
    server = Server(recipe, tmp_path / "out")
    try:
        deadline = time.time() + 300
        while not (health := server.client.get("/health").json())["ready"]:
            assert health["status"] == "warming up" and time.time() < deadline, health
            time.sleep(0.2)
        assert health["status"] == "ok" and health["ready_s"] > 0
        [warmed] = health["warmup"]["runs"]
        assert warmed["shape"] == "48x32, 9 frames, 3 steps" and warmed["programs"] > 0
        job = server.client.post("/jobs", json={"width": 48, "seed": 5}).json()
        compiled = server.client.get(server.wait(job["id"])["record"]).json()[
            "timings"]["compile"]
        assert compiled["programs"] == 0 and compiled["seconds"] == 0
    finally:
        assert server.stop() == 0, server.output()


def test_a_warmup_the_recipe_cannot_run_is_refused_before_loading(tmp_path):
    from porter import registry as registry_mod, recipe as recipes
    from porter.commands.serve import warmup_recipes
    from porter.errors import RecipeError

    path = tmp_path / "warm.yaml"
    path.write_text(TINY_RECIPE + "serve:\n  warmup:\n    - {width: 48}\n    - {height: 30}\n")
    with pytest.raises(RecipeError) as refused:
        warmup_recipes(recipes.load(path), registry_mod.loaded())
    [problem] = refused.value.problems
    assert problem.path == "generate.height" and problem.line == 12
    assert str(problem.file).endswith("warm.yaml")


def test_the_official_openai_client_makes_a_video(recipe, tmp_path):
    """OpenAI's video API on the same server: the official `openai` client creates a
    video (form data, Porter's settings as extra fields), follows its progress,
    downloads the mp4, lists and deletes it; what it cannot say here is refused in
    OpenAI's error shape, which the client raises as its own errors."""
    import io

    import numpy as np
    import openai
    from PIL import Image

    from porter.rundir import video as video_io

    server = Server(recipe, tmp_path / "out")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
    try:
        made = client.videos.create(prompt="a red fox", seconds="0.5", size="32x32",
                                    extra_body={"seed": 3, "steps": 2})
        assert made.object == "video" and made.status in ("queued", "in_progress")
        assert (made.size, made.seconds, made.model) == ("32x32", "0.5", "tiny")
        assert made.prompt == "a red fox" and made.created_at > 0
        seen = set()
        deadline = time.time() + 300
        while (video := client.videos.retrieve(made.id)).status != "completed":
            assert video.status != "failed", video.error
            assert time.time() < deadline, video
            seen.add(video.progress)
            time.sleep(0.1)
        assert video.progress == 100 and video.completed_at >= video.created_at
        assert all(0 <= p <= 100 for p in seen)
        job = server.client.get(f"/jobs/{made.id}").json()  # the same job, Porter's way
        assert job["settings"] == {"prompt": "a red fox", "seed": 3, "steps": 2,
                                   "width": 32, "height": 32, "frames": 9}
        mp4 = tmp_path / "fox.mp4"
        client.videos.download_content(made.id).write_to_file(mp4)
        frames, fps = video_io.read_mp4(mp4)
        assert frames.shape == (9, 32, 32, 3) and fps == 16 and np.ptp(frames) > 0
        # the thumbnail: the first frame as the mp4 holds it
        thumbnail = client.videos.download_content(made.id, variant="thumbnail").read()
        first = np.asarray(Image.open(io.BytesIO(thumbnail)).convert("RGB"))
        assert Image.open(io.BytesIO(thumbnail)).format == "WEBP"
        assert np.array_equal(first, frames[0])
        assert [v.id for v in client.videos.list()] == [made.id]

        image = io.BytesIO()
        Image.new("RGB", (32, 32), "red").save(image, "PNG")
        png = image.getvalue()
        refusals = [({"size": "big"}, "size", "size 'big' is not WIDTHxHEIGHT"),
                    ({"extra_body": {"framez": 3}}, "framez", "unknown field 'framez'"),
                    ({"extra_body": {"frames": 9}}, "frames", "give 'seconds' instead"),
                    ({"model": "sora-2"}, "model", "with 'tiny' only"),
                    ({"input_reference": ("red.png", png, "image/png")},
                     "input_reference", "takes no image")]
        for fields, param, said in refusals:
            with pytest.raises(openai.BadRequestError) as refused:
                client.videos.create(prompt="x", **fields)
            assert refused.value.body["param"] == param, refused.value.body
            assert said in refused.value.body["message"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong",
                          max_retries=0).videos.list()
        with pytest.raises(openai.NotFoundError):
            client.videos.download_content("999999")

        assert client.videos.delete(made.id).deleted
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(made.id)
        assert client.videos.list().data == []
        assert server.client.get("/jobs").json()["jobs"] == []
    finally:
        assert server.stop() == 0
