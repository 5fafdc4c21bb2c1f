"""The porter command on hostile recipe files: exit 2 with a message, within seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from porter import cli

from support import TINY_RECIPE
from support.hostile import BOMBS, within

pytestmark = pytest.mark.usefixtures("warm")  # timed: JAX and the models imported first


def cli_cases(lab: Path) -> dict[str, str]:
    return {
        "alias bomb": BOMBS["in a value"],
        "python tag": '!!python/object/apply:os.system ["echo pwned"]\n',
        "custom tag": TINY_RECIPE.replace("family: wan", "family: !foo wan"),
        "extends /dev/zero": "extends: /dev/zero\n" + TINY_RECIPE,
        "extends fifo": f"extends: {lab / 'fifo'}\n" + TINY_RECIPE,
        "deep": TINY_RECIPE + "x: " + "[" * 500 + "]" * 500 + "\n",
        "huge int": TINY_RECIPE + "  seed: " + "9" * 5000 + "\n",
        "duplicate key": TINY_RECIPE + "generate: {}\n",
        "not a mapping": "- model\n- generate\n",
        "bad config": TINY_RECIPE.replace("source: tiny", "source: tiny, config: "
                                          "{num_layers: many}"),
    }


def test_cli_refuses_hostile_files_with_exit_2(capsys, lab):
    for name, text in cli_cases(lab).items():
        path = lab / "cli.yaml"
        path.write_text(text)
        with within(10):
            code = cli.main(["validate", str(path)])
        out, err = capsys.readouterr()
        assert code == 2, (name, out, err)
        assert "Traceback" not in out + err and "internal error" not in err, name
        assert err.startswith("error: ") and len(err.splitlines()) <= 4, (name, err)
        assert str(path) in err, name
