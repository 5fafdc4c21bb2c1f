"""The web page at ``/`` of ``porter serve``: a prompt and the recipe's settings, the
queue with each job's progress and live preview, the finished video playing in the
page, its run record a click away, cancel.

Plain HTML, CSS and JavaScript shipped in the package (``static/``): no build step,
nothing fetched from elsewhere (its Content-Security-Policy allows this server only).
The page and its files (script, style, icon) are the only routes open without the token: a browser
cannot send a bearer token for a page it opens, and they hold no data. The page asks
for the token once (kept in the browser's storage) and sends it with every call, as
any client does; videos and previews are fetched with it and shown from memory.
"""

# no ``from __future__ import annotations``: FastAPI reads the handlers' annotations
import inspect
from importlib import resources

from porter.commands.serve import uploads
from porter.recipe.inputs import INPUTS

#: the page's files by the address each is served at; no other file is served
FILES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/page.js": ("page.js", "text/javascript; charset=utf-8"),
         "/page.css": ("page.css", "text/css; charset=utf-8"),
         "/favicon.svg": ("favicon.svg", "image/svg+xml")}
#: the routes a request without the token reaches
OPEN = frozenset(FILES)
#: the generate settings the page's form shows, filled with the recipe's values
FORM = ("prompt", "negative_prompt", "width", "height", "frames", "steps", "seed",
        "guidance_scale")
#: the page runs this server's scripts only, and shows media it fetched itself (blob:)
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
          "img-src 'self' blob:; media-src blob:; form-action 'none'; base-uri 'none'; "
          "frame-ancestors 'none'")


def form(port) -> dict:
    """What the page's form shows: the recipe's values of ``FORM``, the input files the
    model takes (whether the recipe gives one: its path is not told), the fps."""
    recipe = port.recipe
    gen = recipe.generate
    return {"recipe": recipe.name, "family": recipe.model.family, "fps": recipe.output.fps,
            "generate": {key: getattr(gen, key) for key in FORM},
            "inputs": {key: {"kind": INPUTS[key], "recipe_has": getattr(gen, key) is not None}
                       for key in taken_inputs(port.pipeline)},
            "preview_every": recipe.serve.preview_every}


def taken_inputs(pipe) -> list[str]:
    """The input files the model's pipeline takes (image-to-video: ``image``), by the
    parameters of its call."""
    parameters = inspect.signature(type(pipe).__call__).parameters
    return [key for key in uploads.INPUT_KEYS if key in parameters]


def routes(app, port) -> None:
    """``/`` and its files (open), and ``/settings`` (behind the token)."""
    from fastapi.responses import Response

    folder = resources.files(__package__) / "static"

    def serving(body: bytes, kind: str):
        async def page():
            return Response(body, media_type=kind, headers={
                "Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-cache"})
        return page

    for address, (name, kind) in FILES.items():  # read once, at start
        app.add_api_route(address, serving((folder / name).read_bytes(), kind),
                          methods=["GET"], include_in_schema=False)

    @app.get("/settings", summary="the recipe's generate settings a job may change and "
             "the input files the model takes: what the page's form shows")
    async def settings():
        return form(port)
