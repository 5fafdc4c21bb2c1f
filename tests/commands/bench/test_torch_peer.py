"""The torch.compile peer runs in a process of its own, so torchax in the parent (which
names PyTorch's out-of-tree device "jax") cannot break TorchDynamo."""

import torch

from porter.commands.bench import torch_peer
from porter.shims import compat


class Scaled(torch.nn.Module):
    """A model called as diffusers' transformers are (``return_dict=False``)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, return_dict=True):
        return (torch.relu(self.linear(x)) * 2,)


def test_torch_compile_times_the_model_beside_torchax():
    # as porter bench has it: PyTorch's out-of-tree device is "jax" in this process
    # (here, not at the module's top: the child imports this module to unpickle Scaled)
    compat.import_torchax()
    result = torch_peer.compiled_step(Scaled(), {"x": torch.randn(4, 8)}, "cpu", 2)
    assert "error" not in result, result
    assert result["first_call_s"] > 0 and result["step_s"] > 0


def test_a_peer_that_fails_is_reported_not_raised():
    result = torch_peer.compiled_step(Scaled(), {"y": torch.randn(4, 8)}, "cpu", 1)
    assert "forward() got an unexpected keyword argument 'y'" in result["error"]
