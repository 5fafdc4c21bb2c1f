"""The ``porter`` command: parse, hand the arguments to the subcommand, turn what it
raises into an exit code. Each subcommand is a module here with its parser (``add``)
and its handler (``handle``), which calls the library (``porter.commands``)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import shlex
import sys
import traceback
import warnings

from porter import __version__
from porter.cli import (
    bench,
    calibrate,
    compile,
    inspect,
    new,
    patches,
    plan,
    plugins,
    run,
    serve,
    validate,
    verify,
)
from porter.errors import (
    Interrupted,
    PorterError,
    environment_problem,
    is_environment_error,
)
from porter.runtime import interrupt

#: each subcommand's module, in the order `porter --help` lists them
SUBCOMMANDS = {"run": run, "serve": serve, "validate": validate, "plan": plan,
               "compile": compile, "verify": verify, "bench": bench,
               "calibrate": calibrate, "inspect": inspect, "new": new,
               "plugins": plugins, "patches": patches}

EXAMPLES = """\
examples:
  porter run recipes/wan-tiny.yaml                  tiny random-weight Wan, writes a video
  porter run recipes/wan-tiny.yaml generate.steps=8 mesh.dp=2 --cpu-devices 2
  porter run recipes/wan-tiny.yaml --stage encode   then --stage denoise, --stage decode
  porter run recipes/wan-tiny.yaml --resume outputs/wan-tiny   continue where it stopped
  porter run recipes/wan-tiny.yaml --prompts prompts.txt   many videos, one load and compile
  porter serve recipes/wan-tiny.yaml --port 8000    an HTTP service (API at /docs)
  porter run R --coordinator host0:1234 --num-processes 2 --process-id 0   (and 1 elsewhere)
  porter validate recipes/wan-tiny.yaml             every check that needs no weights
  porter validate recipes/wan14b.yaml --devices 8   ... for an 8-chip machine, from here
  porter plan recipes/wan-tiny-tp.yaml --devices 8  bytes per device, from shapes alone
  porter compile recipes/wan14b.yaml --target v6e-8   will it fit? the TPU compiler says
  porter compile recipes/wan14b.yaml --target v7x-16 --choose-mesh --program transformer.forward
  porter verify recipes/wan-tiny.yaml               port vs PyTorch, block by block
  porter bench recipes/wan-tiny.yaml                one step beside PyTorch eager
  porter bench recipes/wan-tiny.yaml --video        a whole video beside diffusers' pipeline
  porter calibrate recipes/wan-tiny.yaml            MagCache's ratios for a cache: section
  porter inspect recipes/wan1.3b.yaml               tensor patterns to write rules for
  porter new mymodel --family wan                   a commented starter recipe
  porter plugins                                    what each installed plugin registered
  porter patches                                    registered patches and their docs

exit codes: 0 success, 2 bad input (recipe, flags, sources, damaged files), a
refusing machine (disk full, read-only, no permission) or NaN in weights or
latents, 3 verify over tolerance, 1 internal failure (a Porter bug: report it),
130 interrupted (Ctrl-C), 143 killed (SIGTERM).
Add --debug to see tracebacks.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="porter", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run diffusers video models on JAX through torchax, from YAML recipes.",
        epilog=EXAMPLES)
    parser.add_argument("--debug", action="store_true", help="show tracebacks and warnings "
                        "(also taken after the command: porter run R --debug)")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="Porter's version (for a bug report), then exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS.values():
        module.add(commands)
    for name, command in commands.choices.items():  # `porter X --help` shows X's examples
        # no abbreviated flags: `--prompt "a cat"` would be taken as --prompts FILE, where
        # it is a recipe key written as a flag (generate.prompt=..., said by _suggested)
        command.allow_abbrev = False
        shown = [line for line in EXAMPLES.splitlines() if line.startswith(f"  porter {name} ")]
        if shown:
            command.formatter_class = _KeepsExamples
            command.epilog = (command.epilog + "\n\n" if command.epilog else "") + \
                "examples:\n" + "\n".join(shown)
    parser.commands = commands.choices  # each subcommand's parser, for its own errors
    return parser


class _KeepsExamples(argparse.HelpFormatter):
    """argparse's own layout, but for an epilog's "examples:" block, kept as written
    (one example a line, its note beside it)."""

    def _fill_text(self, text, width, indent):
        head, marker, examples = text.partition("examples:\n")
        filled = super()._fill_text(head, width, indent) if head.strip() else ""
        if not marker:
            return filled
        return (filled + "\n\n" if filled else "") + indent + marker + examples


class _Version(argparse.Action):
    """--version: the version of the code that runs (``porter.__version__``, which the
    server's API description gives too), then exit."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"porter {__version__}")
        parser.exit()


def parse(parser: argparse.ArgumentParser, argv: list[str] | None):
    """The arguments; overrides (KEY=VALUE) may come before or after flags, and
    ``--debug`` anywhere (every hint says to add it: users add it at the end). With no
    arguments at all, the help (what a first try wants), exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    rest = [word for word in argv if word != "--debug"]
    _unknown_command(parser, rest)
    args, extra = parser.parse_known_args(rest)
    args.debug = len(rest) < len(argv)
    stray = [word for word in extra if "=" not in word or word.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        command = parser.commands[args.command]  # its own usage, not porter's
        command.error(f"unrecognized arguments: {' '.join(stray or extra)}"
                      + _suggested(stray, command))
    if extra:
        args.overrides = list(args.overrides) + extra
    return args


def _unknown_command(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A misspelled command refused with the nearest one (argparse lists them all)."""
    word = next((w for w in argv if not w.startswith("-")), None)
    if word is None or word in parser.commands:
        return
    near = difflib.get_close_matches(word, list(parser.commands), n=1)
    if near:
        parser.error(f"unknown command {word!r}; did you mean {near[0]!r}? "
                     "(porter --help lists them)")


#: flags users bring from other tools for a recipe key whose name differs
_FLAG_KEYS = {"out": ["output.dir"], "output": ["output.dir"], "o": ["output.dir"],
              "model": ["model.source"],
              "output_dir": ["output.dir"], "outdir": ["output.dir"],
              "num_frames": ["generate.frames"], "num_inference_steps": ["generate.steps"]}


def _suggested(stray: list[str], command: argparse.ArgumentParser) -> str:
    """"; did you mean ..." for a recipe key written as a flag (``--steps 4`` for
    ``generate.steps=4``) or a misspelled flag among ``stray``; else nothing."""
    flags = [flag for action in command._actions for flag in action.option_strings]
    takes_keys = any(action.dest == "overrides" for action in command._actions)
    for index, word in enumerate(stray):
        if not word.startswith("-"):
            continue
        name, given, value = word.lstrip("-").partition("=")
        keys = _recipe_keys(name.replace("-", "_")) if takes_keys else []
        if keys:
            if not given and index + 1 < len(stray) and not stray[index + 1].startswith("-"):
                value = stray[index + 1]
            return ("; recipe keys are set as KEY=VALUE: did you mean "
                    + " or ".join(shlex.quote(f"{key}={value}") if value else f"{key}=..."
                                  for key in keys) + "?")
        near = difflib.get_close_matches(word.split("=")[0], flags, n=1)
        if near and word.startswith("--"):
            return f"; did you mean {near[0]}?"
    return ""


def _recipe_keys(name: str) -> list[str]:
    """The recipe keys a flag's name means (none, one, or a few alike)."""
    if name in _FLAG_KEYS:
        return _FLAG_KEYS[name]
    from porter import recipe  # lazy: only a refused flag needs the recipe's schema

    return recipe.keys_named(name)


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    args.entry = argv is None  # the porter command itself, not a call from Python
    if not args.debug:
        _quiet_libraries()
    try:
        with interrupt.terminate_raises():
            return SUBCOMMANDS[args.command].handle(args)
    except Interrupted as exc:
        kept = f"; kept: {exc.saved} (continue with --resume)" if exc.saved else ""
        print(f"interrupted by {exc}{kept}", file=sys.stderr)
        return exc.exit_code
    except PorterError as exc:
        if args.debug:  # the traceback asked for, and still the user's error's exit code
            traceback.print_exc()
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        refused = _environment_cause(exc)
        if refused is not None:  # the machine refused (disk full, ...): not a Porter bug
            problem = environment_problem(refused)
            print(problem.render(), file=sys.stderr)
            return problem.exit_code
        print(f"internal error: {type(exc).__name__}: {exc}\n"  # a Porter bug: say so
              "  hint: rerun with --debug for the traceback and report it", file=sys.stderr)
        return 1


def _quiet_libraries() -> None:
    """Library chatter (deprecations, dtype notes) hides Porter's own output. Through
    the settings each library reads when it is imported, so that a command that needs
    none of them (plugins, patches, new) does not import them to quiet them."""
    warnings.filterwarnings("ignore")
    for key, value in (("TF_CPP_MIN_LOG_LEVEL", "2"), ("DIFFUSERS_VERBOSITY", "error"),
                       ("TRANSFORMERS_VERBOSITY", "error")):
        os.environ.setdefault(key, value)
    for library in ("diffusers", "transformers"):  # already imported: told directly
        if library in sys.modules:
            importlib.import_module(f"{library}.utils.logging").set_verbosity_error()
    for name in ("jax", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _environment_cause(exc: BaseException) -> OSError | None:
    """The OSError the machine gave, if it is what ``exc`` is or was raised from
    (``raise ... from``; an error merely raised while handling one is not)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if is_environment_error(exc):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__
    return None
