"""An embedding matrix trained only on some of its rows (`trainer.models.tool_model`: the few thousand tokens the
episodes use, of Qwen's 151k), so that AdamW's step stays small."""

from __future__ import annotations

__all__ = ["TrainableRows"]


class TrainableRows:
    """An embedding matrix trained only on the rows of tokens the episodes use (a few thousand of 151k): the rest
    stays frozen, which keeps AdamW's step small. `commit()` writes the learned rows back."""

    def __init__(self, weight, rows: list[int]) -> None:
        import torch

        self.weight = weight
        weight.requires_grad_(False)
        self.rows = torch.tensor(rows, dtype=torch.long)
        self.slot = torch.full((weight.shape[0],), len(rows), dtype=torch.long)  # len(rows): a frozen row
        self.slot[self.rows] = torch.arange(len(rows))
        self.delta = torch.nn.Parameter(torch.zeros(len(rows), weight.shape[1]))

    def __call__(self, ids):
        import torch

        padded = torch.cat([self.delta, self.delta.new_zeros(1, self.delta.shape[1])])
        return self.weight[ids] + padded[self.slot[ids]]

    def commit(self) -> None:
        import torch

        with torch.no_grad():
            self.weight[self.rows] += self.delta
        self.weight.requires_grad_(True)
