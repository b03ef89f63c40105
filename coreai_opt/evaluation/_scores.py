"""A trial's KL divergence, NLL and top-1 agreement against the reference's, read off the
difference of its logits from the reference's (`Reference.against`), or off that difference kept
as its factors, a piece of the vocabulary at a time (`Reference.against_head`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._deltas import FactoredChange
    from ._tokens import Windows


class Reference:
    """The reference's scored rows of one batch, kept so that a trial's divergence is read off the
    difference d = z - z_ref of its logits from the reference's (exact where they are close): with
    p the reference's probabilities and m their sum (1 up to rounding),
    lse(z) = lse(z_ref) + log(sum p e^d / m) and KL = m (lse(z) - lse(z_ref)) - sum p d. Both
    terms are as small as d is, so float32 products summed by torch's cascade keep the KL to ~1e-5
    of itself at 1e-4 nats a token (the test checks 1e-4 down to ~1e-6 nats) - where widening a
    batch's logits to float64 (1016 rows x 49,152 tokens: 0.4 GB a copy, several a trial, each
    conversion slow) cost a trial a third of its time. BLAS dot products would not do: they sum
    float32 in order."""

    ROWS = 128  # rows a piece (25 MB float32 temporaries at a 49,152-token vocabulary)
    COLUMNS = 1024  # vocabulary columns a piece of a factored difference (4 MB at 1,016 rows)
    FAR = 30.0  # d above which a row is scored from its logits (p e^d stays far from overflow)

    def __init__(
        self, logits: torch.Tensor, batch: torch.Tensor, count: int, windows: Windows, first: int
    ) -> None:
        self.rows = [(k, windows.first_row(first + k)) for k in range(count)]
        length = logits.shape[1]
        self.flat = torch.cat([torch.arange(k * length + row, (k + 1) * length - 1) for k, row in self.rows])
        self.targets = torch.cat([batch[k, row + 1 :] for k, row in self.rows])[:, None]
        self.z = torch.cat([logits[k, row:-1] for k, row in self.rows]).float()
        self.lse, self.p, self.mass, self.target_nll = self._distribution()
        self.top = self.z.argmax(-1)
        self.nll = float(self.target_nll.sum())

    def _distribution(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-sum-exp, probabilities in float32, their sums, each target's NLL) of the rows, in
        float64 `ROWS` rows at a time - each row's own, so the same bits as of the whole batch,
        whose float64 copies (a 1,016-row batch's logits, log-probabilities and their exponent:
        1.2 GB) were the trials' peak at 135M."""
        lse, p = torch.empty(len(self.z), dtype=torch.float64, device=self.z.device), torch.empty_like(self.z)
        mass, nll = torch.empty_like(lse), torch.empty_like(lse)
        for a in range(0, len(self.z), self.ROWS):
            rows = slice(a, a + self.ROWS)
            wide = self.z[rows].double()
            lse[rows] = torch.logsumexp(wide, -1)
            logp = wide - lse[rows, None]
            p[rows] = logp.exp()
            mass[rows] = p[rows].double().sum(-1)
            nll[rows] = -logp.gather(1, self.targets[rows])[:, 0]
        return lse, p, mass, nll

    def against(self, logits: torch.Tensor) -> tuple[float, float, int]:
        """(KL summed over the rows, NLL summed, rows whose most likely token agrees)."""
        kl, nll, agree, at = 0.0, 0.0, 0, 0
        for k, row in self.rows:
            scored = logits[k, row:-1]
            for a in range(0, len(scored), self.ROWS):
                z = scored[a : a + self.ROWS].float()
                rows = slice(at, at + len(z))
                at += len(z)
                found = self._exact(z, z - self.z[rows], rows)
                kl, nll, agree = kl + found[0], nll + found[1], agree + found[2]
        return kl, nll, agree

    def against_head(self, head: FactoredChange) -> tuple[float, float, int]:
        """`against` for logits z_ref + d with d given as its factors (the trial's change to the
        head's operands, `_deltas`): d is multiplied out COLUMNS of the vocabulary at a time and
        scored there, in cache, so no [rows, vocabulary] tensor is written or read but p - on a
        machine whose memory moves ~4 GB/s, the passes over a batch's 200 MB of logits cost more
        than the head's product. d is taken less a row's offset c (d at the reference's top
        token: softmax does not see it), so sum p e^(d - c) is m plus a term as small as d's
        spread; a token whose p float32 cannot hold (below e^-103) adds under e^-73 of a sum of at
        least p at the top token (>= 1/vocabulary) while d - c stays below FAR. Rows where it
        does not are scored from their logits, multiplied out in full."""
        count, vocabulary = self.p.shape
        if not head.terms:
            return 0.0, self.nll, count
        head = head.rows(self.flat)
        targets = self.targets[:, 0]
        offset = head.at(self.top)
        spread = torch.zeros(count, dtype=torch.float64)  # sum p (e^(d - c) - 1)
        weighted = torch.zeros(count, dtype=torch.float64)  # sum p (d - c)
        high = torch.full((count,), -torch.inf)
        best, best_at = torch.full((count,), -1.0), torch.zeros(count, dtype=torch.long)
        at_target = torch.zeros(count)
        for c in range(0, vocabulary, self.COLUMNS):
            columns = slice(c, min(c + self.COLUMNS, vocabulary))
            d = head.columns(columns) - offset[:, None]
            p = self.p[:, columns]
            moved = p * torch.expm1(d)
            spread += moved.sum(-1).double()
            weighted += (p * d).sum(-1).double()
            high = torch.maximum(high, d.amax(-1))
            value, index = (p + moved).max(-1)  # p e^(d - c): the candidate's ranking
            better = value > best
            best, best_at = torch.where(better, value, best), torch.where(better, index + c, best_at)
            inside = ((targets >= c) & (targets < columns.stop)).nonzero()[:, 0]
            at_target[inside] = d[inside, targets[inside] - c]
        fraction = spread / self.mass
        shift = torch.log1p(fraction)
        far = (high > self.FAR) | ~torch.isfinite(shift)
        near = ~far
        kl = float((shift * self.mass - weighted)[near].sum())
        nll = float((self.target_nll + shift - at_target)[near].sum())
        agree = int((best_at == self.top)[near].sum())
        rows = far.nonzero()[:, 0]
        for a in range(0, len(rows), self.ROWS):
            piece = rows[a : a + self.ROWS]
            d = head.rows(piece).columns(slice(None))
            found = self._exact(self.z[piece] + d, d, piece)
            kl, nll, agree = kl + found[0], nll + found[1], agree + found[2]
        return kl, nll, agree

    def _exact(
        self, z: torch.Tensor, d: torch.Tensor, rows: slice | torch.Tensor
    ) -> tuple[float, float, int]:
        shift = self._shift(z, d, rows)
        kl = float((shift * self.mass[rows] - (self.p[rows] * d).sum(-1).double()).sum())
        nll = float((self.lse[rows] + shift - z.gather(1, self.targets[rows])[:, 0]).sum())
        return kl, nll, int((z.argmax(-1) == self.top[rows]).sum())

    def _shift(self, z: torch.Tensor, d: torch.Tensor, rows: slice | torch.Tensor) -> torch.Tensor:
        """lse(z) - lse(z_ref) = top + log(sum p e^(d - top) / m), top = max d, to d's precision:
        the sum is m + sum p (e^(d - top) - 1), the second term (one sign) carrying all of it where
        d is small. Where the sum falls below m/2 the candidate moved its mass, possibly onto tokens
        whose reference probability float32 cannot hold (below e^-103): those rows take lse(z)
        itself (where the sum is at least m/2, such a token adds less than e^-103 of it)."""
        p, mass = self.p[rows], self.mass[rows]
        top = d.amax(-1)
        fraction = (p * torch.expm1(d - top[:, None])).sum(-1).double() / mass  # in [-1, 0]
        shift = torch.log1p(fraction) + top
        far = fraction < -0.5
        if bool(far.any()):
            shift[far] = torch.logsumexp(z[far].double(), -1) - self.lse[rows][far]
        return shift
