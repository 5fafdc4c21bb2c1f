"""Live previews: the latent-to-RGB map fitted to a VAE, and preview.png written while
denoising without changing the run."""

import json

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from porter.generate import preview

from support import RECIPES
from support.processes import porter_calls


class LinearVAE:
    """A stand-in family whose 'decode' is a known linear map of each latent cell,
    each cell 8 x 8 pixels: the fit must find that map."""

    weights = np.random.default_rng(0).normal(20, 10, (5, 3))
    bias = np.array([100.0, 120.0, 90.0])

    def decode(self, pipe, latents, recipe):
        z = latents[0, :, 0].permute(1, 2, 0).double().numpy()  # (h, w, C)
        rgb = z @ self.weights + self.bias
        return np.repeat(np.repeat(rgb, 8, axis=0), 8, axis=1)[None]  # (1, H, W, 3)


def test_the_fit_finds_a_linear_decoders_map():
    family = LinearVAE()
    found = preview.fitted(family, None, None, channels=5)
    assert np.allclose(found.weights, family.weights) and np.allclose(found.bias, family.bias)
    assert found.residual < 1e-6
    latents = torch.randn(2, 5, 3, 4, 6)
    image = found.image(latents)
    expected = latents[0, :, 1].permute(1, 2, 0).double().numpy() @ family.weights + family.bias
    assert image.shape == (4, 6, 3) and image.dtype == np.uint8
    assert np.array_equal(image, np.clip(expected, 0, 255).round().astype(np.uint8))


def test_previews_while_denoising_change_nothing(tmp_path):
    """As a user runs it: previews every step leave the latents and the frames bit for
    bit those of a run without them (the fit's decode runs before the run's own);
    preview.png is the latents' middle frame, 4 pixels a cell; the record says what the
    previews cost; Wan 2.2's 48-channel layout (16x spatial) previews too."""
    common = [RECIPES / "wan-tiny.yaml", "generate.frames=5", "generate.steps=3",
              "output.frames=npy", "--no-progress"]
    with_previews, without, ti2v = porter_calls(
        ["run", *common, "output.preview_every=1", f"output.dir={tmp_path / 'a'}"],
        ["run", *common, f"output.dir={tmp_path / 'b'}"],
        ["run", RECIPES / "wan22-ti2v-tiny.yaml", "generate.steps=2",
         "output.preview_every=2", f"output.dir={tmp_path / 'c'}", "--no-progress"])
    for done in (with_previews, without, ti2v):
        assert done.returncode == 0, done.stderr
    a, b = (load_file(tmp_path / run / "denoise.safetensors") for run in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert np.array_equal(np.load(tmp_path / "a" / "frames.npy"),
                          np.load(tmp_path / "b" / "frames.npy"))

    assert not (tmp_path / "b" / preview.FILE).exists()
    latents = a["latents"]
    picture = Image.open(tmp_path / "a" / preview.FILE)
    assert picture.size == (latents.shape[4] * preview.SCALE, latents.shape[3] * preview.SCALE)
    timings = json.loads((tmp_path / "a" / "run.json").read_text())["timings"]
    spent = timings["preview"]
    assert spent["every"] == 1 and spent["written"] == 3
    assert 0 < spent["fit_s"] <= spent["seconds"]
    ti2v_latents = load_file(tmp_path / "c" / "denoise.safetensors")["latents"]
    assert Image.open(tmp_path / "c" / preview.FILE).size == (
        ti2v_latents.shape[4] * preview.SCALE, ti2v_latents.shape[3] * preview.SCALE)


def test_a_new_denoising_removes_an_earlier_runs_preview(tmp_path):
    from porter.rundir import results

    (tmp_path / preview.FILE).write_bytes(b"an earlier run's picture")
    results.invalidate(tmp_path, ("decode",), keep_progress=False)
    assert (tmp_path / preview.FILE).exists()  # decoding again: the picture stands
    results.invalidate(tmp_path, ("denoise", "decode"), keep_progress=True)
    assert not (tmp_path / preview.FILE).exists()


def test_a_family_without_previews_refuses_them(capsys):
    from porter import cli

    assert cli.main(["validate", str(RECIPES / "cogvideox-tiny.yaml"),
                     "output.preview_every=1"]) == 2
    assert "output.preview_every: family 'cogvideox' makes no live previews" in \
        capsys.readouterr().err
