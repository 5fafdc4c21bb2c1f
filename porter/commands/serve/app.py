"""The HTTP side of ``porter serve``: the FastAPI application over a job queue, its
routes (the page's in ``page``, OpenAI's in ``openai_api``), its refusals
(``{"error": ...}``, bodies too large or too deep) and its OpenAPI description."""

# no ``from __future__ import annotations``: FastAPI reads the handlers' annotations
# (``Request``) at run time, from names local to ``build_app``
import asyncio
import contextlib
import secrets

import porter
from porter.commands.serve import jobs as jobs_mod
from porter.commands.serve import openai_api, page, uploads
from porter.commands.serve.limits import MAX_BODY, MAX_DEPTH, nesting
from porter.errors import RecipeError, UsageError, failure
from porter.recipe import jsonio
from porter.recipe.inputs import INPUTS, PATH_KEYS
from porter.recipe.schema import GenerateSection

def build_app(jobs, token: str | None = None):
    """The FastAPI application serving ``jobs`` (a ``porter.commands.serve.jobs.Jobs``):
    every route behind the token but the page's files (``page.OPEN``), every refusal
    ``{"error": ...}``."""
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @contextlib.asynccontextmanager
    async def lifespan(app):
        jobs.start()
        yield
        await asyncio.to_thread(jobs.shutdown)  # the running job checkpoints first

    async def authorized(request: Request):
        # the page asks for the token itself; the path the router matched (scope), not
        # one rebuilt from the Host header
        if token is None or request.scope["path"] in page.OPEN:
            return
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        # the scheme's case is no one's choice (RFC 9110): "bearer x" is "Bearer x"
        if scheme.lower() != "bearer" or \
                not secrets.compare_digest(given.strip().encode(), token.encode()):
            raise HTTPException(401, "missing or wrong bearer token: send the header "
                                "'Authorization: Bearer <token>' (the token porter serve "
                                "was given)", headers={"WWW-Authenticate": "Bearer"})

    recipe = jobs.port.recipe
    # the description names the recipe's file, not where it lies on the server;
    # the API description and its pages are routes of ours, behind the token
    app = FastAPI(title="Porter", version=porter.__version__, lifespan=lifespan,
                  dependencies=[Depends(authorized)], openapi_url=None, docs_url=None,
                  redoc_url=None, redirect_slashes=False,
                  description=f"Videos from `{recipe.path.name}` ({recipe.model.family}); "
                  "jobs run one at a time in submission order.")

    def answer(request, status: int, message: str, headers=None, param=None):
        """Every error answers {"error": ...}, as submit's do; under /v1/, OpenAI's."""
        if request.url.path.startswith("/v1/"):
            found = openai_api.error(status, message, param)
            found.headers.update(headers or {})
            return found
        return JSONResponse({"error": message}, status, headers=headers)

    app.add_middleware(_Logged, say=jobs.say)

    @app.exception_handler(StarletteHTTPException)
    async def refused(request, exc):
        path = request.url.path
        if exc.status_code == 404 and exc.detail == "Not Found" \
                and _a_route(app, request, path.rstrip("/")):
            # where Starlette would redirect: an empty 307 that curl shows as nothing
            return answer(request, 404, f"no route {path}: write it without the trailing "
                          f"slash ({path.rstrip('/')})")
        return answer(request, exc.status_code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def malformed(request, exc):  # a query parameter of the wrong type
        first = exc.errors()[0]
        name = str(first["loc"][-1])
        expected = first["msg"].removeprefix("Input should be ").split(",")[0]
        return answer(request, 400, f"{name}: expected {expected}, got "
                      f"{first.get('input')!r}", param=name)

    @app.exception_handler(Exception)
    async def failed(request, exc):  # a Porter bug: still JSON, and the server goes on
        return answer(request, 500, f"internal error: {type(exc).__name__} (a Porter "
                      "bug; the server log has more)")

    _description_routes(app)
    _job_routes(app, jobs)
    _result_routes(app, jobs)
    openai_api.routes(app, jobs, _json_body)
    page.routes(app, jobs.port)
    return app


def _a_route(app, request, path: str) -> bool:
    """Does one of ``app``'s routes answer ``request``'s method at ``path``?"""
    from starlette.routing import Match

    if not path or path == request.url.path:
        return False
    scope = {**request.scope, "path": path}
    return any(route.matches(scope)[0] is Match.FULL for route in app.router.routes)


class _Logged:
    """The server's log holds what changed something (a submission, a cancel, a delete)
    and every refusal or failure; a client's polling (a GET answered) it leaves out.
    Plain ASGI: the status is read as it is sent, a stream passes through untouched,
    and a request that raised is logged as the 500 it became."""

    def __init__(self, app, say):
        self.app, self.say = app, say

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = []

        async def sending(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            code = status[0] if status else 500
            if scope["method"] != "GET" or code >= 400:
                try:  # a log that cannot be written must not fail a request it served
                    self.say(f"{scope['method']} {scope['path']} -> {code}")
                except OSError:
                    pass


def _description_routes(app) -> None:
    """The API's description and its page, behind the token like every route."""
    from fastapi.openapi.docs import get_swagger_ui_html

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi():
        return _as_answered(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title="Porter API")


def _as_answered(description: dict) -> dict:
    """FastAPI's description with the answer a malformed parameter gets: 400 in
    Porter's error shape (``malformed``), not the 422 FastAPI declares for it."""
    for methods in description.get("paths", {}).values():
        for operation in methods.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None:
                responses.setdefault("400", {"description": "a parameter of the wrong "
                                         "type: {\"error\": ...} (OpenAI's shape under "
                                         "/v1/)"})
    schemas = description.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return description


def _missing(job_id):
    from fastapi import HTTPException

    return HTTPException(404, f"no job {job_id!r}")


def _job_routes(app, jobs) -> None:
    """Submit, list, look at and cancel jobs; and the server's health."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    body = _body_schema(GenerateSection)

    @app.post("/jobs", status_code=201, summary="submit a job",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": body}}}})
    async def submit(request: Request):
        try:
            settings = await _json_body(request)
        except _BadBody as exc:
            return JSONResponse({"error": exc.message, "hint": exc.hint}, exc.status)
        try:
            job = await asyncio.to_thread(jobs.submit, settings)
        except (UsageError, OSError) as exc:
            status = jobs_mod.refused_status(exc)
            if isinstance(exc, RecipeError):
                return JSONResponse({"error": exc.one_line(), "problems": [
                    {"path": p.path, "message": p.message, "hint": p.hint}
                    for p in exc.problems]}, status)
            problem = failure(exc)  # the server's disk, in the words a run uses
            return JSONResponse({"error": problem.message, "hint": problem.hint}, status,
                                headers=jobs_mod.refused_headers(exc))
        return _described(job, jobs)

    @app.get("/jobs", summary="every job, in submission order")
    async def listing():
        return {"jobs": [_described(job, jobs) for job in jobs.list()]}

    @app.get("/jobs/{job_id}", summary="a job's status and step")
    async def status(job_id: str):
        try:
            return _described(jobs.get(job_id), jobs)
        except KeyError:
            raise _missing(job_id) from None

    @app.delete("/jobs/{job_id}", summary="cancel a job: a queued one at once, a running "
                "one before its next stage or step (`cancelling` until then)")
    async def cancel(job_id: str):
        try:
            return _described(jobs.cancel(job_id), jobs)
        except KeyError:
            raise _missing(job_id) from None
        except jobs_mod.Conflict as exc:
            return JSONResponse({"error": exc.message}, 409)

    @app.get("/health", summary="the server, its model and its queue")
    async def health():
        recipe = jobs.port.recipe
        state = jobs.state()
        # a server whose port lost a process answers a moment with why, then stops
        status = "stopping" if state["error"] else "ok" if state["ready"] else "warming up"
        return {"status": status,
                "recipe": recipe.path.name, "family": recipe.model.family, **state}


def _result_routes(app, jobs) -> None:
    """A done job's video and run record."""
    from fastapi import HTTPException
    from fastapi.responses import FileResponse, StreamingResponse

    def result(job_id: str, find, what: str):
        """A done job's result (``find(job_id)``), or 404 saying why there is none."""
        try:
            found = find(job_id)
        except KeyError:
            raise _missing(job_id) from None
        if found is None:
            status = jobs.get(job_id).status
            raise HTTPException(404, f"job {job_id} has no {what}"
                                + (" yet" if status not in jobs_mod.FINISHED else "")
                                + f" (status {status})")
        return found

    @app.get("/jobs/{job_id}/video", summary="the video of a done job (mp4)",
             response_class=FileResponse)
    async def video(job_id: str):
        path = result(job_id, jobs.video, "video")
        return FileResponse(path, media_type="video/mp4", filename=f"{job_id}.mp4")

    @app.get("/jobs/{job_id}/stream", summary="the job's frames as they are decoded: a "
             "fragmented MP4 (video/mp4) sent as it grows (chunked), from a queued or "
             "running job until it ends, or whole after; plays in Media Source Extensions",
             response_class=StreamingResponse)
    async def stream(job_id: str):
        path = result(job_id, jobs.stream, "stream")
        return StreamingResponse(_growing(path, lambda: jobs.ended(job_id)),
                                 media_type="video/mp4", headers={
                                     "Cache-Control": "no-store",
                                     "X-Content-Type-Options": "nosniff",
                                     "X-Accel-Buffering": "no"})  # proxies: pass it on

    @app.get("/jobs/{job_id}/preview", response_class=FileResponse,
             summary="the job's latest live preview (PNG), written while it denoises "
             "(serve.preview_every) from the latents, no VAE decode")
    async def latest_preview(job_id: str):
        path = result(job_id, jobs.preview, "preview")
        return FileResponse(path, media_type="image/png",
                            headers={"Cache-Control": "no-store"})  # it changes

    @app.get("/jobs/{job_id}/record", summary="the run record of a done job (run.json)")
    async def run_record(job_id: str):
        return result(job_id, jobs.record_of, "record")


#: how often a stream looks for new bytes in its growing file
STREAM_POLL_S = 0.05


async def _growing(path, ended, chunk: int = 1 << 16):
    """The bytes of ``path`` as they are written, until ``ended()`` says the writer is
    done and the last of them is sent. Waits for the file while the job is queued;
    ends with nothing for a job that ended without one."""
    handle = None
    try:
        while True:
            finished = ended()  # asked before reading: what was written by then is read
            if handle is None and path.exists():
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                    handle = await asyncio.to_thread(open, path, "rb")
            data = await asyncio.to_thread(handle.read, chunk) if handle else b""
            if data:
                yield data
            elif finished:
                return
            else:
                await asyncio.sleep(STREAM_POLL_S)
    finally:
        if handle is not None:
            handle.close()


class _BadBody(UsageError):
    def __init__(self, status: int, message: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.status = status


async def _json_body(request):
    """The request's JSON body, kept no further than ``MAX_BODY`` bytes and checked
    for nesting before it is parsed (a parser recursing 100,000 levels deep takes the
    server down with it)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= MAX_BODY:
            chunks.append(chunk)
        elif size > 4 * MAX_BODY:  # read on so the client hears the answer; not forever
            break
    if size > MAX_BODY:
        raise _BadBody(413, f"the body is larger than the {MAX_BODY >> 20} MiB a job may "
                       "have", hint="send images as data URLs of smaller files (a run "
                       "resizes them to the video's size)")
    return await asyncio.to_thread(_parsed, b"".join(chunks))  # off the event loop


def _parsed(body: bytes):
    if nesting(body, MAX_DEPTH) > MAX_DEPTH:
        raise _BadBody(400, f"the body nests deeper than {MAX_DEPTH} levels",
                       hint="a job is one JSON object of generate settings")
    try:
        return jsonio.loads(body)
    except jsonio.DuplicateKey as exc:
        raise _BadBody(400, f"the body names {exc.key!r} twice",
                       hint="give each setting once (JSON would keep the last "
                            "silently)") from None
    except (ValueError, RecursionError) as exc:
        raise _BadBody(400, f"the body is not JSON: {exc}",
                       hint='e.g. {"prompt": "a red fox", "seed": 3}') from None


def _described(job, jobs) -> dict:
    data = job.to_dict()
    done = job.status == "done"
    data["video"] = f"/jobs/{job.id}/video" if done else None
    data["record"] = f"/jobs/{job.id}/record" if done else None
    data["preview"] = f"/jobs/{job.id}/preview" if jobs.preview(job.id) else None
    data["stream"] = f"/jobs/{job.id}/stream" if jobs.stream(job.id) else None
    return data


def _body_schema(section) -> dict:
    """The request body's OpenAPI schema: the recipe's ``generate`` keys, all optional
    (the recipe gives the rest)."""
    schema = section.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("required", None)
    schema.pop("$defs", None)
    schema["description"] = ("generate settings for this job; what is left out comes "
                             "from the recipe")
    for key in PATH_KEYS:  # they name files by path: the recipe's alone
        schema["properties"].pop(key, None)
    for key in uploads.INPUT_KEYS:  # a server takes files' bytes, not its own paths
        example = "image/png" if INPUTS[key] == "image" else "video/mp4"
        schema["properties"][key]["description"] = (
            f"{key.replace('_', ' ')}: a data URL (data:{example};base64,...), or the name "
            "of a file in the folder the server's --inputs names")
    return schema
