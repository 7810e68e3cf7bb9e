"""Torch state as checkpoint trees (asapmpi.train.checkpoint): tensors become NumPy
arrays, integer keys strings, lists JSON; and back."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import torch


def _array(tensor: torch.Tensor) -> np.ndarray:
    # a copy as NumPy (float16 as it is); bfloat16 (which NumPy lacks) as float32,
    # exactly: loading copies
    # it back into the bfloat16 tensors, and optimizers cast their state to the
    # parameters' dtype
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy().copy()


def module_state(module: torch.nn.Module) -> Dict[str, np.ndarray]:
    """model.state_dict() as {name: array} (copies; bfloat16 as float32)."""
    return {k: _array(v) for k, v in module.state_dict().items()}


def load_module_state(module: torch.nn.Module, tree: Dict[str, Any]) -> None:
    """Copy a module_state() tree into `module`'s tensors, in place (a parameter that
    lives in an exchange buffer stays there)."""
    module.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in tree.items()})


def optimizer_state(state: Dict[str, Any]) -> Dict[str, Any]:
    """An optimizer.state_dict() as a tree: per-parameter state under string keys,
    tensors as arrays, None kept; param_groups as a JSON list."""
    per_param = {}
    for idx, entries in state["state"].items():
        per_param[str(idx)] = {k: _array(v) if torch.is_tensor(v) else v
                               for k, v in entries.items()}
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
              for g in state["param_groups"]]
    return {"state": per_param, "param_groups": groups}


def load_optimizer_state(tree: Dict[str, Any]) -> Dict[str, Any]:
    """The inverse of optimizer_state(): a dict for optimizer.load_state_dict()."""
    state = {int(idx): {k: torch.as_tensor(np.asarray(v)) if isinstance(v, (np.ndarray,
                                                                          np.generic))
                        else v for k, v in entries.items()}
             for idx, entries in tree["state"].items()}
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()}
              for g in tree["param_groups"]]
    return {"state": state, "param_groups": groups}


def rng_state() -> np.ndarray:
    """torch's CPU generator state, as bytes in an array."""
    return torch.get_rng_state().numpy().copy()


def set_rng_state(state: np.ndarray) -> None:
    """Restore rng_state()."""
    torch.set_rng_state(torch.from_numpy(np.asarray(state, dtype=np.uint8).copy()))
