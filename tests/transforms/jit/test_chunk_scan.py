"""A loop over chunks carrying a cache runs as one lax.scan once the cache settles
(porter.transforms.jit.chunk_scan), and Wan's VAE decodes and encodes that way
(wan.vae_decode_scan, wan.vae_encode_scan) with the values diffusers computes."""

import contextlib
import copy

import numpy as np
import pytest
import torch

from porter.shims.compat import import_torchax
from porter.transforms.jit import chunk_scan


def _step(cache: list, calls: list):
    """A causal running filter over rows: each call reads the rows the cache kept
    (growing from empty, as a causal VAE's) and keeps one row more than its piece has,
    and a marker in slot 1 after the first call only."""
    def step(piece, first: bool):
        calls.append(first)
        if first:
            cache[1] = "started"
        elif cache[1] == "started":
            cache[1] = None
        history = piece if cache[0] is None else torch.cat([cache[0], piece], 0)
        cache[0] = history[-(piece.shape[0] + 1):]
        return history.sum(0, keepdim=True) * (2.0 if first else 1.0)
    return step


def _run(pieces, jit: bool):
    tx = import_torchax()
    cache, calls = [None, None], []
    env = tx.default_env()
    with env:
        if not jit:
            out = chunk_scan.run(pieces, _step(cache, calls), cache)
            return torch.cat(out), calls, None
        jax_pieces = [env.to_xla(p) for p in pieces]

        def program(*arrays):
            return tx.interop.jax_view(torch.cat(chunk_scan.run(
                list(tx.interop.torch_view(arrays)), _step(cache, calls), cache)))

        import jax
        lowered = jax.jit(program).lower(*[p.jax() for p in jax_pieces])
        out = lowered.compile()(*[p.jax() for p in jax_pieces])
    return torch.from_numpy(np.array(out)), calls, lowered.as_text()


def test_the_settled_loop_runs_as_one_scan_with_the_loops_values():
    pieces = [torch.arange(6.0).reshape(1, 6) + 10 * i for i in range(7)]
    expected, calls, _ = _run(pieces, jit=False)  # plain PyTorch: the loop as written
    assert calls == [True] + [False] * 6
    got, calls, text = _run(pieces, jit=True)
    torch.testing.assert_close(got, expected)
    # the cache grows for two calls and holds its shape from the third on: three calls
    # traced one by one, one traced as the scan's body for the other four
    assert calls == [True, False, False, False]
    assert text.count("stablehlo.while") == 1


def test_a_piece_of_another_shape_ends_the_scan():
    pieces = [torch.ones(1, 4) * i for i in range(6)] + [torch.ones(2, 4)]
    expected, _, _ = _run(pieces, jit=False)
    got, calls, text = _run(pieces, jit=True)
    torch.testing.assert_close(got, expected)
    assert len(calls) == 5 and text.count("stablehlo.while") == 1  # 3, a body, the last


def test_the_scan_runs_only_over_pieces_of_the_settled_calls_shape():
    # the third one-row piece leaves the cache settled, but two-row pieces follow:
    # their calls leave a cache of three rows, not two, so they may not be its scan
    pieces = [torch.ones(1, 6) * i for i in range(3)] + [torch.ones(2, 6) * 7] * 2 + \
        [torch.ones(1, 6) * i for i in range(5)]
    expected, _, _ = _run(pieces, jit=False)
    got, calls, text = _run(pieces, jit=True)
    torch.testing.assert_close(got, expected)
    # 3 one by one, the 2 two-row pieces, 2 to settle again, one body for the last 3
    assert len(calls) == 8 and text.count("stablehlo.while") == 1


def test_a_cache_that_never_settles_runs_the_loop_as_written():
    def growing(piece, first, cache, calls):
        calls.append(first)
        cache[0] = piece if cache[0] is None else torch.cat([cache[0], piece], 0)
        return cache[0].sum(0, keepdim=True)

    tx = import_torchax()
    cache, calls = [None], []
    with tx.default_env():
        pieces = [tx.default_env().to_xla(torch.ones(1, 3) * i) for i in range(5)]
        out = chunk_scan.run(pieces, lambda p, f: growing(p, f, cache, calls), cache)
        total = float(out[-1].sum())  # torchax values are read inside their environment
    assert len(calls) == 5 and total == 30.0


def test_plain_pytorch_runs_the_loop_as_written():
    pieces = [torch.arange(4.0).reshape(1, 4) * i for i in range(6)]
    cache, calls = [None, None], []
    out = chunk_scan.run(pieces, _step(cache, calls), cache)
    loop_cache = [None, None]
    step = _step(loop_cache, [])
    expected = [step(piece, i == 0) for i, piece in enumerate(pieces)]  # the loop itself
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    assert calls == [True] + [False] * 5 and loop_cache[0].shape == cache[0].shape


def _wan_vae(spec):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    return AutoencoderKLWan(**spec).eval()


@pytest.mark.parametrize("spec", ["VAE_16", "VAE_48"])
def test_wan_vae_scanned_decodes_and_encodes_as_diffusers_does(spec):
    """Against diffusers' own decode and encode (plain PyTorch, the loop as written),
    compiled whole as a run compiles them: the same values, and fewer convolutions
    for the compiler (Wan 2.1's VAE and Wan 2.2's patchified one)."""
    import jax

    from porter_wan import tiny
    from porter_wan.patches import VAE_DECODE_SCAN, VAE_ENCODE_SCAN

    vae = _wan_vae(getattr(tiny, spec))
    latents = torch.randn(1, vae.config.z_dim, 7, 8, 8)
    video = torch.randn(1, 3, 17, 64, 64)
    with torch.no_grad():
        decoded = vae.decode(latents).sample.numpy()
        encoded = vae.encode(video).latent_dist.mean.numpy()
    tx = import_torchax()
    env = tx.default_env()
    with env:
        jittable = tx.interop.JittableModule(copy.deepcopy(vae).to("jax"))
    params = tx.interop.jax_view(jittable.params)
    buffers = tx.interop.jax_view(jittable.buffers)

    def compiled(method, value, patched: bool):
        def program(p, b, x):
            out = jittable.functional_call(method, p, b, x)
            return out.sample if method == "decode" else out.latent_dist.mean
        with contextlib.ExitStack() as stack:
            if patched:
                stack.enter_context(VAE_DECODE_SCAN.applied())
                stack.enter_context(VAE_ENCODE_SCAN.applied())
            with env, torch.no_grad():
                lowered = jax.jit(tx.interop.jax_view(program)).lower(
                    params, buffers, env.to_xla(value).jax())
                out = lowered.compile()(params, buffers, env.to_xla(value).jax())
        return np.asarray(out), lowered.as_text()

    for method, value, reference in (("decode", latents, decoded),
                                     ("encode", video, encoded)):
        plain, plain_text = compiled(method, value, patched=False)
        scanned, text = compiled(method, value, patched=True)
        # float32, computed in another order: diffusers' loop compiled gets within 2e-5
        np.testing.assert_allclose(scanned, reference, atol=5e-5, rtol=0, err_msg=method)
        np.testing.assert_allclose(scanned, plain, atol=5e-5, rtol=0, err_msg=method)
        assert text.count("stablehlo.while") == 1, method
        assert text.count("stablehlo.convolution") < plain_text.count(
            "stablehlo.convolution"), method


def test_wan_vae_tiled_or_on_pytorch_runs_diffusers_loop(monkeypatch):
    from porter_wan.patches import VAE_DECODE_SCAN, VAE_ENCODE_SCAN
    from porter_wan.tiny import VAE_16

    vae = _wan_vae(VAE_16)
    latents, video = torch.randn(1, 16, 3, 8, 8), torch.randn(1, 3, 5, 32, 32)
    with torch.no_grad():
        decoded, encoded = vae.decode(latents).sample, vae.encode(video).latent_dist.mean
    with VAE_DECODE_SCAN.applied(), VAE_ENCODE_SCAN.applied(), torch.no_grad():
        # plain PyTorch: the original, to the bit
        assert torch.equal(vae.decode(latents).sample, decoded)
        assert torch.equal(vae.encode(video).latent_dist.mean, encoded)
        # tiled, on JAX: diffusers' tile loop, never the scan. Tiles that do not
        # overlap all have one shape, so the eager ops compile once, not per tile
        monkeypatch.setattr(chunk_scan, "run", None)
        vae.enable_tiling(tile_sample_min_height=16, tile_sample_min_width=16,
                          tile_sample_stride_height=16, tile_sample_stride_width=16)
        tx = import_torchax()
        env = tx.default_env()
        with env:
            on_jax = copy.deepcopy(vae).to("jax")
            tiled = on_jax.decode(env.to_xla(latents)).sample
        assert tiled.shape == decoded.shape
