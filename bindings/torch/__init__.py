"""asapmpi for PyTorch (installed as asapmpi.torch; the only code that imports torch).

    from asapmpi.torch import DecentralizedOptimizer
    opt = DecentralizedOptimizer(torch.optim.Adam(model.parameters()), graph="ring",
                                 sync="hop", max_gap=2, backup=1)
"""
from .flat import FlatParameters
from .optimizer import MODES, DecentralizedOptimizer, broadcast_parameters

__all__ = ["MODES", "DecentralizedOptimizer", "FlatParameters", "broadcast_parameters"]
