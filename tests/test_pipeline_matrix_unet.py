"""Pipeline matrix runs, group unet (tests/matrix/unet.py): each class said to match runs
tiny through Porter from its recipe and equals plain diffusers from the same seed."""

import pytest

from matrix import check


@pytest.mark.slow
@pytest.mark.parametrize("name", check.params("unet"))
def test_matches_plain_diffusers(name, tmp_path):
    check.assert_matches(name, tmp_path)
