"""The pipeline matrix (tests/matrix): every video pipeline class the installed diffusers
exports is classified, each class said to match does, each said to be refused is, and
docs/pipelines.md is what the matrix says.

The runs: one test class per group of the matrix (``TestGroup_<group>``, made below
from ``check.GROUPS``), each class a unit a worker takes whole (pytest-xdist's
``--dist loadscope``), so the groups spread over the workers."""

import pytest

from porter import registry as registry_mod, recipe
from porter.commands.validate import validate

from matrix import check, page
from matrix.entries import Family, Refused


def test_every_installed_video_pipeline_is_classified():
    missing = sorted(set(check.installed()) - set(check.matrix()))
    assert missing == [], f"classify these in tests/matrix/: {missing}"


def test_docs_page_is_what_the_matrix_says():
    assert page.PAGE.read_text() == page.render(), "run: python tests/matrix/page.py"


def test_every_run_names_classes_that_run():
    """The default run's share of the matrix (check.EVERY_RUN) names classes said to
    match, and some in each group."""
    runs = {group: set(check.runs(group)) for group in check.GROUPS}
    assert check.EVERY_RUN <= set().union(*runs.values())
    assert all(names & check.EVERY_RUN for names in runs.values())


@pytest.mark.parametrize("name", [n for n, e in check.matrix().items()
                                  if isinstance(e, Family)])
def test_family_pipelines_are_the_families(name):
    import diffusers

    entry = check.matrix()[name]
    family = registry_mod.loaded().family(entry.family)
    assert (check.HERE.parent.parent / entry.tests).exists()
    assert issubclass(getattr(diffusers, name), diffusers.DiffusionPipeline)
    assert family.staged


@pytest.mark.parametrize("name", [n for n, e in check.matrix().items()
                                  if isinstance(e, Refused)])
def test_refused_pipelines_are_refused_by_validate(name, write):
    entry = check.matrix()[name]
    text = {"model": {"family": "generic", "source": str(write("ckpt/x", "").parent),
                      "pipeline": name},
            "generate": {"prompt": "a cat", "height": 16, "width": 16, "steps": 2,
                         **entry.generate}}
    import yaml

    loaded = recipe.load(write("r.yaml", yaml.safe_dump(text)))
    messages = [p.message for p in validate(loaded, registry_mod.loaded())]
    assert any(entry.reason in message for message in messages), messages


def _group(group: str) -> type:
    """The runs of one group: each class said to match runs tiny through Porter from
    its recipe and equals plain diffusers from the same seed."""
    class Group:
        @pytest.mark.slow
        @pytest.mark.parametrize("name", check.params(group))
        def test_matches_plain_diffusers(self, name, tmp_path):
            check.assert_matches(name, tmp_path)

    Group.__name__ = Group.__qualname__ = f"TestGroup_{group}"
    return Group


for _name in check.GROUPS:
    globals()[f"TestGroup_{_name}"] = _group(_name)
