"""Argument checks shared by the algorithm modules; each raises ValueError saying what was
expected."""

import torch


def check_ndim(name: str, tensor: torch.Tensor, ndim: int, shape_doc: str) -> None:
    """Raise unless ``tensor`` has ``ndim`` dimensions (``shape_doc`` names them, e.g. ``(B, T)``)."""
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got {tuple(tensor.shape)}")


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise unless every given tensor has the same shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"expected tensors of one shape, got {listed}")


def check_unit_interval(name: str, value: float) -> None:
    """Raise unless ``0 <= value <= 1``."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def check_choice(kind: str, name: str, valid: "list[str] | tuple[str, ...]") -> None:
    """Raise unless ``name`` is one of ``valid``, listing the valid names."""
    if name not in valid:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")
