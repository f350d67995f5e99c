"""Rows of several 2-D arrays read as one matrix without copying them: a loaded namespace's vectors, segment by segment.

Each segment's vectors are a view of its memory-mapped sidecar. Concatenating them copies every byte into the
process (gigabytes at a million units, most of it never read by a query); a :class:`RowStack` keeps the views and
answers what retrieval asks of a vector matrix (its length and shape, a gather of rows, a product with a vector,
its blocks for encoding codes), so a load reads only what its queries touch. Anything else converts it with
``np.asarray``, which concatenates, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class RowStack:
    """The rows of ``blocks`` one after the other, each block a 2-D array of the same width and dtype (not copied)."""

    def __init__(self, blocks: Sequence[np.ndarray]):
        if not blocks:
            raise ValueError("a row stack needs at least one block")
        widths, dtypes = {b.shape[1:] for b in blocks}, {b.dtype for b in blocks}
        if len(widths) != 1 or len(dtypes) != 1 or blocks[0].ndim != 2:
            raise ValueError(f"blocks of one width and dtype needed, got shapes {[b.shape for b in blocks]} and dtypes {dtypes}")
        self.blocks = list(blocks)
        self.ends = np.cumsum([len(b) for b in self.blocks], dtype=np.int64)
        self.starts = self.ends - [len(b) for b in self.blocks]

    @classmethod
    def of(cls, blocks: Sequence[np.ndarray]) -> np.ndarray | RowStack:
        """The one block itself, or a stack of several."""
        return blocks[0] if len(blocks) == 1 else cls(blocks)

    def __len__(self) -> int:
        return int(self.ends[-1])

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), self.blocks[0].shape[1]

    @property
    def dtype(self) -> np.dtype:
        return self.blocks[0].dtype

    @property
    def ndim(self) -> int:
        return 2

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    def __getitem__(self, rows: np.ndarray | slice | int) -> np.ndarray:
        """The rows at ``rows`` (indices, a boolean mask, a slice or one index), gathered into a new array."""
        if isinstance(rows, (int, np.integer)):
            return self[np.asarray([rows])][0]
        if isinstance(rows, tuple):
            raise TypeError("a row stack is indexed by rows only; use np.asarray(stack) for other indexing")
        rows = np.arange(len(self))[rows] if isinstance(rows, slice) else np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        rows = rows.astype(np.int64, copy=False)
        if len(rows) and (rows.min() < -len(self) or rows.max() >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} rows")
        rows = np.where(rows < 0, rows + len(self), rows)
        block = np.searchsorted(self.ends, rows, side="right")
        order = np.argsort(block, kind="stable")  # the rows of each block together: one slice per block touched
        present, first = np.unique(block[order], return_index=True)
        out = np.empty((len(rows), self.shape[1]), self.dtype)
        for b, lo, hi in zip(present.tolist(), first.tolist(), [*first[1:].tolist(), len(rows)]):
            at = order[lo:hi]
            out[at] = self.blocks[b][rows[at] - self.starts[b]]
        return out

    def __matmul__(self, other: np.ndarray) -> np.ndarray:
        """``np.asarray(self) @ other``, block by block."""
        return np.concatenate([b @ other for b in self.blocks])

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """The rows concatenated (a copy)."""
        out = np.concatenate(self.blocks)
        return out if dtype is None else out.astype(dtype, copy=False)


def row_blocks(matrix: np.ndarray | RowStack) -> list[np.ndarray]:
    """The blocks of a :class:`RowStack`, or the array alone."""
    return matrix.blocks if isinstance(matrix, RowStack) else [matrix]
