"""Values computed once per key and kept within a byte budget, least recently used out first:
the home of the vision-language policy's two caches (``prompt_cache``: processor outputs per
prompt; ``vision_cache``: frozen-ViT states per picture).

``functools.lru_cache`` bounds entries, not bytes, and computes one key at a time; both caches
need a byte budget and the missing keys of a batch computed in one call (one processor call,
one ViT forward), as the uncached path computes them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

import torch

Value = TypeVar("Value")


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes the tensors' elements take (a kept value's size)."""
    return sum(t.numel() * t.element_size() for t in tensors)


class KeptByBytes(Generic[Value]):
    """Values by key, the least recently used dropped once their ``nbytes`` sum passes
    ``max_bytes``; ``hits`` and ``misses`` count the keys served each way (a key repeated
    within one ``lookup`` counts once)."""

    def __init__(self, max_bytes: int, nbytes: Callable[[Value], int]):
        self.max_bytes = max_bytes
        self.nbytes = nbytes
        self._values: OrderedDict[Hashable, Value] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._values)

    def clear(self) -> None:
        self._values.clear()
        self._bytes = 0

    def lookup(
        self, keys: Sequence[Hashable], compute: Callable[[list[int]], list[Value] | None]
    ) -> list[Value] | None:
        """The value of each key: kept ones as kept, the others from one call
        ``compute(indices)`` (the index of each missing key's first place in ``keys``; it
        returns their values in that order) and then kept. None, and nothing kept, when
        ``compute`` returns None (the caller's sign that the values cannot be cached)."""
        found: dict[Hashable, Value] = {}
        first_missing: dict[Hashable, int] = {}  # each key not kept -> its first index
        for i, key in enumerate(keys):
            if key in found or key in first_missing:
                continue
            value = self._values.get(key)
            if value is None:
                first_missing[key] = i
            else:
                found[key] = value
                self._values.move_to_end(key)
        if first_missing:
            computed = compute(list(first_missing.values()))
            if computed is None:
                return None
            for key, value in zip(first_missing, computed, strict=True):
                found[key] = value
                self._keep(key, value)
        self.hits += len(found) - len(first_missing)
        self.misses += len(first_missing)
        return [found[key] for key in keys]

    def _keep(self, key: Hashable, value: Value) -> None:
        size = self.nbytes(value)
        if size > self.max_bytes:
            return
        self._values[key] = value
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, dropped = self._values.popitem(last=False)
            self._bytes -= self.nbytes(dropped)
