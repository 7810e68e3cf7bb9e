"""asapmpi for PyTorch (installed as asapmpi.torch; the only code that imports torch).

    from asapmpi.torch import DecentralizedOptimizer
    opt = DecentralizedOptimizer(torch.optim.Adam(model.parameters()), graph="ring",
                                 sync="hop", max_gap=2, backup=1, model=model)
"""
from ..extras import require as _require

# One line naming the pip install when torch is missing, not a traceback from flat.py.
_require("torch", "torch", "asapmpi.torch")

from .flat import FlatParameters, PackedTensors  # noqa: E402
from .optimizer import (  # noqa: E402
    BUFFERS,
    LOCKSTEP,
    MODES,
    DecentralizedOptimizer,
    broadcast_parameters,
)
from .outer import OuterOptimizer  # noqa: E402
from .sampler import ShardSampler  # noqa: E402

__all__ = ["BUFFERS", "LOCKSTEP", "MODES", "DecentralizedOptimizer", "FlatParameters",
           "OuterOptimizer", "PackedTensors", "ShardSampler", "broadcast_parameters"]
