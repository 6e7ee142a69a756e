"""A table of classification predictions (id, image, guess, truth, class scores) for the trackers.

Every backend gets the same plain data: 8-bit images and Python/NumPy numbers, converted once
here, on the caller's thread, so no tracker thread ever touches a (possibly CUDA) tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Predictions:
    """Rows of a predictions table. Build it with :meth:`from_logits`.

    ``images[i]`` is uint8, ``H x W`` (grey) or ``H x W x 3``; ``scores`` is ``rows x classes``
    (softmax probabilities); ``guesses`` and ``truths`` are class indices.
    """

    ids: tuple[Any, ...]
    images: tuple[np.ndarray, ...]
    guesses: tuple[int, ...]
    truths: tuple[int, ...]
    scores: np.ndarray
    class_names: tuple[str, ...] | None = None
    """One per class; without them guesses and truths show as class indices."""

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def columns(self) -> list[str]:
        """``id, image, guess, truth, score_<class>...``: the layout of every backend's table."""
        names = self.class_names or range(self.scores.shape[1])
        return ["id", "image", "guess", "truth", *(f"score_{name}" for name in names)]

    def label(self, index: int) -> str | int:
        """A class index as the table shows it: its name when names were given, else the index."""
        return self.class_names[index] if self.class_names else index

    def rows(self) -> list[tuple[Any, np.ndarray, Any, Any, list[float]]]:
        """``(id, image, guess, truth, scores)`` per row."""
        return [
            (
                self.ids[i],
                self.images[i],
                self.label(self.guesses[i]),
                self.label(self.truths[i]),
                self.scores[i].tolist(),
            )
            for i in range(len(self))
        ]

    def head(self, count: int) -> Predictions:
        """The first ``count`` rows."""
        return Predictions(
            self.ids[:count],
            self.images[:count],
            self.guesses[:count],
            self.truths[:count],
            self.scores[:count],
            self.class_names,
        )

    @classmethod
    def from_logits(
        cls,
        logits: Any,
        targets: Any,
        images: Any,
        *,
        ids: Sequence[Any] | None = None,
        class_names: Sequence[str] | None = None,
    ) -> Predictions:
        """Rows from a model's outputs on a batch: scores are the softmax of ``logits``.

        Args:
            logits: ``rows x classes`` (a tensor, on any device, or an array).
            targets: the true class indices (``rows``).
            images: what to show per row: ``rows x H x W``, ``rows x C x H x W`` or
                ``rows x H x W x C`` with C in (1, 3); floats in [0, 1] are scaled by 255, other
                floats (normalised inputs) are stretched from their own min..max to 0..255.
            ids: one id per row (default ``0..rows-1``): e.g. the samples' indices in the test set.
            class_names: one per class (default the class indices).
        """
        raw = _numpy(logits).astype(np.float64)
        if raw.ndim != 2:
            raise ValueError(f"logits must be rows x classes, got shape {raw.shape}")
        shifted = np.exp(raw - raw.max(axis=1, keepdims=True))
        scores = shifted / shifted.sum(axis=1, keepdims=True)
        truths = _numpy(targets).astype(np.int64).reshape(-1)
        pictures = _numpy(images)
        rows = raw.shape[0]
        if len(truths) != rows or len(pictures) != rows:
            raise ValueError(f"logits, targets and images disagree on the rows: {rows}, {len(truths)}, {len(pictures)}")
        names = tuple(class_names) if class_names is not None else None
        if names is not None and len(names) != raw.shape[1]:
            raise ValueError(f"{len(names)} class names for {raw.shape[1]} classes")
        return cls(
            ids=tuple(ids) if ids is not None else tuple(range(rows)),
            images=tuple(to_uint8_image(picture) for picture in pictures),
            guesses=tuple(int(g) for g in scores.argmax(axis=1)),
            truths=tuple(int(t) for t in truths),
            scores=scores,
            class_names=names,
        )


def to_uint8_image(image: Any) -> np.ndarray:
    """One image as uint8 ``H x W`` or ``H x W x 3`` (see :meth:`Predictions.from_logits`)."""
    array = _numpy(image)
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)  # channels first -> channels last
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] != 3):
        raise ValueError(f"an image must be H x W, or have 1 or 3 channels; got shape {array.shape}")
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if np.issubdtype(array.dtype, np.floating):
        low, high = float(np.nanmin(array)), float(np.nanmax(array))
        if low >= 0.0 and high <= 1.0:
            array = array * 255.0
        elif high > low:
            array = (array - low) * (255.0 / (high - low))
        else:
            array = np.zeros_like(array)
    return np.ascontiguousarray(np.clip(np.rint(array), 0, 255).astype(np.uint8))


def _numpy(value: Any) -> np.ndarray:
    """An array from a tensor (any device, detached) or anything NumPy takes."""
    if hasattr(value, "detach"):
        value = value.detach()
        if getattr(value, "is_floating_point", lambda: False)():
            value = value.float()  # bf16/fp16 have no NumPy dtype
        value = value.cpu().numpy()
    return np.asarray(value)
