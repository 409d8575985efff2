"""The frozen vision encoder's output per image, kept so an image seen again skips the ViT.

With ``train_vision_encoder: false`` (the tor default) the ViT blocks and the patch embedding
never change, yet every SFT step, rollout prefill and update forward ran them again on the
same pictures: a quarter of a tiny policy's SFT step on CPU, the 4,000-step warm start
showing each of its pictures 8 times. Only the patch merger (the projector into the language
model) trains, so the merger's input is what can be kept: each image's ViT states are
computed once and the merger (with its gradient) runs on them every time. They are kept in the
order the tower hands them to its merger (attention windows) together with the permutation the
tower applies after it, so the merger sees the very rows of the plain forward in the same order
and even its weights' gradients (sums over rows) agree bit for bit.

The model's own ``get_image_features`` is swapped in for the duration of one forward
(``installed``); it is transformers' hook for precomputed encoder outputs' layout
(``pooler_output``: one ``(tokens_i, hidden)`` tensor per image). An image is keyed by its
grid, the autocast state and a SHA-256 of its pixel values; the kept states are dropped
whenever a ViT weight changes (its tensor version moves: an optimizer step,
``load_state_dict``), and nothing is kept while any ViT weight requires grad, on a GPU
(hashing would copy the pixels to the host for a ViT that is fast there) or under FSDP.

Shape symbols: ``N`` patches of an image (``t * h * w``), ``u`` patches per merged token
(``spatial_merge_size ** 2``), ``H`` the ViT width, ``D`` values per patch.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from transformers.modeling_outputs import BaseModelOutputWithPooling

from creditflow.rollout.kept import KeptByBytes, tensor_bytes

# The tor default's 8,000 training pictures keep 8,000 x 64 x 32 float32 = 66 MB.
DEFAULT_MAX_BYTES = 2**30


def vision_owner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The submodule that runs the vision tower inside the model's forward (a
    ``Qwen2_5_VLModel``: ``visual`` and ``get_image_features``), or None."""
    for module in model.modules():
        if hasattr(module, "visual") and hasattr(module, "get_image_features"):
            if hasattr(getattr(module.visual, "merger", None), "forward"):
                return module
    return None


class FrozenVisionFeatures:
    """Pre-merger ViT states of the images a policy has seen, least recently used dropped
    beyond ``max_bytes``.

    Args:
        model: the policy's model (a Qwen2.5-VL-style ``transformers`` model).
        max_bytes: budget of the kept states.
    """

    def __init__(self, model: torch.nn.Module, max_bytes: int = DEFAULT_MAX_BYTES):
        self.model = model
        self.owner = vision_owner(model)
        # key -> ((N, H) states in window order, (N / u,) natural-order permutation)
        self._kept: KeptByBytes[tuple[torch.Tensor, torch.Tensor]] = KeptByBytes(
            max_bytes, tensor_bytes
        )
        self._stamp: tuple | None = None

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def max_bytes(self) -> int:
        return self._kept.max_bytes

    @property
    def hits(self) -> int:
        return self._kept.hits

    @property
    def misses(self) -> int:
        return self._kept.misses

    # ------------------------------------------------------------------ when it applies
    def _frozen_parameters(self) -> list[torch.nn.Parameter]:
        merger = set(map(id, self.owner.visual.merger.parameters()))
        return [p for p in self.owner.visual.parameters() if id(p) not in merger]

    def applies(self) -> bool:
        """Whether the cache may serve: a budget, a vision tower with a merger, every other ViT
        weight frozen, on the CPU, no FSDP."""
        if self.max_bytes <= 0 or self.owner is None or isinstance(self.model, FSDPModule):
            return False
        frozen = self._frozen_parameters()
        if not frozen or any(p.requires_grad for p in frozen):
            return False
        return all(p.device.type == "cpu" for p in frozen)

    def _check_weights(self) -> None:
        """Drop every kept state when a ViT weight changed since they were computed."""
        stamp = tuple((p.data_ptr(), p._version) for p in self._frozen_parameters())
        if stamp != self._stamp:
            self._kept.clear()
            self._stamp = stamp

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """For the forwards run inside: the model's image features from the kept states (a
        no-op when ``applies()`` is false)."""
        if not self.applies():
            yield
            return
        self._check_weights()
        owner = self.owner
        owner.get_image_features = self.image_features  # the instance attribute shadows it
        try:
            yield
        finally:
            del owner.get_image_features

    # ------------------------------------------------------------------ features
    def image_features(
        self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor, **kwargs: Any
    ) -> BaseModelOutputWithPooling:
        """What ``get_image_features`` returns (``pooler_output``: a tuple of ``(N_i / u,
        out)`` merged image embeddings, in the model's order), the ViT run only on images not
        kept and the merger on all of them.

        Args:
            pixel_values: ``(sum_i N_i, D)``, the images' patches one after the other.
            image_grid_thw: ``(I, 3)``.
        """
        visual = self.owner.visual
        counts = image_grid_thw.prod(dim=-1).tolist()
        # States computed under bf16 autocast differ from float32 ones: the autocast state is
        # part of the key, so a policy used both ways never serves one for the other.
        device = pixel_values.device.type
        precision = (torch.is_autocast_enabled(device), str(torch.get_autocast_dtype(device)))
        keys = [
            (tuple(grid), str(pixel_values.dtype), precision, _digest(chunk))
            for grid, chunk in zip(
                image_grid_thw.tolist(), torch.split(pixel_values, counts), strict=True
            )
        ]
        chunks = torch.split(pixel_values.type(visual.dtype), counts)

        def run_vit(rows: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
            pixels = torch.cat([chunks[i] for i in rows])
            return vit_states(visual, pixels, image_grid_thw[rows], **kwargs)

        kept = self._kept.lookup(keys, run_vit)
        merged = visual.merger(torch.cat([states for states, _ in kept]))  # (sum N_i / u, out)
        pieces = torch.split(merged, [n // visual.spatial_merge_size**2 for n in counts])
        pieces = tuple(piece[order] for piece, (_, order) in zip(pieces, kept, strict=True))
        return BaseModelOutputWithPooling(last_hidden_state=None, pooler_output=pieces)


def vit_states(
    visual: torch.nn.Module, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor, **kwargs
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per image, the ``(N_i, H)`` states the ViT hands its merger, in the tower's window
    order, and the ``(N_i / u,)`` permutation that puts the merged rows into the image's own
    order (``visual.merger(states)[order]`` is the image's features).

    The tower runs as the model runs it, with the merger's output replaced for this call by a
    marker: the tower reorders patches into attention windows (image by image, each within its
    own rows) before its blocks and restores the order after the merger, so each output row
    names the window-order group it came from. No transformers internals are re-derived.
    """
    captured: list[torch.Tensor] = []
    unit = visual.spatial_merge_size**2

    def mark(merger: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        hidden = args[0]  # (sum N_i, H), window order
        captured.append(hidden)
        groups = hidden.shape[0] // unit
        return torch.arange(groups, dtype=torch.float64, device=hidden.device)[:, None]

    handle = visual.merger.register_forward_hook(mark)
    try:
        with torch.no_grad():
            out = visual(pixel_values, grid_thw=image_grid_thw, **kwargs)
    finally:
        handle.remove()
    (hidden,) = captured
    order = out.pooler_output[:, 0].long()  # (groups,): window-order group per output row
    counts = image_grid_thw.prod(dim=-1).tolist()
    entries = []
    first_group = 0
    for state, count in zip(torch.split(hidden, counts), counts, strict=True):
        groups = count // unit
        local = order[first_group : first_group + groups] - first_group
        entries.append((state.clone(), local.clone()))
        first_group += groups
    return entries


def _digest(chunk: torch.Tensor) -> bytes:
    data = chunk.detach().contiguous().reshape(-1).view(torch.uint8)  # any dtype, bf16 too
    return hashlib.sha256(memoryview(data.numpy())).digest()
