"""A recipe runs no code: YAML tags, pipeline and component names, remote code in a
checkpoint or a hub id are refused or never reached."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml

from porter import registry as registry_mod, recipe
from porter.commands.validate import validate
from porter.errors import LoadError

from support import ROOT, TINY_RECIPE
from support.hostile import SEED_DATA, dump, get, paths, refusal, validates_or_refuses

pytestmark = pytest.mark.usefixtures("warm")  # timed: JAX and the models imported first


def payloads(marker: Path) -> list[str]:
    return [
        f'!!python/object/apply:os.mkdir ["{marker}"]',
        f'!!python/object/apply:os.system ["mkdir {marker}"]',
        f'!!python/object/new:subprocess.Popen [["mkdir", "{marker}"]]',
        f'!!python/object/apply:builtins.exec ["import os; os.mkdir(\'{marker}\')"]',
        "!!python/name:os.system",
        "!!python/module:os",
    ]


def test_python_tags_never_run(write, tmp_path):
    marker = tmp_path / "pwned"
    live = payloads(marker)[0]
    yaml.unsafe_load(live)  # control: this payload does run under an unsafe loader
    assert marker.exists()
    marker.rmdir()
    for index, payload in enumerate(payloads(marker)):
        places = {
            "top": payload + "\n",
            "value": TINY_RECIPE.replace("model: {family: wan, source: tiny}",
                                         f"model:\n  family: {payload}\n  source: tiny"),
            "key": TINY_RECIPE + f"? {payload}\n: 1\n",
            "extra": TINY_RECIPE.replace("steps: 3", f"steps: 3\n  extra:\n    a: {payload}"),
        }
        for place, text in places.items():
            rendered = refusal(write(f"r{index}-{place}.yaml", text))
            assert "is not allowed in a recipe" in rendered, rendered
        base = write(f"base{index}.yaml", places["value"])
        assert "is not allowed" in refusal(write(f"c{index}.yaml", f"extends: {base.name}\n"))
        override = refusal(write("o.yaml", TINY_RECIPE), f"generate.extra={payload}")
        assert "overrides: generate.extra: override YAML tag" in override
        # a key that holds text takes it as typed: the tag is a prompt's words, not read
        texted = recipe.load(write("t.yaml", TINY_RECIPE), [f"generate.prompt={payload}"])
        assert texted.generate.prompt == payload
    assert not marker.exists()


class ImportProbe:
    """A module that records being imported: recipes name it as if it were code."""

    NAME = "porter_hostile_probe"

    def __init__(self, folder: Path):
        self.marker = folder / "imported"
        (folder / f"{self.NAME}.py").write_text(
            f"open({str(self.marker)!r}, 'w').write('imported')\n"
            "def boom(*a, **k):\n    raise SystemExit('boom')\nclass Boom:\n    pass\n")

    def names(self) -> list[str]:
        return [self.NAME, f"{self.NAME}:boom", f"{self.NAME}.boom", f"{self.NAME}.Boom",
                f"{self.NAME}:Boom.__init__"]

    def untouched(self) -> bool:
        return not self.marker.exists() and self.NAME not in sys.modules


@pytest.fixture
def probe(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return ImportProbe(tmp_path)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A local 'checkpoint' with a model_index.json (no weights: nothing loads it here)."""
    path = tmp_path_factory.mktemp("ckpt") / "pipe"
    path.mkdir()
    (path / "model_index.json").write_text(
        '{"_class_name": "WanPipeline", "_diffusers_version": "0.35.0"}')
    return path


def generic_recipe(source: Path, pipeline: str | None) -> str:
    line = f"  pipeline: {pipeline!r}\n" if pipeline is not None else ""
    return (f"model:\n  family: generic\n  source: {str(source)!r}\n{line}"
            "generate: {prompt: a, height: 32, width: 32, frames: 9, steps: 2}\n")


@pytest.mark.parametrize("name", ["os.system", "subprocess.Popen", "builtins.eval",
                                  "diffusers.WanPipeline", "diffusers.pipelines.wan.WanPipeline",
                                  "porter_hostile_probe.Boom", "__class__", "__builtins__",
                                  "pipelines", "ModelMixin", "WanTransformer3DModel", ""])
def test_model_pipeline_resolves_only_diffusers_pipeline_names(write, probe, checkpoint_dir,
                                                                name):
    path = write("g.yaml", generic_recipe(checkpoint_dir, name))
    problems = validate(recipe.load(path), registry_mod.loaded())
    assert [p.path for p in problems] == ["model.pipeline"]
    assert f"{name!r} is not a diffusers pipeline class" in problems[0].message
    assert probe.untouched()


def test_model_pipeline_accepts_a_diffusers_pipeline(write, checkpoint_dir):
    path = write("g.yaml", generic_recipe(checkpoint_dir, "WanPipeline"))
    assert validate(recipe.load(path), registry_mod.loaded()) == []


def string_slots(data):
    """Every path in ``data`` that holds a string."""
    return [path for path in paths(data) if isinstance(get(data, path), str)]


def code_name_sections(name: str) -> list[dict]:
    """Recipe sections where a name of code could be smuggled in."""
    return [
        {"patches": [name, {"name": name, "params": {"target": name}}]},
        {"model": {"pipeline": name}},
        {"model": {"variant": name}},
        {"attention": {"backend": name, "skip": [name]}},
        {"compile": {name: {"methods": [name], "modules": name}}},
        {"dtypes": {"components": {name: "float32"}}},
        {"sharding": {"weights": {name: [{"match": name, "spec": [name]}]}}},
        {"generate": {"extra": {name: name}}},
        {"model": {"config": {name: name}}},
    ]


def test_no_recipe_string_imports_code(write, probe, checkpoint_dir):
    """Names of code anywhere in a recipe are data: looked up among what plugins
    registered (families, patches, attention) or in diffusers, never imported."""
    seeds = {name: SEED_DATA[name] for name in ("wan-tiny.yaml", "cogvideox-tiny.yaml",
                                                "hunyuan-tiny.yaml")}
    seeds["generic"] = yaml.safe_load(generic_recipe(checkpoint_dir, "WanPipeline"))
    cases = []
    for data in seeds.values():
        for name in probe.names():
            for slot in string_slots(data):
                case = copy.deepcopy(data)
                get(case, slot[:-1])[slot[-1]] = name
                cases.append(case)
            cases += [recipe._deep_merge(data, section) for section in code_name_sections(name)]
    for case in cases:
        validates_or_refuses(write("s.yaml", dump(case)))
    assert len(cases) > 200
    assert probe.untouched()


def test_no_source_enables_trust_remote_code():
    """Nothing in Porter or its plugins turns on remote code."""
    found = []
    for folder in (ROOT / "porter", ROOT / "plugins"):
        for file in folder.rglob("*.py"):
            for number, line in enumerate(file.read_text().splitlines(), 1):
                if "trust_remote_code" in line and "trust_remote_code=False" not in line:
                    found.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


class Captured(Exception):
    pass


@pytest.fixture
def no_header_check(monkeypatch):
    """Skip the weight-header check that may run before from_pretrained: these
    checkpoints have no weights, and the question here is what from_pretrained gets."""
    try:
        from porter.loading import checkpoints
    except ImportError:
        return
    monkeypatch.setattr(checkpoints, "check", lambda *args, **kwargs: None)


@pytest.mark.parametrize("family", ["wan", "cogvideox", "hunyuan", "generic"])
@pytest.mark.parametrize("kind", ["local", "hub"])
def test_loading_never_passes_trust_remote_code(write, monkeypatch, checkpoint_dir,
                                                no_header_check, family, kind):
    from porter import loading

    seen = []

    def capture(cls, *args, **kwargs):
        seen.append(kwargs)
        raise Captured

    source = str(checkpoint_dir) if kind == "local" else "some-org/some-model"
    path = write("r.yaml", TINY_RECIPE.replace("family: wan, source: tiny",
                                               f"family: {family}, source: {source!r}"))
    loaded = recipe.load(path)
    registered = registry_mod.loaded().family(family)
    cls = registered.pipeline_class(loaded)
    monkeypatch.setattr(cls, "from_pretrained", classmethod(capture))
    monkeypatch.setattr(cls, "download", classmethod(capture))  # a hub id's snapshot
    with pytest.raises(Captured):
        loading.load_untouched(registered, loaded)
    [kwargs] = seen
    assert kwargs.get("trust_remote_code", False) is False
    assert not {"custom_pipeline", "custom_revision"} & set(kwargs)


def test_checkpoint_code_is_not_run(tmp_path, write, no_header_check):
    """A local checkpoint that ships Python (a custom pipeline and a custom component)
    fails to load with a LoadError; its code never runs."""
    from porter import loading

    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    ckpt = tmp_path / "ckpt"
    (ckpt / "transformer").mkdir(parents=True)
    (ckpt / "model_index.json").write_text(
        '{"_class_name": ["pipeline_evil", "EvilPipeline"], "_diffusers_version": "0.35.0",'
        ' "transformer": ["evil_component", "Evil"]}')
    (ckpt / "pipeline_evil.py").write_text(
        code + "from diffusers import DiffusionPipeline\n"
        "class EvilPipeline(DiffusionPipeline):\n    pass\n")
    (ckpt / "transformer" / "evil_component.py").write_text(code + "class Evil:\n    pass\n")
    (ckpt / "transformer" / "config.json").write_text("{}")
    path = write("r.yaml", TINY_RECIPE.replace("family: wan, source: tiny",
                                               f"family: generic, source: {str(ckpt)!r}"))
    loaded = recipe.load(path)
    with pytest.raises(LoadError) as info:
        loading.load_untouched(registry_mod.loaded().family("generic"), loaded)
    assert "custom code" in str(info.value)
    assert not marker.exists()
