"""porter inspect lists each component's tensor patterns and the rules matching them."""

import json

from porter import cli

from support import RECIPES


def test_inspect_groups_patterns_and_shows_rules(capsys):
    assert cli.main(["inspect", str(RECIPES / "wan-tiny-tp.yaml"), "--json"]) == 0
    rows = {row["pattern"]: row for row in json.loads(capsys.readouterr().out)["transformer"]}
    q = rows["blocks.*.attn1.to_q.weight"]
    assert q["count"] == 2 and q["shape"] == [24, 24] and q["dtype"] == "f32"
    assert q["sharding"] == {"rule": 0, "spec": ["tp", None]}
    assert rows["proj_out.weight"]["sharding"] is None
