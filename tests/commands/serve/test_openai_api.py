"""OpenAI's create fields as a Porter job's generate settings (no server: the whole
API is driven by the official client in test_serve.py)."""

import pytest

from porter import recipe as recipe_mod
from porter.commands.serve.openai_api import Refused, form_values, settings_of, video_object
from porter.commands.serve.jobs import Job

from support import RECIPES


@pytest.fixture(scope="module")
def tiny():
    return recipe_mod.load(RECIPES / "wan-tiny.yaml")  # fps 8


def test_openai_fields_become_generate_settings(tiny):
    fields = {"prompt": "42", "size": "96x64", "seconds": "2", "model": "wan-tiny",
              "seed": "3", "guidance_scale": "4.5", "negative_prompt": "7",
              "input_reference": b"\x89PNG..."}
    settings = settings_of(form_values(fields), tiny)
    assert settings == {"prompt": "42", "negative_prompt": "7", "seed": 3,
                        "guidance_scale": 4.5, "width": 96, "height": 64, "frames": 17,
                        "image": "data:image/png;base64,iVBORy4uLg=="}
    assert settings_of({"prompt": "x", "input_reference": {"image_url": "data:image/png;"
                                                           "base64,AA=="}}, tiny)["image"] \
        == "data:image/png;base64,AA=="


@pytest.mark.parametrize("fields,param", [
    ({}, "prompt"), ({"prompt": " "}, "prompt"), ({"prompt": "x", "size": "64"}, "size"),
    ({"prompt": "x", "seconds": "-1"}, "seconds"), ({"prompt": "x", "seconds": "a"}, "seconds"),
    ({"prompt": "x", "model": "sora-2"}, "model"), ({"prompt": "x", "width": 64}, "width"),
    ({"prompt": "x", "stepz": 3}, "stepz"),
    ({"prompt": "x", "input_reference": {"image_url": "https://example.com/a.png"}},
     "input_reference"),
    ({"prompt": "x", "input_reference": {"file_id": "file-1"}}, "input_reference")])
def test_what_openai_fields_cannot_say_here_is_refused_naming_the_field(tiny, fields, param):
    with pytest.raises(Refused) as refused:
        settings_of(fields, tiny)
    assert refused.value.status == 400 and refused.value.param == param


def test_a_duration_too_long_is_said_as_too_long_not_as_no_duration(tiny):
    with pytest.raises(Refused) as refused:
        settings_of({"prompt": "x", "seconds": "99999"}, tiny)
    assert "longer than a video this server makes (600 s at most)" in refused.value.message
    with pytest.raises(Refused) as refused:
        settings_of({"prompt": "x", "seconds": "nan"}, tiny)
    assert "is not a duration in seconds" in refused.value.message


def test_a_job_as_openais_video_object(tiny):
    job = Job("000007", 7, {"prompt": "a fox", "frames": 17, "width": 96, "height": 64},
              status="running", submitted=100.5, step=3, steps=4)
    video = video_object(job, tiny)
    assert (video["id"], video["status"], video["progress"], video["seconds"],
            video["size"], video["model"]) == ("000007", "in_progress", 75, "2", "96x64",
                                               "wan-tiny")
    job.status, job.error, job.finished = "cancelled", None, 200.0
    assert video_object(job, tiny)["error"]["code"] == "cancelled"
    assert video_object(job, tiny)["status"] == "failed"


def test_nested_form_fields_arrive_as_the_values_the_client_sent():
    """OpenAI's client writes a nested value as bracketed field names (its form
    encoder): they are rebuilt, and a name given twice is refused."""
    from porter.commands.serve.openai_api import _place, _typed

    fields = {}
    for name, value in [("prompt", "x"), ("input_reference[image_url]", "data:,A"),
                        ("timesteps[]", "999"), ("timesteps[]", "500"),
                        ("extra[flow_shift]", "3.0")]:
        _place(fields, name, value)
    assert fields == {"prompt": "x", "input_reference": {"image_url": "data:,A"},
                      "timesteps": ["999", "500"], "extra": {"flow_shift": "3.0"}}
    assert _typed("timesteps", fields["timesteps"]) == [999, 500]
    assert _typed("extra", fields["extra"]) == {"flow_shift": 3.0}
    for twice in (["seed", "seed"], ["extra[a]", "extra[a]"], ["extra[a]", "extra[]"]):
        with pytest.raises(Refused):
            found = {}
            for name in twice:
                _place(found, name, "1")
    with pytest.raises(Refused) as deep:
        _typed("extra", "[" * 100)
    assert deep.value.param == "extra"


def test_a_recipe_that_leaves_frames_to_the_pipeline_still_describes_its_jobs():
    generic = recipe_mod.load(RECIPES / "cogvideox-5b-v2v.yaml")
    assert generic.generate.frames is None
    video = video_object(Job("000001", 1, {"prompt": "x"}), generic)
    assert video["seconds"] == "" and video["status"] == "queued"


class QueueOfOne:
    """What the routes ask of ``Jobs``: a queue already full, or one taking a job and
    finding its image unreadable (as ``uploads.take`` does)."""

    def __init__(self, recipe, full: bool):
        from types import SimpleNamespace

        self.port = SimpleNamespace(recipe=recipe, pipeline=None)
        self.full, self.said = full, []

    def say(self, message):  # the server's log
        self.said.append(message)

    def submit(self, settings):
        from porter.commands.serve import jobs, uploads

        if self.full:
            raise jobs.QueueFull("the queue is full (1 jobs waiting)", 42,
                                 hint="try again when a job has finished")
        uploads.take(settings, None)
        raise AssertionError("an unreadable image was taken")

    def list(self):
        return []

    def preview(self, job_id):
        return None


def client(recipe, full=False):
    from fastapi.testclient import TestClient

    from porter.commands.serve.app import build_app
    jobs = QueueOfOne(recipe, full)
    http = TestClient(build_app(jobs))
    http.said = jobs.said  # the server's log
    return http


def test_openai_routes_refuse_in_openais_words(tiny):
    """What a client may send that Porter cannot do answers OpenAI's error shape,
    naming the field: remix, edits, extensions and characters; a list limit below 1; an image
    that is not one; a full queue, with when to try again."""
    http = client(tiny)
    for path in ("/v1/videos/000001/remix", "/v1/videos/edits", "/v1/videos/extensions",
                 "/v1/videos/characters", "GET /v1/videos/characters/char_1"):
        answer = http.get(path.split()[1]) if path.startswith("GET ") \
            else http.post(path, json={"prompt": "x"})
        assert answer.status_code == 400, path
        error = answer.json()["error"]
        assert error["code"] == "unsupported" and "Porter does not" in error["message"]
    for limit in (0, -3):
        answer = http.get("/v1/videos", params={"limit": limit})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "limit"
    assert http.get("/v1/videos", params={"limit": 500}).status_code == 200  # a page of 100
    answer = http.get("/v1/videos", params={"limit": "abc"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "limit"
    assert answer.json()["error"]["message"] == "limit: expected a valid integer, got 'abc'"
    described = http.get("/openapi.json").json()["paths"]["/v1/videos"]["get"]["responses"]
    assert "422" not in described and "400" in described  # as it answers
    answer = http.post("/v1/videos", data={"prompt": "x"},
                       files={"input_reference": ("a.png", b"not an image", "image/png")})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "input_reference"
    assert "input_reference: the bytes are not an image" in error["message"]
    assert "BytesIO" not in error["message"] and "data URL" not in error["message"]
    full = client(tiny, full=True).post("/v1/videos", json={"prompt": "x"})
    assert full.status_code == 429 and full.headers["retry-after"] == "42"
    own = client(tiny, full=True).post("/jobs", json={"prompt": "x"})
    assert own.status_code == 429 and own.headers["retry-after"] == "42"
    # a route written with a trailing slash is named, not redirected (curl shows a 307
    # as nothing at all); a path that is no route either way is a plain 404
    for answer in (http.post("/jobs/", json={"prompt": "x"}), http.get("/v1/videos/")):
        assert answer.status_code == 404, answer.request.url
    for path in ("/nothing/", "/v1/nothing/"):
        answer = http.get(path)
        assert answer.status_code == 404 and "trailing" not in answer.text, path
    assert http.delete("/jobs/").status_code in (404, 405)  # no DELETE /jobs either
    assert "trailing" not in http.delete("/jobs/").text
    assert "write it without the trailing slash (/jobs)" in \
        http.post("/jobs/", json={"prompt": "x"}).json()["error"]
    assert http.get("/v1/videos/").json()["error"]["message"] == \
        "no route /v1/videos/: write it without the trailing slash (/v1/videos)"
    # the server's log: each refusal, not the GETs answered
    assert "POST /v1/videos/000001/remix -> 400" in http.said
    assert "GET /v1/videos -> 400" in http.said and "GET /v1/videos -> 200" not in http.said


def test_seconds_the_model_cannot_make_are_answered_in_seconds(tiny):
    """Wan makes 4n+1 frames: 1.3 s at 8 fps is 11; the answer suggests durations."""
    from porter.commands.serve.openai_api import _in_seconds
    from porter.errors import RecipeError
    from porter.port import checks
    from porter import registry as registry_mod

    with pytest.raises(RecipeError) as refused:
        checks.with_settings(tiny, registry_mod.loaded(),
                             settings_of({"prompt": "x", "seconds": "1.3"}, tiny), "request",
                             None)
    said = _in_seconds(refused.value.problems[0], "1.3", 8)
    assert said.startswith("seconds '1.3' is 11 frames at 8 fps")
    assert "; try 1 or 1.5 seconds" in said
    # below the first count that lasts: one frame is 0 s, which no request may ask
    with pytest.raises(RecipeError) as refused:
        checks.with_settings(tiny, registry_mod.loaded(),
                             settings_of({"prompt": "x", "seconds": "0.3"}, tiny), "request",
                             None)
    said = _in_seconds(refused.value.problems[0], "0.3", 8)
    assert "try 0.5 seconds" in said and "try 0 or" not in said
