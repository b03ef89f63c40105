"""Codebooks: tables that hold exactly a format's values cast as that format does (codes, scales,
values); MSFP MX9/MX6/MX4 against a plain reference of shared micro-exponents; explicit tables
against a brute-force nearest search with the documented tie rule; the palettization decode."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import tcast


def _heavy(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator)
    x *= torch.exp2(torch.randint(-12, 12, (shape[0], 1), generator=generator).float())
    x[:, ::7] *= 9.0  # outliers
    return x


def _with_ties(x: torch.Tensor, grid: list[float]) -> torch.Tensor:
    """Put every midpoint of `grid` (a unit-scale grid) into the first row: exact ties."""
    mids = [(a + b) / 2 for a, b in itertools.pairwise(grid)]
    row = torch.tensor((mids + [-m for m in mids])[: x.shape[1]])
    x = x.clone()
    x[0, : row.numel()] = row
    x[0, -1] = max(grid)  # the block's scale stays 2**0
    return x


@pytest.mark.parametrize(
    ("book", "format_name"),
    [
        ("cb40f_e2m1fnuz", "mxfp4e2"),
        ("cb40i_int4", "mxint4"),
        ("cb80i_int8", "mxint8"),
        ("cb50f_e2m2fnuz", None),
    ],
)
def test_a_codebook_of_a_formats_values_casts_as_the_format(book: str, format_name: str | None) -> None:
    """Sign-magnitude codes: a codebook holding exactly e2m1's values writes e2m1's codes."""
    spec = tcast.number(book)
    grid = sorted({abs(v) for v in spec.tables[0]})
    x = _with_ties(_heavy(1, (64, 64)), [-v for v in grid[::-1]] + grid[1:])
    x[5, 3] = math.nan
    x[6, 40] = -math.inf
    dtype = tcast.datatype(book, "e8m0_t32")
    reference = tcast.lookup(format_name) if format_name else None
    if reference is None:  # fp5 (e2m2 with bias 1 and no NaN) as its own tcast format
        reference = tcast.datatype("e2m2fnuz", "e8m0_t32")
    mine = tcast.cast(x, dtype, castmode="actual")
    theirs = tcast.cast(x, reference, castmode="actual")
    assert torch.equal(mine.scales, theirs.scales)
    values, expected = tcast.upcast(mine), tcast.upcast(theirs)
    assert torch.equal(values.isnan(), expected.isnan())
    assert torch.equal(values.nan_to_num(), expected.nan_to_num())
    assert torch.equal(tcast.cast(x, dtype).nan_to_num(), expected.nan_to_num())
    finite = ~expected.isnan().reshape(-1, 32).any(1)  # NaN blocks store their codes differently
    codes = mine.unpacked_codes().reshape(-1, 32)[finite]
    if format_name is not None and not tcast.lookup(format_name).nspec.is_int:
        assert torch.equal(codes, theirs.unpacked_codes().reshape(-1, 32)[finite])


def msfp_reference(x: np.ndarray, element_bits: int) -> np.ndarray:
    """MSFP with shared micro-exponents, written plainly: per 16 values a shared exponent
    floor(log2 amax) (E8M0), then per pair the sign-magnitude integer grid with element_bits - 1
    magnitude bits at the shared exponent, or at one exponent lower when that is nearer for the
    pair (the coarse grid wins equal errors); round half to even, saturate."""
    frac = element_bits - 2  # magnitude bits below the binary point at the shared exponent
    top = 2 ** (element_bits - 1) - 1
    out = np.empty_like(x, dtype=np.float64)
    for r in range(x.shape[0]):
        for start in range(0, x.shape[1], 16):
            block = x[r, start : start + 16].astype(np.float64)
            amax = np.abs(block).max()
            if not np.isfinite(amax):
                out[r, start : start + 16] = np.nan
                continue
            shared = min(max(math.floor(math.log2(amax)) if amax > 0 else -127, -127), 127)
            for p in range(0, 16, 2):
                pair = block[p : p + 2] / 2.0**shared
                coarse = np.clip(np.round(pair * 2**frac), -top, top) / 2**frac
                fine = np.clip(np.round(pair * 2 ** (frac + 1)), -top, top) / 2 ** (frac + 1)
                pick = fine if np.sum((fine - pair) ** 2) < np.sum((coarse - pair) ** 2) else coarse
                out[r, start + p : start + p + 2] = pick * 2.0**shared
    return out


@pytest.mark.parametrize(("name", "bits"), [("mx9", 8), ("mx6", 5), ("mx4", 3)])
def test_msfp_shared_micro_exponents(name: str, bits: int) -> None:
    x = _heavy(2, (32, 64))
    x[3, 17] = math.nan
    x[4, 0:16] = 0.0
    x[5, :4] = torch.tensor([0.5, 1.5, 2.5, -3.5]) * 2.0 ** (2 - bits)  # ties on the coarse grid
    expected = msfp_reference(x.numpy(), bits)
    t = tcast.cast(x, name, castmode="actual", measure=True)
    got = tcast.upcast(t, torch.float64).numpy()
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(tcast.cast(x, name).double().numpy(), expected.astype(np.float32))
    assert t.bits_per_value == tcast.lookup(name).bits_per_value() == bits + 1


def test_mx9_beats_block_floating_point_of_its_size() -> None:
    """The micro-exponent bit buys precision: MX9 (9 bits a value) against mxint8 (8.25) and
    bfp16 (9): higher SNR on data with a spread of magnitudes within blocks."""
    x = _heavy(3, (256, 256))
    snr = {n: tcast.sqnr_db(x, tcast.cast(x, n)) for n in ("mx9", "mxint8", "bfp16")}
    assert snr["mx9"] > snr["bfp16"] > snr["mxint8"]


def _brute_nearest(v: float, table: list[float]) -> int:
    """The documented rule by exhaustive search: nearest entry; on a tie the even magnitude
    rank, then the smaller magnitude, then the positive; the first index of equal entries."""
    magnitudes = sorted({abs(e) for e in table})
    best = min(abs(e - v) for e in table)
    tied = sorted({e for e in table if abs(e - v) == best})
    if len(tied) == 2:
        a, b = tied
        ra, rb = magnitudes.index(abs(a)), magnitudes.index(abs(b))
        if ra % 2 != rb % 2:
            tied = [a if ra % 2 == 0 else b]
        elif abs(a) != abs(b):
            tied = [a if abs(a) < abs(b) else b]
        else:
            tied = [max(a, b)]
    return table.index(tied[0])


def test_explicit_tables_round_to_the_nearest_entry_ties_by_the_rule() -> None:
    tables = [
        [-3.0, -1.0, -0.5, 0.0, 0.25, 0.5, 2.0, 6.0],  # asymmetric, like k-means centroids
        [-1.5, -1.0, -0.75, -0.25, 0.25, 0.75, 1.0, 1.5],  # no zero: 0 is a tie of equal parity
    ]
    book = tcast.codebook(tables, "float16", name="two_luts")
    assert book.bits == 3 and book.meta_bits == 1
    generator = torch.Generator().manual_seed(4)
    mids = sorted({(a + b) / 2 for t in tables for a in t for b in t})
    x = torch.cat([torch.tensor(mids), torch.randn(300, generator=generator) * 3, torch.tensor([9.0, -9.0])])
    for index, table in enumerate(tables):
        single = tcast.codebook([table], "float16")
        t = tcast.cast(x[None], tcast.datatype(single), castmode="actual")
        codes = t.unpacked_codes().reshape(-1).tolist()
        assert codes == [_brute_nearest(float(v), table) for v in x], index
    # two tables over the whole tensor: the one with less squared error is chosen
    t = tcast.cast(x[None], tcast.datatype(book), castmode="actual")
    errors = [sum((table[_brute_nearest(float(v), table)] - float(v)) ** 2 for v in x) for table in tables]
    assert tcast.unpack_codes(t.meta, 1, 1).item() == int(np.argmin(errors))


def test_explicit_tables_must_be_values_of_the_compute_format() -> None:
    with pytest.raises(ValueError, match="cannot represent"):
        tcast.codebook([[0.0, 0.1, 0.2, 0.3]], "float16")
    with pytest.raises(ValueError, match="2\\*\\*bits"):
        tcast.codebook([[0.0, 1.0, 2.0]], "float16")
    with pytest.raises(ValueError, match="meta bits"):
        tcast.number("cb41f_e2m1fnuz")  # one meta bit: two tables, one given
    with pytest.raises(ValueError, match="subtiles choose codebook tables"):
        tcast.datatype("e2m1fnuz", "e8m0_t32s4")
    with pytest.raises(ValueError, match="no NaN or Inf"):
        tcast.cast(torch.tensor([[1.0, math.nan]]), tcast.datatype(tcast.codebook([[0.0, 1.0]], "float16")))


def test_palettization_luts_decode_through_tcast() -> None:
    """A grouped LUT (one table per group of rows, as `coreopt palettize` writes) decodes by
    tcast.decode with each row's group as the table choice."""
    generator = torch.Generator().manual_seed(5)
    groups, rows, cols, bits = 4, 16, 24, 3
    luts = torch.randn(groups, 2**bits, generator=generator).half().double()
    indices = torch.randint(0, 2**bits, (rows, cols), generator=generator)
    group_of_row = torch.arange(rows) // (rows // groups)
    book = tcast.codebook(luts, "float16")
    decoded = tcast.decode(indices, book, torch.float64, meta=group_of_row[:, None])
    expected = torch.stack([luts[group_of_row[r], indices[r]] for r in range(rows)])
    assert torch.equal(decoded, expected)


def test_codebook_files_round_trip(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    x = _heavy(6, (8, 48))
    save_file({"w": x}, str(tmp_path / "w.safetensors"))
    from tcast._files import cast_file, upcast_file

    cast_file(tmp_path / "w.safetensors", tmp_path / "q.safetensors", tcast.lookup("mx6"), castmode="actual")
    upcast_file(tmp_path / "q.safetensors", tmp_path / "u.safetensors")
    assert torch.equal(load_file(str(tmp_path / "u.safetensors"))["w"], tcast.cast(x, "mx6"))
