"""diffusers' model packages import a model when it is asked for, and a model module
first imported under torch's meta device still makes real module-level tensors
(``porter.shims.model_imports``, installed by ``import porter``). Each case in a fresh
process: this one has imported its models already."""

import json
import os
import subprocess
import sys

from porter.shims import model_imports

from support import RECIPES

ASKED = """
import json, sys
import porter, torch
from diffusers import WanTransformer3DModel
import diffusers.models.transformers as transformers
found = {"loaded": sorted(m for m in sys.modules if m.startswith("diffusers.models.")
                          and m.rsplit(".", 1)[-1].startswith(("transformer_", "autoencoder_")))}
found["listed"] = "HunyuanVideoTransformer3DModel" in dir(transformers)
found["named"] = transformers.HunyuanVideoTransformer3DModel.__name__
found["submodule"] = transformers.cogvideox_transformer_3d.__name__
try:
    transformers.NoSuchModel
except AttributeError as error:
    found["missing"] = str(error)
with torch.device("meta"):  # imported for the first time inside a meta build
    from diffusers.models.autoencoders import autoencoder_kl_cosmos
tensors = [t for value in vars(autoencoder_kl_cosmos).values()  # _WAVELETS: a dict
           for t in (value.values() if isinstance(value, dict) else [value])
           if isinstance(t, torch.Tensor)]
found["tensors"], found["meta"] = len(tensors), sum(t.is_meta for t in tensors)
# SciPy's statistics, imported by every scheduler module, run at their first use
from diffusers.schedulers import scheduling_unipc_multistep as unipc
found["statistics run"] = "scipy.stats._stats_py" in sys.modules
scheduler = unipc.UniPCMultistepScheduler(use_beta_sigmas=True)
scheduler.set_timesteps(4)  # beta sigmas: scipy.stats.beta
found["beta sigmas"] = [round(float(s), 3) for s in scheduler.sigmas[:2]]
found["statistics run after"] = "scipy.stats._stats_py" in sys.modules
print(json.dumps(found))
"""


BETA_SIGMAS = """
import json
from diffusers.schedulers import scheduling_unipc_multistep as unipc
scheduler = unipc.UniPCMultistepScheduler(use_beta_sigmas=True)
scheduler.set_timesteps(4)
print(json.dumps([round(float(s), 3) for s in scheduler.sigmas[:2]]))
"""


def _fresh(code: str, *args, env=None) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_model_is_imported_when_asked_for_with_real_tensors():
    found = _fresh(ASKED)
    # Wan's transformer alone of the package's models (its module imports the
    # attention processors it uses, not the other models)
    assert found["loaded"] == ["diffusers.models.transformers.transformer_wan"]
    assert found["listed"] and found["named"] == "HunyuanVideoTransformer3DModel"
    assert found["submodule"] == "diffusers.models.transformers.cogvideox_transformer_3d"
    assert "has no attribute 'NoSuchModel'" in found["missing"]
    # the Cosmos VAE's wavelets, made at its module's import, have values
    assert found["tensors"] > 0 and found["meta"] == 0
    # SciPy's statistics: imported with the schedulers, run when a scheduler needs them
    assert not found["statistics run"] and found["statistics run after"]
    assert found["beta sigmas"] == _fresh(BETA_SIGMAS)  # as without Porter


VALIDATED = """
import json, runpy, sys
sys.argv = ["porter", "validate", sys.argv[1]]
try:
    runpy.run_module("porter.cli", run_name="__main__")
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
print(json.dumps(sorted(m for m in sys.modules if m.startswith(
    ("diffusers.models.transformers.", "diffusers.models.autoencoders.",
     "diffusers.models.unets.", "diffusers.models.controlnets.")))))
"""


def test_validating_a_wan_recipe_imports_wans_models_alone(tmp_path):
    """The import set of `porter validate` on a tiny Wan recipe that builds its model
    (an empty cache: no kept sketch of it): its transformer and VAE and what they
    import, no other family's model (each of which the packages used to import, a
    second or more before any check)."""
    imported = _fresh(VALIDATED, str(RECIPES / "wan-tiny.yaml"),
                      env={"PORTER_CACHE_DIR": str(tmp_path)})
    # Wan's VAE module imports diffusers' shared VAE blocks (vae, autoencoder_kl and
    # the UNet blocks they are built of, which import the 2-D transformers)
    assert imported == [f"diffusers.models.{name}" for name in (
        "autoencoders.autoencoder_kl", "autoencoders.autoencoder_kl_wan", "autoencoders.vae",
        "transformers.dual_transformer_2d", "transformers.transformer_2d",
        "transformers.transformer_wan", "unets.unet_2d_blocks")]


def test_a_packages_names_come_from_its_init_unrun():
    source = ("from ...utils import is_torch_available\n"
              "if is_torch_available():\n"
              "    from .transformer_wan import WanTransformer3DModel\n"
              "    from .transformer_2d import Transformer2DModel as Alias\n"
              "from .dummies import *\n")
    assert model_imports.defined_names(source) == {
        "WanTransformer3DModel": ("transformer_wan", "WanTransformer3DModel"),
        "Alias": ("transformer_2d", "Transformer2DModel")}
