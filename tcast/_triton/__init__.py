"""TritonCast: fused Triton kernels for tile-scaled (MX-style) and unscaled casts of <= 8-bit formats.

One pass per tensor: each program loads a run of whole tiles along the last dim, finds every
tile's amax, picks its E8M0 exponent (the scale modes of TorchCast), rounds the elements in any
round mode and writes either the fake-quantized values (virtual) or packed codes plus uint8 scale
codes (actual). The upcast kernel reads codes and scales and writes values, decoding codes by
bit arithmetic. Every operation mirrors TorchCast's arithmetic: powers of two are built from
their bits, scaling multiplies are single float32 roundings, rounding works on exact
integer/fraction splits (or, for 16-bit inputs, on a float32 addition that rounds on the
binade's grid), and contraction into FMAs is disabled, so both engines give the same bits; e4m3fn/e5m2 round-to-even of scaled tiles
uses the GPU's saturating conversion instead, which rounds the same way (checked on every finite
bf16 value). Codes are packed in registers and stored whole bytes or 32-bit words at a time.
Stochastic rounding draws Philox numbers in the kernel (keyed by a seed): reproducible, but not
TorchCast's stream.

Imported only when a Triton cast is asked for (it imports triton). Split by concern: element
math (`_elements`), data movement and packing (`_memory`), the kernels (`_kernels`), and the host
side that launches them (`_launch`).
"""

from ._given import cast_under
from ._hadamard import rotate
from ._launch import LaunchConfig, cast, upcast

__all__ = ["LaunchConfig", "cast", "cast_under", "rotate", "upcast"]
