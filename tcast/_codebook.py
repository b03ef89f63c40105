"""Codebooks: element formats given by tables of values (lookup-table number specs).

A codebook has 2**meta_bits tables of 2**index_bits values each, all values of one `compute`
format. A value is stored as the index of an entry; which table a tile, subtile or the whole tensor
uses is stored beside the codes (the cast picks the table with the least squared error).

Two ways to make one:
- implicit, from a code `cb<I><M><clauses>_<compute>[_<label>]` (the reference project's
  spelling): each clause lays a pattern of 2**(I-1) - 1 positive values on the compute format's
  positive number line, mirrored to negatives with zero added: `f` is fp<I> (e2m0/e2m1/e2m2 with
  bias 1), `i` int<I> (fixed point with one integer bit); digits after f/i move the pattern so
  its top sits that many values below the compute format's largest, `e[digits]` adds copies with
  every value halved that many times (default `e` = 0 and 1: MSFP's shared micro-exponent);
  `p<interval><offsets>` and `s<interval><offsets>` are patterns whose gaps on the compute
  format's number line start at `interval` values and grow by one each step (p) or stay (s). MX9 / MX6 / MX4 are `cb81ie_int9`, `cb51ie_int7`,
  `cb31ie_int5` over E8M0 scales per 16 values and a table choice per pair of values.
  The reference's older `icb<I><M><f|i...>_<compute>` codes are read by its rule too (see
  `_icb_tables`).
- explicit, `tcast.codebook(tables, compute)`: e.g. the LUTs of a palettized weight (one table
  per group of channels, selected by the group).

Codes are sign-magnitude like the float formats' (index = sign << (I-1) | rank of the magnitude),
so a codebook holding exactly a format's values stores that format's codes; the index of -0 holds
0.0 and is never written.

Rounding: nearest entry; a value exactly between two entries goes to the one whose magnitude has
the even rank among the table's magnitudes (ties to even, as the float and int formats round);
equal parities (only in asymmetric tables) take the smaller magnitude, then the positive one.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._number import InfNaN, Kind, NumberSpec

if TYPE_CHECKING:
    import torch

_CODE = re.compile(r"^cb(\d)(\d)([a-z0-9]*)_([a-z0-9]+)(?:_([a-z0-9]+))?$")
_CLAUSE = re.compile(r"([fi])(\d*)(e\d*)?|([ps])(\d*)")
MAX_META_BITS = 16


@dataclass(frozen=True, eq=True)
class Codebook:
    """An element format given by its tables (see the module docstring)."""

    code: str
    index_bits: int
    compute: NumberSpec
    tables: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not 1 <= self.index_bits <= 8:
            raise ValueError(f"codebook {self.code}: index bits must be 1..8, got {self.index_bits}")
        size = 1 << self.index_bits
        if not self.tables or any(len(t) != size for t in self.tables):
            raise ValueError(f"codebook {self.code}: every table needs {size} entries")
        if len(self.tables) > 1 << MAX_META_BITS:
            raise ValueError(f"codebook {self.code}: at most {1 << MAX_META_BITS} tables")
        if any(not math.isfinite(v) for t in self.tables for v in t):
            raise ValueError(f"codebook {self.code}: table entries must be finite")

    # ----- what the engines and DataType ask of an element format -------------------------------
    kind = Kind.CODEBOOK
    is_codebook = True
    is_float = is_int = is_uint = is_exponent = False
    is_signed = True
    has_inf = has_nan = signed_zero = False
    torch_dtype = None

    @property
    def bits(self) -> int:
        return self.index_bits

    @property
    def meta_bits(self) -> int:
        """Bits that select a table: 0 for one table."""
        return (len(self.tables) - 1).bit_length()

    @functools.cached_property
    def max(self) -> float:
        return max(abs(v) for t in self.tables for v in t)

    @property
    def min(self) -> float:
        return -self.max

    @property
    def emax(self) -> int:
        """The exponent of the largest magnitude: power-of-two scales put a block's amax there."""
        return math.frexp(self.max)[1] - 1 if self.max > 0 else 0

    @property
    def mbits(self) -> int:
        return self.compute.mbits

    @property
    def midmax(self) -> float:
        return self.max

    @functools.cached_property
    def smallest_subnormal(self) -> float:
        positive = [abs(v) for t in self.tables for v in t if v != 0]
        return min(positive) if positive else 0.0

    @property
    def significant_bits(self) -> int:
        return self.compute.significant_bits

    def describe(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "kind": self.kind.value,
            "bits": self.bits,
            "tables": len(self.tables),
            "meta_bits": self.meta_bits,
            "compute": self.compute.code,
            "max": self.max,
            "entries": [list(t) for t in self.tables]
            if len(self.tables) <= 16 and self.index_bits <= 5
            else f"{len(self.tables)} tables of {1 << self.index_bits}",
        }

    def __str__(self) -> str:
        return self.code

    def __repr__(self) -> str:
        return f"Codebook({self.code!r}, tables={len(self.tables)})"

    # ----- tensors ---------------------------------------------------------------------------------
    def table_tensor(self, dtype: Any = None, device: Any = None) -> torch.Tensor:
        """The tables as a [tables, 2**index_bits] tensor (float64 unless asked)."""
        return _tables(self).to(dtype=dtype, device=device)

    def lookup(self, codes: torch.Tensor, meta: torch.Tensor | None, dtype: Any) -> torch.Tensor:
        """The value of each code in the table `meta` selects (broadcast against `codes`; None:
        table 0)."""
        import torch

        table = self.table_tensor(dtype, codes.device)
        flat = codes.to(torch.int64)
        if meta is not None:
            flat = flat + meta.to(torch.int64) * table.shape[1]
        return table.reshape(-1)[flat]


def _pattern_fp(index_bits: int) -> list[float]:
    """The positive values of fp<I>: e2m(I-3) with bias 1 and every code finite."""
    mbits = index_bits - 3
    if mbits < 0:
        raise ValueError("an f pattern needs 3 to 5 index bits")
    values = []
    for field in range(4):
        for mantissa in range(1 << mbits):
            if field == 0:
                value = mantissa * 2.0 ** (-mbits)
            else:
                value = (1 + mantissa / 2**mbits) * 2.0 ** (field - 1)
            if value > 0:
                values.append(value)
    return values


def _pattern_int(index_bits: int) -> list[float]:
    """The positive values of int<I>: fixed point with one integer bit."""
    return [k * 2.0 ** (2 - index_bits) for k in range(1, 1 << (index_bits - 1))]


def _positive_line(compute: NumberSpec) -> list[float]:
    """The compute format's positive finite values, ascending (index 1.. on its number line), by
    the format's rule in plain Python: naming a codebook imports no torch."""
    magnitudes = range(1, 1 << (compute.bits - 1))
    if compute.is_int:
        return [math.ldexp(c, -compute.mbits) for c in magnitudes]
    top_field, all_ones = (1 << compute.ebits) - 1, (1 << (compute.bits - 1)) - 1
    values = []
    for c in magnitudes:
        field, mantissa = c >> compute.mbits, c & ((1 << compute.mbits) - 1)
        if compute.infnan is InfNaN.IEEE and field == top_field:
            continue  # Inf and NaN
        if compute.infnan in (InfNaN.FN, InfNaN.INUZ) and c == all_ones:
            continue  # NaN (fn) or Inf (inuz)
        if field == 0:
            values.append(math.ldexp(mantissa, compute.emin - compute.mbits))
        else:
            values.append(math.ldexp((1 << compute.mbits) + mantissa, field - compute.bias - compute.mbits))
    return values


def _digits(text: str) -> list[int]:
    return [int(c) for c in text]


def _implicit_tables(code: str, index_bits: int, desc: str, compute: NumberSpec) -> list[list[float]]:
    line = _positive_line(compute)
    where = {v: i for i, v in enumerate(line)}
    top = len(line) - 1
    count = (1 << (index_bits - 1)) - 1  # positive values of a table
    patterns: list[list[int]] = []  # positions on `line`
    position = 0
    for m in _CLAUSE.finditer(desc):
        if m.start() != position:
            break
        position = m.end()
        if m.group(1):  # f or i
            natural = _pattern_fp(index_bits) if m.group(1) == "f" else _pattern_int(index_bits)
            missing = [v for v in natural if v not in where]
            if missing:
                raise ValueError(f"codebook {code}: {compute.code} lacks the pattern value {missing[0]}")
            base = [where[v] for v in natural]
            shifts = [0] if not m.group(2) else [top - d - base[-1] for d in _digits(m.group(2))]
            halvings = [0]
            if m.group(3) is not None:
                halvings = _digits(m.group(3)[1:]) or [0, 1]
            for shift in shifts:
                for halving in halvings:
                    moved = [i + shift for i in base]
                    if moved[0] < 0 or moved[-1] > top:
                        raise ValueError(f"codebook {code}: a pattern moves off {compute.code}'s values")
                    halved = [line[i] * 2.0**-halving for i in moved]
                    if any(v not in where for v in halved):
                        raise ValueError(f"codebook {code}: {compute.code} cannot halve a pattern {halving}x")
                    patterns.append([where[v] for v in halved])
        else:  # p or s
            digits = _digits(m.group(5))
            interval = digits[0] if digits else 1
            offsets = digits[1:] or [0]
            for offset in offsets:
                indices = [top - offset]
                for step in range(count - 1):  # gaps interval, interval + 1, ... (p) or interval (s)
                    indices.append(indices[-1] - interval - (step if m.group(4) == "p" else 0))
                if indices[-1] < 0:
                    raise ValueError(f"codebook {code}: a pattern runs below {compute.code}'s values")
                patterns.append(sorted(indices))
    if position != len(desc) or not desc:
        raise ValueError(f"codebook {code}: cannot read the pattern clauses {desc!r}")
    tables = []
    for pattern in patterns:
        if len(pattern) != count:
            raise ValueError(f"codebook {code}: a pattern has {len(pattern)} values, not {count}")
        tables.append(_signed_table([line[i] for i in pattern]))
    return tables


def _signed_table(magnitudes: list[float]) -> list[float]:
    """Sign-magnitude layout: [0, m1, m2, ..., 0 (the -0 slot), -m1, -m2, ...]."""
    ordered = sorted(magnitudes)
    return [0.0, *ordered, 0.0, *(-v for v in ordered)]


def _icb_tables(
    code: str, index_bits: int, meta_bits: int, desc: str, compute: NumberSpec
) -> list[list[float]]:
    """The reference's older `icb` codebooks: each of the letters f (fp4) and i (int4) lays its
    pattern with its top on the compute format's largest value, then again moved down one value
    at a time until the letters fill 2**meta_bits tables; values moved past zero become zeros."""
    if index_bits != 4 or not desc or any(c not in "fi" for c in desc):
        raise ValueError(f"codebook {code}: icb codebooks take 4 index bits and the letters f and i")
    line = _positive_line(compute)
    where = {v: i for i, v in enumerate(line)}
    top = len(line) - 1
    shifts = (1 << meta_bits) // len(desc)
    if shifts * len(desc) != 1 << meta_bits:
        raise ValueError(f"codebook {code}: {len(desc)} patterns cannot fill {1 << meta_bits} tables")
    tables = []
    for letter in desc:
        natural = _pattern_fp(4) if letter == "f" else _pattern_int(4)
        lift = compute.emax - (2 if letter == "f" else 0)  # e2m1's emax is 2, int4's 0
        lifted = [math.ldexp(v, lift) for v in natural]
        if any(v not in where for v in lifted):
            raise ValueError(f"codebook {code}: {compute.code} lacks values of the {letter} pattern")
        base = [where[v] + top - where[lifted[-1]] for v in lifted]
        for shift in range(shifts):
            tables.append(_signed_table([line[i - shift] if i - shift >= 0 else 0.0 for i in base]))
    return tables


@functools.lru_cache(maxsize=256)
def parse(code: str) -> Codebook:
    """An implicit codebook from its code (see the module docstring)."""
    text = code.strip().lower()
    older = text.startswith("icb")
    m = _CODE.match(text.removeprefix("i"))
    if m is None:
        raise ValueError(
            f"unknown codebook {code!r}: expected cb<index bits><meta bits><clauses>_<compute>[_<label>]"
        )
    index_bits, meta_bits, desc = int(m.group(1)), int(m.group(2)), m.group(3)
    compute = _spec(m.group(4))
    if not isinstance(compute, NumberSpec) or not (compute.is_float or compute.is_int):
        raise ValueError(f"codebook {code}: the compute format must be a float or int format")
    if not 2 <= index_bits <= 8:
        raise ValueError(f"codebook {code}: index bits must be 2..8")
    if older:
        tables = _icb_tables(text, index_bits, meta_bits, desc, compute)
    else:
        tables = _implicit_tables(text, index_bits, desc, compute)
    if len(tables) != 1 << meta_bits:
        raise ValueError(
            f"codebook {code}: {meta_bits} meta bits select {1 << meta_bits} tables, got {len(tables)}"
        )
    return Codebook(text, index_bits, compute, tuple(tuple(t) for t in tables))


def codebook(tables: Any, compute: Any = "float32", name: str | None = None) -> Codebook:
    """An explicit codebook: `tables` is one table or a list of them (2**I values each, values of
    `compute`, which they are checked against)."""
    import torch

    values = torch.as_tensor(tables, dtype=torch.float64)
    if values.dim() == 1:
        values = values[None]
    if values.dim() != 2 or values.shape[1] < 2 or values.shape[1] & (values.shape[1] - 1):
        raise ValueError(f"codebook tables must be [tables, 2**bits] values, got shape {tuple(values.shape)}")
    spec = _spec(compute)
    if not isinstance(spec, NumberSpec) or not (spec.is_float or spec.is_int):
        raise ValueError(f"a codebook's compute format must be a float or int format, not {compute}")
    from ._modes import RoundMode
    from ._primitives import quantize

    if not torch.isfinite(values).all():
        raise ValueError("codebook tables must be finite")
    if not torch.equal(quantize(values, spec, RoundMode.EVEN), values):
        raise ValueError(f"codebook tables hold values that {spec.code} cannot represent")
    index_bits = values.shape[1].bit_length() - 1
    meta = (values.shape[0] - 1).bit_length()
    code = name or f"cb{index_bits}{meta if meta < 10 else 'm' + str(meta)}_{spec.code}"
    return Codebook(code, index_bits, spec, tuple(tuple(row) for row in values.tolist()))


@functools.lru_cache(maxsize=64)
def _tables(book: Codebook) -> torch.Tensor:
    import torch

    return torch.tensor(book.tables, dtype=torch.float64)


@functools.lru_cache(maxsize=64)
def _search_tables(book: Codebook) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per table: its distinct values ascending, the code of each (its first index), and for
    each gap between neighbours whether a tie goes up (see the module docstring)."""
    import torch

    ordered, codes, up = [], [], []
    for table in book.tables:
        distinct = sorted(set(table))
        magnitudes = sorted({abs(v) for v in table})
        rank = {v: magnitudes.index(abs(v)) for v in distinct}
        ordered.append(distinct)
        codes.append([table.index(v) for v in distinct])
        gaps = []
        for lo, hi in itertools.pairwise(distinct):
            if rank[lo] % 2 != rank[hi] % 2:
                gaps.append(rank[hi] % 2 == 0)
            elif abs(hi) != abs(lo):
                gaps.append(abs(hi) < abs(lo))
            else:
                gaps.append(hi > 0)
        up.append(gaps)
    width = max(len(d) for d in ordered)
    pad = [d + [d[-1]] * (width - len(d)) for d in ordered]  # repeated ends are never nearer
    pad_codes = [c + [c[-1]] * (width - len(c)) for c in codes]
    pad_up = [g + [False] * (width - 1 - len(g)) for g in up]
    return (
        torch.tensor(pad, dtype=torch.float64),
        torch.tensor(pad_codes, dtype=torch.int64),
        torch.tensor(pad_up, dtype=torch.bool).reshape(len(ordered), width - 1),
    )


def nearest(values: torch.Tensor, book: Codebook, table: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, entry values) of the entries of one table nearest to float64 `values`."""
    import torch

    ordered, codes, up = (t[table] for t in _search_tables(book))
    ordered, codes, up = ordered.to(values.device), codes.to(values.device), up.to(values.device)
    last = ordered.numel() - 1
    above = torch.searchsorted(ordered, values.contiguous()).clamp_(max=last)
    below = (above - 1).clamp_(min=0)
    lo, hi = ordered[below], ordered[above]
    middle = (lo + hi) / 2  # exact for entries of formats up to float32 and float64 math
    go_up = values > middle
    if last > 0:
        go_up |= (values == middle) & up[below.clamp(max=last - 1)]
    chosen = torch.where(go_up, above, below)
    return codes[chosen], ordered[chosen]


def _spec(code: Any) -> NumberSpec:
    """A compute format's spec (a codebook's values are of a plain number format, never a codebook)."""
    return code if isinstance(code, NumberSpec) else NumberSpec(code)
