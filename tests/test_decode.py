"""`weights.decode`: the one decoder equals what coreai-torch's own ops compute from the buffers
a compressed `.pt2` holds, bit for bit, for every encoding the passes make."""

from __future__ import annotations

import pytest
import torch
from test_compress_pt2 import CONFIGS

from coreai_opt._export import ExportWeights
from coreai_opt._export._describe import StateWalker
from coreai_opt._export._ops import op_name
from coreai_opt.compression._driver import compress_container
from coreai_opt.io import load_pt2
from coreai_opt.weights import Encoding, Quantized, WeightSite, decode, row_slice
from tests.conftest import SAMPLES


class _Capturing(ExportWeights):
    """The `.pt2` container, keeping every encoding it writes."""

    def __init__(self, program: torch.export.ExportedProgram) -> None:
        super().__init__(program)
        self.encodings: dict[str, Encoding] = {}

    def write(self, site: WeightSite, encoding: Encoding):  # type: ignore[no-untyped-def]
        self.encodings[site.name] = encoding
        return super().write(site, encoding)


def _coreai_torch_values(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """Every compressed weight as coreai-torch's eager ops compute it from the program's buffers."""
    walker = StateWalker(program)
    values: dict[torch.fx.Node, torch.Tensor] = {}
    roots = {}
    for node in program.graph.nodes:
        tensor = walker.tensor(node) if node.op == "placeholder" else None
        if tensor is not None:
            values[node] = tensor
        elif op_name(node) is not None:
            args = [values.get(a, a) if isinstance(a, torch.fx.Node) else a for a in node.args]
            values[node] = node.target(*args)  # coreai-torch's own kernel
            if any(op_name(user) is None for user in node.users):
                roots[walker.weight_name(node)] = values[node]
    return roots


@pytest.mark.parametrize("model", ["transformer", "wide_range"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_equals_coreai_torchs_ops_bit_for_bit(model: str, name: str) -> None:
    program = load_pt2(SAMPLES / f"{model}.pt2")
    container = _Capturing(program)
    compress_container(container, CONFIGS[name])
    expected = _coreai_torch_values(program)
    assert container.encodings and sorted(container.encodings) == sorted(expected)
    for weight, encoding in container.encodings.items():
        got = decode(encoding)
        assert got.dtype == expected[weight].dtype and got.shape == expected[weight].shape, weight
        assert torch.equal(got, expected[weight]), weight
        _rows_decode_alike(weight, encoding, got)


def _rows_decode_alike(weight: str, encoding: Encoding, whole: torch.Tensor) -> None:
    """`row_slice` (how a weight's error is measured a cache-sized piece at a time) gives forms
    whose decode is exactly the same rows of the whole decode, for every quantized encoding (per
    tensor, channel and block; offsets; FP8, MXFP4); other forms are not split."""
    rows = whole.shape[0]
    spans = [(0, 1), (1, max(2, rows // 3)), (rows // 3, rows), (0, rows)]
    pieces = [row_slice(encoding.form, a, b) for a, b in spans]
    if not isinstance(encoding.form, Quantized) or whole.dim() < 2:
        assert pieces == [None] * len(spans), weight
        return
    for (a, b), piece in zip(spans, pieces, strict=True):
        assert piece is not None, weight
        got = decode(piece, encoding.element.torch_dtype())
        assert got.dtype == whole.dtype and torch.equal(got, whole[a:b]), (weight, a, b)


def test_decode_takes_a_device_and_keeps_the_dtype() -> None:
    program = load_pt2(SAMPLES / "transformer.pt2")
    container = _Capturing(program)
    compress_container(container, CONFIGS["fp8e5m2-e8m0"])
    encoding = next(iter(container.encodings.values()))
    on_meta = decode(encoding, device="meta")
    assert on_meta.device.type == "meta" and on_meta.dtype == encoding.element.torch_dtype()  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="E8M0"):  # a bare E8M0-scaled form does not know its dtype
        decode(encoding.form)
    assert torch.equal(decode(encoding.form, torch.float32), decode(encoding))


@pytest.mark.parametrize("vector", [1, 2])
def test_lut_to_dense_in_pieces_of_rows_is_the_whole_gather(
    vector: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look-up table's decode gathers a piece of the first axis at a time (each element's int64
    table row is 8 bytes: 0.5 GB at a 1B model's head): one row a piece gives the whole gather's
    values, with tables in blocks along both axes and vectors along the second."""
    import coreai_opt._pieces as pieces
    from coreai_opt.weights._decode import lut_to_dense

    generator = torch.Generator().manual_seed(13)
    indices = torch.randint(0, 16, (12, 9), generator=generator, dtype=torch.uint8)
    lut = torch.randn(3, 9 // 3, 16, vector, generator=generator).half()  # blocks of 4 rows, 3 columns
    whole = lut_to_dense(indices, lut, 1)
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(
        pieces, "spans", lambda count, width: asked.extend((a, a + 1) for a in range(count)) or asked
    )
    assert torch.equal(lut_to_dense(indices, lut, 1), whole) and len(asked) == 12
    assert whole.shape == (12, 9 * vector)
    expected = lut[
        torch.arange(12)[:, None] // 4, torch.arange(9)[None, :] // 3, indices.long()
    ]  # [12, 9, V]
    assert torch.equal(whole, expected.reshape(12, 9 * vector))


@pytest.mark.parametrize(
    ("blocks", "vector", "entries"),
    [((1, 1), 1, 16), ((12, 1), 1, 16), ((3, 3), 2, 16), ((4, 1), 1, 256)],
    ids=["one table", "a table a row", "blocks and vectors", "256 entries"],
)
def test_a_tuned_tables_gradient_adds_each_elements_gradient_to_its_entry(
    blocks: tuple[int, int], vector: int, entries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table that takes a gradient (tuned end to end) gathers through its own autograd function,
    whose backward adds each element's gradient to the entry it read, a piece of rows at a time:
    the same values as the plain gather, and the same gradient as autograd takes through plain
    indexing (exactly, up to the order of the sums: within float32 rounding)."""
    import coreai_opt._pieces as pieces
    from coreai_opt.weights._decode import lut_to_dense

    generator = torch.Generator().manual_seed(5)
    indices = torch.randint(0, entries, (12, 9), generator=generator, dtype=torch.uint8)
    lut = torch.randn(*blocks, entries, vector, generator=generator)
    cotangent = torch.randn(12, 9 * vector, generator=generator)
    monkeypatch.setattr(
        pieces, "spans", lambda count, width: [(a, min(a + 5, count)) for a in range(0, count, 5)]
    )
    tuned = lut.clone().requires_grad_()
    values = lut_to_dense(indices, tuned, 1)
    values.backward(cotangent)
    plain = lut.clone().requires_grad_()
    rows, columns = (
        torch.arange(12)[:, None] // (12 // blocks[0]),
        torch.arange(9)[None, :] // (9 // blocks[1]),
    )
    expected = plain[rows, columns, indices.long()].reshape(12, 9 * vector)  # [12, 9, V] as the weight
    expected.backward(cotangent)
    assert torch.equal(values.detach(), expected.detach()) and torch.equal(
        values.detach(), lut_to_dense(indices, lut, 1)
    )
    torch.testing.assert_close(tuned.grad, plain.grad, rtol=1e-6, atol=1e-6)
    used = torch.zeros(lut.shape[:-1]).index_put_(
        (rows.expand(12, 9), columns.expand(12, 9), indices.long()), torch.ones(12, 9), accumulate=True
    )
    assert torch.equal(tuned.grad.abs().sum(-1) > 0, used > 0)  # an entry no element reads takes none


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
    ],
)
def test_a_16_bit_tables_gradient_is_summed_in_float32_and_rounded_once(device: str) -> None:
    """2,048 elements read one entry of a bfloat16 table, their gradients 1 and 2**-9 each: the
    entry's gradient is the float32 sum rounded once (5.0); summed in bfloat16 (a GPU's atomic
    adds), the small ones stop counting once the sum passes 1 (2**-9 is below half its step)."""
    from coreai_opt.weights._decode import lut_to_dense

    indices = torch.zeros(32, 64, dtype=torch.uint8, device=device)
    cotangent = torch.full((32, 64), 2.0**-9, dtype=torch.bfloat16, device=device)
    cotangent[7, 5] = 1.0
    table = torch.tensor([0.5, -0.25], dtype=torch.bfloat16, device=device)
    tuned = table.reshape(1, 1, 2, 1).requires_grad_()
    lut_to_dense(indices, tuned, 1).backward(cotangent)
    assert tuned.grad.dtype == torch.bfloat16
    assert tuned.grad.flatten().tolist() == [float(torch.tensor(1 + 2047 * 2.0**-9).bfloat16()), 0.0]


@pytest.mark.parametrize("kind", ["int8 with zero point", "int8", "float32"])
def test_shift_scale_in_place_leaves_its_inputs_and_equals_the_broadcast_formula(kind: str) -> None:
    """The decoder scales the one output tensor in place: a non-contiguous input, the caller's
    float32 data and the parameters stay as they were, and the bits are the broadcast formula's."""
    from coreai_opt.weights._decode import shift_scale

    g = torch.Generator().manual_seed(0)
    if kind == "float32":
        data = torch.randn(8, 6, generator=g).t()  # [6, 8], not contiguous
    else:
        data = torch.randint(-128, 128, (8, 6), generator=g, dtype=torch.int8).t()
    scale = (torch.rand(3, 2, generator=g) + 0.5).to(torch.float16)
    zero = torch.randint(-3, 4, (3, 2), generator=g, dtype=torch.int8).to(torch.float16)
    zero_point = zero if kind == "int8 with zero point" else None
    kept = (data.clone(), scale.clone(), zero.clone())
    out = shift_scale(data, scale, zero_point)
    blocks = data.reshape(3, 2, 2, 4)
    if kind == "float32":
        expected = (blocks * scale.float().reshape(3, 1, 2, 1)).reshape(6, 8).to(torch.float16)
    else:
        shifted = blocks.to(torch.float16) - (zero.reshape(3, 1, 2, 1) if zero_point is not None else 0)
        expected = (shifted * scale.reshape(3, 1, 2, 1)).reshape(6, 8)
    assert out.dtype == torch.float16 and torch.equal(out.view(torch.int16), expected.view(torch.int16))
    assert all(torch.equal(a, b) for a, b in zip((data, scale, zero), kept, strict=True))


def test_shift_scale_keeps_the_formulas_dtype_for_a_wider_zero_point() -> None:
    """A float32 zero point under a float16 scale (no file coreopt writes holds one) decodes in the
    dtype the broadcast formula promotes to, float32, as before the in-place decoder."""
    from coreai_opt.weights._decode import shift_scale

    data = torch.arange(-8, 8, dtype=torch.int8).reshape(4, 4)
    scale, zero = torch.full((2, 1), 0.5, dtype=torch.float16), torch.full((2, 1), 0.25)
    out = shift_scale(data, scale, zero)
    expected = (data.to(torch.float16).reshape(2, 2, 1, 4) - zero.reshape(2, 1, 1, 1)) * scale.reshape(
        2, 1, 1, 1
    )
    assert out.dtype == torch.float32 and torch.equal(out, expected.reshape(4, 4))


def test_stored_codes_already_in_the_ops_dtype_are_shared_not_copied() -> None:
    """`torch_values` hands over a stored array whose bytes are already what the ops take (uint8
    codes, int8 data, float32 scales) without a copy - a tuning or a write of a 1.1B model would
    otherwise hold its codes twice - with the same values as a copy; an array numpy forbids to
    write is copied (torch cannot mark a tensor read-only), and codes that need a new dtype (signed
    sub-byte codes, sign-extended) are new tensors."""
    import warnings

    import numpy as np

    from coreai_opt._elements import ELEMENTS
    from coreai_opt.weights import Stored, torch_values

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (64, 48), dtype=np.uint8)
    data = rng.integers(-128, 128, (64, 48), dtype=np.int8)
    scales = rng.standard_normal((64, 3)).astype(np.float32)
    for values, element in ((codes, "ui4"), (data, "si8"), (scales, "f32")):
        tensor = torch_values(Stored(values, ELEMENTS[element]))
        assert tensor.data_ptr() == values.ctypes.data and np.array_equal(tensor.numpy(), values)
    frozen = codes.copy()
    frozen.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a tensor over a read-only array
        copied = torch_values(Stored(frozen, ELEMENTS["ui4"]))
    assert copied.data_ptr() != frozen.ctypes.data and np.array_equal(copied.numpy(), frozen)
    signed = torch_values(Stored(codes, ELEMENTS["si4"]))
    assert signed.data_ptr() != codes.ctypes.data
    assert torch.equal(
        signed, torch.from_numpy(np.where(codes >= 8, codes.astype(np.int16) - 16, codes)).to(torch.int8)
    )
