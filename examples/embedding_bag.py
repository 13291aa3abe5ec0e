"""Sparse 64-bit IDs -> embedding rows -> EmbeddingBag, in a training step compiled with fullgraph=True.

A toy click model: every sample is a bag of raw item IDs (random 64-bit values, as hashed features are);
IdToRow maps them to the rows of an nn.EmbeddingBag (unknown IDs to a shared out-of-vocabulary row), a
linear layer scores the pooled embedding, and a few SGD steps fit random labels. The forward pass and the
loss, IdToRow's lookup included (a CgRXIndex, its default), are one graph compiled with
torch.compile(fullgraph=True); backward runs the graph AOTAutograd compiled alongside it, and the optimizer
step stays eager. Runs on CUDA when available, else on the CPU.

    python3 examples/embedding_bag.py
"""

from __future__ import annotations

import torch

from torch_rtindex import IdToRow


class ClickModel(torch.nn.Module):
    """Bags of raw IDs -> pooled embeddings -> one logit per bag."""

    def __init__(self, table_ids: torch.Tensor, dim: int) -> None:
        super().__init__()
        num_rows = table_ids.numel() + 1  # the last row is shared by every unknown ID
        self.id_to_row = IdToRow(table_ids, miss="default", default_row=num_rows - 1)
        self.bag = torch.nn.EmbeddingBag(num_rows, dim, mode="mean")
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, raw_ids: torch.Tensor) -> torch.Tensor:
        rows = self.id_to_row(raw_ids)  # [batch, bag] raw IDs -> [batch, bag] rows
        return self.head(self.bag(rows)).squeeze(-1)


def main(
    num_ids: int = 10_000, dim: int = 16, batch: int = 256, bag: int = 8, steps: int = 5, seed: int = 0
) -> list[float]:
    """Runs ``steps`` compiled SGD steps on random data; returns the loss of each step."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    table_ids = torch.randint(-(2**63), 2**63 - 1, (num_ids,), generator=gen, dtype=torch.int64)
    model = ClickModel(table_ids, dim).to(device)  # .to() moves the IDs buffer; IdToRow re-indexes it there
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def loss_fn(raw_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.binary_cross_entropy_with_logits(model(raw_ids), labels)

    compiled_loss = torch.compile(loss_fn, fullgraph=True)

    # A fixed data set: 90% of the IDs from the table, 10% unknown ones; labels depend on the IDs.
    known = table_ids[torch.randint(0, num_ids, (batch, bag), generator=gen)]
    unknown = torch.randint(-(2**63), 2**63 - 1, (batch, bag), generator=gen, dtype=torch.int64)
    raw_ids = torch.where(torch.rand(batch, bag, generator=gen) < 0.9, known, unknown).to(device)
    labels = raw_ids[:, 0].remainder(2).float()

    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = compiled_loss(raw_ids, labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.4f}")
    return losses


if __name__ == "__main__":
    main()
