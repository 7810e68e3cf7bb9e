"""asapmpi for PyTorch (installed as asapmpi.torch; the only code that imports torch).

    from asapmpi.torch import DecentralizedOptimizer
    opt = DecentralizedOptimizer(torch.optim.Adam(model.parameters()), graph="ring",
                                 sync="hop", max_gap=2, backup=1, model=model)
"""
from .flat import FlatParameters, PackedTensors
from .optimizer import BUFFERS, LOCKSTEP, MODES, DecentralizedOptimizer, broadcast_parameters

__all__ = ["BUFFERS", "LOCKSTEP", "MODES", "DecentralizedOptimizer", "FlatParameters",
           "PackedTensors", "broadcast_parameters"]
