"""The grids weights round onto: integer, FP8 or MX FP4 codes with a scale per tensor, channel or
block, chosen by round to nearest or, for symmetric integers, by importance-weighted clipping.
The encoders (`algorithms`) and W8A8 (`coreai_opt.quantization`) share them.

tcast computes every code and scale (one actual cast), so the numerics are TensorCast's:
- integers, symmetric: scale = amax / (2**(bits-1) - 1) rounded to nearest in the weight's dtype,
  codes = round(w / scale) (ties to even; the exact quotient's rounding); unsigned symmetric codes
  are those plus 2**(bits-1), with that offset stored;
- integers, asymmetric: scale = (max - min) / (2**bits - 1) (the range always holding zero),
  zero point round(-min / scale), codes round(w / scale) + zero point as torch.quantize rounds;
  signed types store codes and zero point less 2**(bits-1);
- FP8: scale = amax / the format's max, rounded up in the weight's dtype so nothing saturates
  (amax / 57344 of a small fp16 weight may be an fp16 subnormal, never zero), or an E8M0 power of
  two (OCP MX: floor(log2 amax) - emax); MX FP4 is e2m1 under E8M0 scales per 32 inputs.
A scale is never zero or infinite; the runtime computes fp16 outputs wrongly from f32 scales, so
float scales are stored in the weight's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import tcast
from coreai_opt._elements import Element
from coreai_opt.weights import Encoding, Quantized, ShiftScale, Stored, WeightSite

from .configs import CompressionGranularity, DType, QScheme, QuantizeConfig

G = CompressionGranularity


def scale_shape(site: WeightSite, config: QuantizeConfig) -> tuple[int, ...] | str:
    """The shape of the scale (and offset) tensor, or why the weight's layout cannot take it."""
    shape = site.shape
    if config.granularity is G.PER_TENSOR:
        return tuple(1 for _ in shape)
    if config.granularity is G.PER_CHANNEL:
        return tuple(d if i == site.output_axis else 1 for i, d in enumerate(shape))
    length = shape[site.input_axis]
    if length % config.block_size:
        return f"input axis length {length} is not a multiple of block_size {config.block_size}"
    return tuple(d // config.block_size if i == site.input_axis else d for i, d in enumerate(shape))


def _integer_step_format(storage: str, element: tcast.NumberSpec) -> str:
    """tcast's signed integers are fixed point (code k is k * 2**-m at unit scale), so its scale is
    the integer step times 2**m. The storage format with its bias lowered by m holds exactly 2**m
    times each storage value: the step, read back, is a storage value with no rounding."""
    spec = tcast.number(storage)
    return f"e{spec.ebits}m{spec.mbits}b{spec.bias - element.mbits}"


def _tcast_type(dtype: DType, qscheme: QScheme, scale: str, tile: str) -> tcast.DataType:
    """The tcast type of codes `dtype` under `scale` (a tcast code) per `tile` (`_t...` or "")."""
    bits = dtype.bits
    if not dtype.is_int:
        return tcast.datatype(dtype.element.tcast, f"{scale}{tile}")
    if qscheme is QScheme.ASYMMETRIC:
        return tcast.datatype(f"uint{bits}", f"{scale}_uint{bits}{tile}")
    element = tcast.number(f"int{bits}")
    return tcast.datatype(element, f"{_integer_step_format(scale, element)}{tile}")


@dataclass(frozen=True)
class Grid:
    """The scales (and zero points) of a cast as tcast holds them per tile (`scale_grid`,
    `zero_grid`): what a cast onto the same grid is given."""

    scales: torch.Tensor
    zero_points: torch.Tensor | None


@dataclass(frozen=True)
class Codes:
    """A tensor cast to `scale * (data - offset)`, with the data in the dtype's storage codes."""

    cast: tcast.Tensor
    data: torch.Tensor  # uint8: the storage element's bits (two's complement for signed types)
    scale: torch.Tensor  # the scale grid (tcast.Tensor.scale_grid): float steps, or E8M0 codes
    offset: torch.Tensor | None  # int64 storage codes of the zero points, on the same grid


def cast_codes(
    x: torch.Tensor,
    dtype: DType,
    qscheme: QScheme,
    scale: str,
    tile: str,
    scalemode: tcast.ScaleMode,
    given: Grid | None = None,
) -> Codes:
    """One actual tcast cast of `x` to `dtype` codes under per-`tile` scales in format `scale`
    (chosen by `scalemode`, or the `given` grid of an earlier cast: GPTQ rounds onto it).

    tcast's codes are two's complement for symmetric integers and unsigned for asymmetric ones;
    a storage type of the other signedness holds them with the top bit flipped (+-2**(bits-1)),
    and unsigned storage of symmetric codes takes that 2**(bits-1) as its offset.
    """
    datatype = _tcast_type(dtype, qscheme, scale, tile)
    if given is None:
        cast = tcast.cast(x, datatype, castmode="actual", scalemode=scalemode, computemode="auto")
    else:
        cast = tcast.cast(x, datatype, castmode="actual", computemode="auto", scales=given.scales,
                          zero_points=given.zero_points)  # fmt: skip
    codes = cast.unpacked_codes()
    grid = cast.scale_grid()
    assert grid is not None
    if not dtype.is_int:
        return Codes(cast, codes.to(torch.uint8), grid, None)
    half = 1 << (dtype.bits - 1)
    symmetric = qscheme is QScheme.SYMMETRIC
    flip = half if dtype.signed != symmetric else 0
    if symmetric:
        step = grid * 2.0**-datatype.nspec.mbits  # exact: see _integer_step_format
        offset = None if dtype.signed else torch.full(grid.shape, half, dtype=torch.int64)
        return Codes(cast, (codes ^ flip).to(torch.uint8), step, offset)
    zero = cast.zero_grid()
    assert zero is not None
    return Codes(cast, (codes ^ flip).to(torch.uint8), grid, zero.to(torch.int64) ^ flip)


def stored_codes(codes: torch.Tensor, element: Element) -> Stored:
    """Codes as `element` stores them: 8-bit integers as their own values, everything else (narrower
    integers, FP8, FP4) as unsigned codes."""
    values = codes.to(torch.uint8).cpu().numpy()  # stored arrays live on the host
    own = element.bits == 8 and not element.is_float
    return Stored(values.view(element.numpy_dtype()) if own else values, element)


def _view(w: torch.Tensor, site: WeightSite, config: QuantizeConfig) -> torch.Tensor:
    """The weight as tcast scales it: per channel, [channels, everything else]."""
    if config.granularity is G.PER_CHANNEL:
        return w.movedim(site.output_axis, 0).reshape(w.shape[site.output_axis], -1)
    return w


def _unview(t: torch.Tensor, w: torch.Tensor, site: WeightSite, config: QuantizeConfig) -> torch.Tensor:
    if config.granularity is G.PER_CHANNEL:
        moved = tuple(w.movedim(site.output_axis, 0).shape)
        return t.reshape(moved).movedim(0, site.output_axis)
    return t


def stored_float(values: torch.Tensor, element: Element) -> Stored:
    """Float values already on `element`'s grid, as `element` stores them (the conversion is exact;
    values already of that dtype are copied once, without a float64 pass)."""
    if values.dtype in (torch.float16, torch.float32) and values.dtype == element.torch_dtype():
        return Stored(values.cpu().numpy().copy(), element)
    return Stored(values.double().cpu().numpy().astype(element.numpy_dtype()), element)


def _tile(site: WeightSite, config: QuantizeConfig) -> str:
    if config.granularity is G.PER_TENSOR:
        return ""
    if config.granularity is G.PER_CHANNEL:
        return "_t0d1"  # of the [channels, rest] view
    return f"_t{config.block_size}d{site.input_axis}"


def _scale_format(site: WeightSite, config: QuantizeConfig) -> tuple[str, tcast.ScaleMode]:
    """The tcast code of the scales and how they are chosen: the weight's float dtype (integers
    from the max, FP8 rounded up) or E8M0 powers of two."""
    if config.dtype.is_int or not config.e8m0_scales:
        mode = tcast.ScaleMode.MAX if config.dtype.is_int else tcast.ScaleMode.CEIL
        return site.element.tcast, mode
    return "e8m0", tcast.ScaleMode.MAX


def grid_of(w: torch.Tensor, site: WeightSite, config: QuantizeConfig) -> Grid | str:
    """The scales (and zero points) round-to-nearest chooses for `w`, per tile of `_view(w)`."""
    shape = scale_shape(site, config)
    if isinstance(shape, str):
        return shape
    scale, scalemode = _scale_format(site, config)
    datatype = _tcast_type(config.dtype, config.qscheme, scale, _tile(site, config))
    cast = tcast.cast(_view(w, site, config), datatype, castmode="actual", scalemode=scalemode,
                      computemode="auto")  # fmt: skip
    return Grid(cast.scale_grid(), cast.zero_grid())


def element_grid(grid: Grid, w: torch.Tensor, site: WeightSite, config: QuantizeConfig) -> Grid:
    """Each element's scale (and zero point) in the weight's own layout: the tile grid spread
    over the tiles' elements."""
    view_shape = tuple(_view(w, site, config).shape)

    def spread(t: torch.Tensor) -> torch.Tensor:
        return _unview(spread_tiles(t, view_shape), w, site, config)

    zero = None if grid.zero_points is None else spread(grid.zero_points)
    return Grid(spread(grid.scales), zero)


def spread_tiles(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A per-tile tensor (of `shape`'s rank) repeated over each tile's elements, to `shape`."""
    for axis, (have, want) in enumerate(zip(t.shape, shape, strict=True)):
        if have != want:
            t = t.repeat_interleave(want // have, dim=axis)
    return t


def column_datatype(site: WeightSite, config: QuantizeConfig) -> tcast.DataType:
    """The tcast type that rounds one column [rows, 1] onto per-row given scales."""
    scale, _ = _scale_format(site, config)
    return _tcast_type(config.dtype, config.qscheme, scale, "_t0d1")


def quantize_onto(
    w: torch.Tensor, site: WeightSite, config: QuantizeConfig, given: Grid | None
) -> Encoding | str:
    """`quantize`, with the scales (and zero points) of `given` where a caller fixed them."""
    shape = scale_shape(site, config)
    if isinstance(shape, str):
        return shape
    dtype = config.dtype
    scale, scalemode = _scale_format(site, config)
    view = _view(w, site, config)
    codes = cast_codes(view, dtype, config.qscheme, scale, _tile(site, config), scalemode, given)
    data = stored_codes(_unview(codes.data, w, site, config), dtype.element)
    if scale == "e8m0":
        scales = Stored(codes.scale.reshape(shape).cpu().numpy(), tcast_element("e8m0"))
    else:
        scales = stored_float(codes.scale.reshape(shape), site.element)
    offset = None if codes.offset is None else stored_codes(codes.offset.reshape(shape), dtype.element)
    return Encoding(Quantized(data, ShiftScale(scales, offset)), site.element)


def dequantized(w: torch.Tensor, site: WeightSite, config: QuantizeConfig) -> torch.Tensor | str:
    """The weight as its encoding decodes (the same cast as `quantize`), in the weight's dtype;
    fake-quantized weights for calibration and quantization-aware training."""
    shape = scale_shape(site, config)
    if isinstance(shape, str):
        return shape
    scale, scalemode = _scale_format(site, config)
    view = _view(w, site, config)
    datatype = _tcast_type(config.dtype, config.qscheme, scale, _tile(site, config))
    cast = tcast.cast(view, datatype, castmode="actual", scalemode=scalemode, computemode="auto")
    return _unview(tcast.upcast(cast, w.dtype), w, site, config)


def tcast_element(name: str) -> Element:
    """The element of a tcast code the element table knows (e.g. `e8m0` -> f8E8M0FNU)."""
    from coreai_opt._elements import ELEMENTS

    return next(e for e in ELEMENTS.values() if e.tcast == name)


# ----- importance-weighted clipping ------------------------------------------------------------
# Importance-weighted scale choice for symmetric integer codes (clipping).
#
# Round to nearest takes each tile's scale from its largest magnitude, so the largest code lands on
# the tile's maximum. At 2 bits (codes -1, 0, 1) that leaves almost every weight on zero, and at 4
# bits one outlier stretches the steps of its whole tile. A smaller scale clips the few largest
# values and rounds the rest finer: each tile here takes the shrink of round-to-nearest's scale,
# from `_SHRINKS`, whose round to nearest has the least squared error weighted by the inputs'
# mean squares (what reaches the layer's output), with the larger scale on ties. GPTQ then rounds
# onto that grid; the data-free `rtn` keeps the maximum.

# 1.0 first: a tile keeps round-to-nearest's scale unless a smaller one is strictly better.
_SHRINKS = tuple(1.0 - 0.04 * i for i in range(20))  # 1.00 ... 0.24
_PIECE = 1 << 20  # elements of the weight searched at a time


def weighted_grid(
    w: torch.Tensor, site: WeightSite, config: QuantizeConfig, grid: Grid, free: Encoding,
    importance: torch.Tensor | None,
) -> Grid:  # fmt: skip
    """`grid` (round to nearest's, of the encoding `free`) with each tile's scale shrunk where that
    lowers the tile's `importance`-weighted (the weight's shape) error; other formats as given."""
    from coreai_opt.weights import torch_values

    form = free.form
    symmetric_int = config.dtype.is_int and config.qscheme is QScheme.SYMMETRIC
    if importance is None or not symmetric_int or not isinstance(form, Quantized) or form.decode is None:
        return grid
    step = torch_values(form.decode.scale).double().to(w.device)  # per tile, in the weight's layout
    largest = 2 ** (config.dtype.bits - 1) - 1
    best = torch.empty_like(step)
    axis, channels = site.output_axis, site.shape[site.output_axis]
    rows = channels if step.shape[axis] != channels else max(1, _PIECE * channels // max(1, w.numel()))
    for a in range(0, channels, rows):  # pieces of whole output channels: the temporaries stay small
        n = min(rows, channels - a)
        tiles = step if step.shape[axis] != channels else step.narrow(axis, a, n)
        piece = w.narrow(axis, a, n).double()
        weight = importance.narrow(axis, a, n).double().to(w.device)
        out = best if tiles is step else best.narrow(axis, a, n)
        out.copy_(_least_error_steps(piece, weight, tiles, largest, site))
    mbits = tcast.number(f"int{config.dtype.bits}").mbits  # tcast's scale is the step x 2**m
    scales = (best * 2.0**mbits).reshape(grid.scales.shape).to(grid.scales.device, grid.scales.dtype)
    return Grid(scales, grid.zero_points)


def _least_error_steps(
    x: torch.Tensor, weight: torch.Tensor, step: torch.Tensor, largest: int, site: WeightSite
) -> torch.Tensor:
    """Per tile of `step`, the first shrink of it (on the stored scales' own grid, as the codes
    will be decoded) with the least `weight`ed squared error of round to nearest of `x`."""
    shape = tuple(x.shape)
    best_step, best_error = step.clone(), torch.full_like(step, float("inf"))
    for shrink in _SHRINKS:
        candidate = (step * shrink).to(site.element.torch_dtype()).double()
        usable = candidate > 0
        spread = spread_tiles(torch.where(usable, candidate, step), shape)
        rounded = torch.clamp(torch.round(x / spread), -largest, largest) * spread
        error = _tile_sums(weight * (x - rounded) ** 2, tuple(step.shape))
        better = usable & (error < best_error)
        best_step = torch.where(better, candidate, best_step)
        best_error = torch.where(better, error, best_error)
    return best_step


def _tile_sums(t: torch.Tensor, tiles: tuple[int, ...]) -> torch.Tensor:
    """Sums of `t` over each tile, `tiles` being the number of tiles along each axis."""
    split: list[int] = []
    for length, count in zip(t.shape, tiles, strict=True):
        split += [count, length // count]
    return t.reshape(split).sum(dim=tuple(range(1, 2 * len(tiles), 2)))
