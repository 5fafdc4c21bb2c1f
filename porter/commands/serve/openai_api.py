"""OpenAI's video API on ``porter serve`` (``/v1/videos``), on the same queue, jobs and
folders as Porter's own routes: what the official ``openai`` client
(``client.videos.create``, ``retrieve``, ``list``, ``delete``, ``download_content``)
and the serving systems that speak it expect.

A create request is multipart form data (what the client sends) or JSON: ``prompt``,
``size`` ("WIDTHxHEIGHT"), ``seconds`` (frames at the recipe's fps: seconds x fps + 1),
``input_reference`` (an uploaded image, for a recipe that takes one), ``model`` (the
recipe's name, the only model a server serves) and any of the recipe's ``generate``
settings as extra fields (``extra_body={"seed": 3, "steps": 20}``). Every refusal
answers in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

# no ``from __future__ import annotations``: FastAPI reads the handlers' annotations
# (``Request``) at run time, from names local to ``routes``
import asyncio
import base64
import math
import re

from porter.commands.serve import jobs as jobs_mod
from porter.commands.serve import uploads
from porter.commands.serve.limits import MAX_BODY, MAX_DEPTH, nesting
from porter.errors import RecipeError, UsageError, failure
from porter.recipe import Recipe, jsonio
from porter.recipe.schema import GenerateSection

#: the create request's own fields; the rest are the recipe's generate settings
OWN = ("prompt", "model", "seconds", "size", "input_reference")
#: generate settings a create request gives through OpenAI's fields instead
REPLACED = {"frames": "seconds", "height": "size", "width": "size", "image": "input_reference"}
#: generate settings that are text whatever they look like ("42" stays a prompt)
TEXT = ("prompt", "negative_prompt")
#: Porter's job states as OpenAI's video states
STATES = {"queued": "queued", "running": "in_progress", "done": "completed",
          "failed": "failed", "cancelled": "failed"}
_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


class Refused(UsageError):
    """A request OpenAI's dialect cannot express here: its status and the field."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 hint: str | None = None):
        super().__init__(message, hint=hint)
        self.status, self.param = status, param


def error(status: int, message: str, param: str | None = None, code: str | None = None):
    """An answer in OpenAI's error shape."""
    from fastapi.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status)


def settings_of(fields: dict, recipe: Recipe) -> dict:
    """A create request's fields as the generate settings of a Porter job (Refused for
    what they cannot say here). ``input_reference`` is the uploaded image's bytes."""
    if not isinstance(fields.get("prompt"), str) or not fields["prompt"].strip():
        raise Refused(400, "prompt is required: the text the video shows", "prompt")
    model = fields.get("model")
    if model not in (None, "", recipe.name):
        raise Refused(400, f"model {model!r}: this server makes videos with "
                      f"{recipe.name!r} only", "model", hint=f"model={recipe.name!r}, or "
                      "leave it out")
    for key, instead in REPLACED.items():
        if key in fields:
            raise Refused(400, f"{key}: give {instead!r} instead (OpenAI's field for it)",
                          key)
    known = set(GenerateSection.model_fields) | set(OWN)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise Refused(400, f"unknown field {unknown[0]!r}: neither OpenAI's ("
                      f"{', '.join(OWN)}) nor a generate setting of the recipe", unknown[0])
    settings = {key: value for key, value in fields.items() if key not in OWN}
    settings["prompt"] = fields["prompt"]
    if fields.get("size"):
        settings["width"], settings["height"] = _size(fields["size"])
    if fields.get("seconds") not in (None, ""):
        settings["frames"] = _frames(fields["seconds"], recipe.output.fps)
    if fields.get("input_reference") is not None:
        settings["image"] = _image(fields["input_reference"])
    return settings


def _typed(key: str, value):
    """A form field's text as the value it stands for (form fields are text: "3" is
    the number 3, "true" true, a JSON list a list; lists and objects the client sent
    as ``key[]`` and ``key[sub]`` fields arrive rebuilt); text settings stay text."""
    if isinstance(value, dict):
        return {k: _typed(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(key, v) for v in value]
    if key in TEXT or not isinstance(value, str):
        return value
    if nesting(value.encode(), MAX_DEPTH) > MAX_DEPTH:
        raise Refused(400, f"{key}: nests deeper than {MAX_DEPTH} levels", key)
    try:
        return jsonio.loads(value)
    except (ValueError, RecursionError):
        return value


_PART = re.compile(r"\[([^\[\]]*)\]")


def _place(fields: dict, name: str, value) -> None:
    """A form field into ``fields``, its bracketed name (``a[b][]``, as OpenAI's
    clients write nested values) as nested objects and lists; a name given twice is
    refused."""
    base = name.split("[", 1)[0]
    parts = _PART.findall(name[len(base):])
    if not base or "".join(f"[{p}]" for p in parts) != name[len(base):]:
        raise Refused(400, f"field name {name!r} is not NAME, NAME[KEY] or NAME[]", name)
    node, key = fields, base
    for part in parts:
        empty = [] if part == "" else {}
        child = node.get(key, empty) if isinstance(node, dict) else empty
        if type(child) is not type(empty):
            raise Refused(400, f"the request names {name!r} twice or both ways", base)
        if isinstance(node, dict):
            node[key] = child
        else:
            node.append(child)
        node, key = child, part
    if isinstance(node, list):
        node.append(value)
    elif key in node:
        raise Refused(400, f"the request names {name!r} twice", base)
    else:
        node[key] = value


def _size(size) -> tuple[int, int]:
    found = _SIZE.match(str(size))
    if found is None:
        raise Refused(400, f"size {size!r} is not WIDTHxHEIGHT", "size",
                      hint="e.g. 832x480")
    return int(found.group(1)), int(found.group(2))


def _frames(seconds, fps: int) -> int:
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = math.nan
    if not value > 0:  # NaN too
        raise Refused(400, f"seconds {seconds!r} is not a duration in seconds", "seconds",
                      hint="e.g. 4")
    if value > MAX_SECONDS:
        raise Refused(400, f"seconds {seconds!r} is longer than a video this server makes "
                      f"({MAX_SECONDS} s at most)", "seconds", hint="e.g. 4")
    return round(value * fps) + 1


#: the longest video a request may ask for (the job's own checks bound its frames too)
MAX_SECONDS = 600


def _image(reference) -> str:
    """The reference image as the data URL a job takes: an upload's bytes, or
    ``{"image_url": "data:..."}`` (its format is checked with the job's other inputs;
    a URL the server would fetch, or an OpenAI file id, it does not take)."""
    if isinstance(reference, bytes):
        return "data:image/png;base64," + base64.b64encode(reference).decode()
    url = reference.get("image_url") if isinstance(reference, dict) else reference
    if isinstance(url, str) and url.startswith("data:"):
        return url
    raise Refused(400, "input_reference: upload the image, or give {\"image_url\": a "
                  "data URL}; a server fetches no URL and knows no file ids",
                  "input_reference")


def video_object(job, recipe: Recipe, previewed: bool = False) -> dict:
    """A job as OpenAI's Video object (Porter's own fields beside: ``porter``, with its
    live preview's address once it has one)."""
    settings = job.settings
    width = settings.get("width", recipe.generate.width)
    height = settings.get("height", recipe.generate.height)
    frames = settings.get("frames", recipe.generate.frames)  # None: the pipeline's own
    status = STATES[job.status]
    progress = {"completed": 100, "queued": 0}.get(
        status, int(100 * job.step / job.steps) if job.steps else 0)
    found = {"id": job.id, "object": "video", "model": recipe.name, "status": status,
             "progress": progress, "created_at": int(job.submitted),
             "completed_at": int(job.finished) if job.finished else None,
             "expires_at": None, "prompt": settings.get("prompt", recipe.generate.prompt),
             "seconds": _seconds(frames, recipe.output.fps),
             "size": f"{width}x{height}" if width and height else "",
             "remixed_from_video_id": None, "error": None,
             "porter": {"status": job.status, "step": job.step, "steps": job.steps,
                        "job": f"/jobs/{job.id}",
                        "preview": f"/jobs/{job.id}/preview" if previewed else None}}
    if job.status in ("failed", "cancelled"):
        found["error"] = {"code": "cancelled" if job.status == "cancelled" else
                          "generation_failed", "message": job.error or "cancelled"}
    return found


def _seconds(frames: int | None, fps: int) -> str:
    """A video's duration as OpenAI writes it: "4", or "0.5" where it is not whole;
    "" where the recipe leaves the frames to the pipeline."""
    if not frames:
        return ""
    return f"{(frames - 1) / fps:.2f}".rstrip("0").rstrip(".")


def routes(app, jobs, read_json) -> None:
    """``/v1/videos``: create, list, retrieve, delete and the video's content
    (``read_json``: the server's bounded reader of a JSON body)."""
    from fastapi import Request
    from fastapi.responses import FileResponse, Response

    recipe = jobs.port.recipe

    @app.post("/v1/videos", summary="OpenAI: create a video (multipart form or JSON)")
    async def create(request: Request):
        try:
            fields = await _fields(request, read_json)
            settings = settings_of(fields, recipe)
            job = await asyncio.to_thread(jobs.submit, settings)
        except Refused as exc:
            return error(exc.status, exc.one_line(), exc.param)
        except RecipeError as exc:
            key = exc.problems[0].path.removeprefix("generate.")
            if key == "frames" and fields.get("seconds") not in (None, ""):
                return error(400, _in_seconds(exc.problems[0], fields["seconds"],
                                              recipe.output.fps), "seconds")
            return error(400, exc.one_line(), REPLACED.get(key, key))
        except (UsageError, OSError) as exc:
            found = error(jobs_mod.refused_status(exc), *_in_openais_words(exc))
            found.headers.update(jobs_mod.refused_headers(exc))
            return found
        return video_object(job, recipe, bool(jobs.preview(job.id)))

    for method, path, verb in UNSUPPORTED:
        app.add_api_route(path, _unsupported(verb), methods=[method],
                          summary=f"OpenAI: Porter does not {verb} videos")

    @app.get("/v1/videos", summary="OpenAI: the videos, newest first")
    async def listing(limit: int = 20, after: str | None = None, order: str = "desc"):
        return listed(jobs, limit, after, order)

    @app.get("/v1/videos/{video_id}", summary="OpenAI: a video's status and progress")
    async def retrieve(video_id: str):
        try:
            return video_object(jobs.get(video_id), recipe, bool(jobs.preview(video_id)))
        except KeyError:
            return error(404, f"no video {video_id!r}", "video_id")

    @app.delete("/v1/videos/{video_id}", summary="OpenAI: delete a video (a queued one "
                "is cancelled; a running one cannot be)")
    async def delete(video_id: str):
        try:
            await asyncio.to_thread(jobs.delete, video_id)
        except KeyError:
            return error(404, f"no video {video_id!r}", "video_id")
        except jobs_mod.Conflict as exc:
            return error(409, exc.one_line(), "video_id")
        return {"id": video_id, "object": "video.deleted", "deleted": True}

    @app.get("/v1/videos/{video_id}/content", summary="OpenAI: a completed video (mp4)",
             response_class=FileResponse)
    async def content(video_id: str, variant: str = "video"):
        if variant not in ("video", "thumbnail"):
            return error(400, f"variant {variant!r}: Porter makes variant=video and "
                         "variant=thumbnail", "variant")
        try:
            path = jobs.video(video_id)
            state = STATES[jobs.get(video_id).status]
        except KeyError:
            return error(404, f"no video {video_id!r}", "video_id")
        if path is None:
            return error(404, f"video {video_id} is not completed (status {state})",
                         "video_id")
        if variant == "thumbnail":
            try:
                return Response(await asyncio.to_thread(thumbnail, path),
                                media_type="image/webp")
            except (OSError, ValueError) as exc:  # deleted meanwhile, or unreadable
                return error(404 if isinstance(exc, FileNotFoundError) else 500,
                             f"video {video_id}: no first frame to show ({exc})",
                             "video_id")
        return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")


def thumbnail(video) -> bytes:
    """The video's first frame as a WebP image (lossless), as OpenAI's ``thumbnail``
    variant answers."""
    import io

    import av

    try:
        with av.open(str(video)) as container:
            frame = next(container.decode(video=0), None)
    except av.error.FileNotFoundError as exc:
        raise FileNotFoundError(str(exc)) from None
    except av.error.FFmpegError as exc:
        raise ValueError(f"not a video PyAV can read: {exc}") from None
    if frame is None:
        raise ValueError("the video has no frames")
    out = io.BytesIO()
    frame.to_image().save(out, format="WEBP", lossless=True)
    return out.getvalue()


def listed(jobs, limit: int, after: str | None, order: str):
    """A page of the videos as OpenAI lists them: ``order`` by id ("desc": newest
    first), those after the id ``after``, at most ``limit`` (1 to 100)."""
    if order not in ("asc", "desc"):
        return error(400, f"order {order!r}: asc or desc", "order")
    found = sorted(jobs.list(), key=lambda job: job.seq, reverse=order == "desc")
    if after is not None:  # by its place in the order: it may have been deleted
        if not after.isdigit():
            return error(400, f"after {after!r} is not a video id", "after")
        found = [job for job in found
                 if (job.seq < int(after) if order == "desc" else job.seq > int(after))]
    if limit < 1:
        return error(400, f"limit {limit}: at least 1 (at most 100 a page)", "limit")
    page = found[:min(limit, 100)]
    recipe = jobs.port.recipe
    data = [video_object(job, recipe, bool(jobs.preview(job.id))) for job in page]
    return {"object": "list", "data": data, "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None, "has_more": len(found) > len(page)}


#: the OpenAI routes Porter answers only to say it does not do them: (method, path,
#: what it does not do to videos)
UNSUPPORTED = (("POST", "/v1/videos/{video_id}/remix", "remix"),
               ("POST", "/v1/videos/edits", "edit"),
               ("POST", "/v1/videos/extensions", "extend"),
               ("POST", "/v1/videos/characters", "keep characters for"),
               ("GET", "/v1/videos/characters/{character_id}", "keep characters for"))


def _unsupported(verb: str):
    async def answer():
        return error(400, f"Porter does not {verb} videos: it makes each video from its "
                     "prompt (and input_reference) with the model it serves", None,
                     "unsupported")
    return answer


def _in_openais_words(exc: Exception) -> tuple[str, str | None]:
    """A job's refusal as OpenAI's error message and param: a generate setting that an
    OpenAI field stands for (the image: ``input_reference``) is named as the field."""
    for key, field in REPLACED.items():
        if getattr(exc, "message", "").startswith(f"{key}: "):
            # without its hint: that speaks of /jobs' data URLs, where this is an upload
            return exc.message.replace(f"{key}: ", f"{field}: ", 1), field
    return failure(exc).one_line(), None


def _in_seconds(problem, seconds, fps: int) -> str:
    """A frame count the model cannot make, said in the seconds the request gave: the
    problem's suggested counts ("try 9 or 13") as durations at the recipe's fps."""
    frames = _frames(seconds, fps)

    def durations(found) -> str:  # one frame lasts no time: no duration asks for it
        counts = [int(found[1]), int(found[2])]
        return " or ".join(_seconds(n, fps) for n in counts if n > 1) + " seconds"

    hint = re.sub(r"(?<=try )(\d+) or (\d+)", durations, problem.hint or "")
    return (f"seconds {seconds!r} is {frames} frames at {fps} fps: {problem.message}"
            + (f"; {hint}" if hint else ""))


async def _fields(request, read_json) -> dict:
    """A create request's fields: a multipart form's (an upload's bytes, no more than
    an input image may have) or a JSON object's (``read_json``: the server's reader,
    bounded like every job's), each key once."""
    kind = request.headers.get("content-type", "")
    if kind.startswith("application/json"):
        try:
            body = await read_json(request)
        except UsageError as exc:
            raise Refused(getattr(exc, "status", 400), exc.message, hint=exc.hint) from None
        if not isinstance(body, dict):
            raise Refused(400, "a create request is a JSON object of fields")
        return body
    if not kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise Refused(415, f"content type {kind or 'none'!r}: send multipart form data "
                      "(as OpenAI's clients do) or JSON")
    length = request.headers.get("content-length", "")
    if not length.isdigit():
        raise Refused(411, "a form needs its Content-Length (OpenAI's clients send it)")
    if int(length) > MAX_BODY:
        raise Refused(413, f"the form is larger than the {MAX_BODY >> 20} MiB a video "
                      "request may have")
    fields: dict = {}
    async with request.form(max_files=1, max_fields=64,
                            max_part_size=uploads.MAX_IMAGE_BYTES) as form:
        for key, value in form.multi_items():
            if hasattr(value, "read"):  # an upload
                value = await value.read(uploads.MAX_IMAGE_BYTES + 1)
                if len(value) > uploads.MAX_IMAGE_BYTES:
                    raise Refused(413, f"{key}: larger than the "
                                  f"{uploads.MAX_IMAGE_BYTES >> 20} MiB an image may "
                                  "have", key)
            _place(fields, key, value)
    return form_values(fields)


def form_values(fields: dict) -> dict:
    """A form's fields as the values they stand for (``_typed``; OpenAI's own fields
    stay as sent)."""
    return {key: value if key in OWN else _typed(key, value)
            for key, value in fields.items()}
