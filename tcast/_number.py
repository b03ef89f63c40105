"""NumberSpec: an element format (float, signed/unsigned integer, or power-of-two exponent)."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any


class Kind(enum.Enum):
    FLOAT = "float"
    INT = "int"  # signed, modelled as fixed point with one integer bit
    UINT = "uint"  # unsigned integer codes, used with a scale and zero point
    EXPONENT = "exponent"  # unsigned biased power of two (OCP E8M0 scales)
    CODEBOOK = "codebook"  # values given by tables (tcast.Codebook)


class InfNaN(enum.Enum):
    IEEE = "ieee"  # top exponent reserved for inf and NaN
    FN = "fn"  # no inf; the all-ones pattern is NaN
    FNUZ = "fnuz"  # no inf; negative zero is NaN
    OCP = (
        "ocp"  # OCP MX FP6/FP4 elements: no inf, no NaN, signed zero (NaN is stored as -0, as ml_dtypes does)
    )
    INUZ = "inuz"  # IEEE P3109: negative zero's code is the one NaN, +-Inf at the all-ones magnitude


# Common and torch/ml_dtypes names. Torch's and ml_dtypes' fnuz float8 types use non-default biases.
# ml_dtypes' OCP FP6/FP4 types (no inf, no NaN, signed zero) are the `ocp` mode; the predefined MX
# types keep fnuz elements (same finite values, and a NaN keeps a code of its own).
_ALIASES = {
    "float64": "e11m52",
    "double": "e11m52",
    "float32": "e8m23",
    "float": "e8m23",
    "float16": "e5m10",
    "half": "e5m10",
    "bfloat16": "e8m7",
    "float8_e4m3fn": "e4m3fn",
    "float8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3b8fnuz",
    "float8_e5m2fnuz": "e5m2b16fnuz",
    "float8_e8m0fnu": "e8m0",
    "float6_e2m3fn": "e2m3ocp",
    "float6_e3m2fn": "e3m2ocp",
    "float4_e2m1fn": "e2m1ocp",
}

_FLOAT_CODE = re.compile(r"^e(\d+)m(\d+)(?:b(-?\d+))?(fnuz|fn|ocp|inuz)?$")
_INT_CODE = re.compile(r"^(u?)int(\d+)$")
_P3109 = re.compile(r"^binary8p(\d)$")


def p3109_code(precision: int) -> str:
    """The code of IEEE P3109's binary8pP: P - 1 mantissa bits, 8 - P exponent bits, bias
    2**(7 - P) (gfloat's rule, for every P; the reference project gives binary8p1 bias 63)."""
    if not 1 <= precision <= 7:
        raise ValueError(f"P3109 binary8 precision must be 1..7, got {precision}")
    return f"e{8 - precision}m{precision - 1}b{2 ** (7 - precision)}inuz"


def _normalise(code: str) -> str:
    text = code.strip().lower().removeprefix("torch.")
    if text in _ALIASES:
        return _ALIASES[text]
    if m := _P3109.match(text):
        return p3109_code(int(m.group(1)))
    text = text.removeprefix("float8_")
    return _ALIASES.get(text, text)


@dataclass(frozen=True)
class NumberSpec:
    """An element format built from a code: `e4m3fn`, `e5m2b16fnuz`, `e2m1ocp`, `int8`, `uint4`, `e8m0`, ...

    Derived values follow torch.finfo where they apply. Signed integers are fixed point with one
    integer bit (a float with one exponent bit), so `int8` spans +-1.984375 at unit scale.
    """

    code: str

    def __init__(self, code: Any) -> None:
        is_torch_dtype = hasattr(code, "is_floating_point")
        text = str(code) if is_torch_dtype else code
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"number spec code must be a non-empty string or torch dtype, got {code!r}")
        object.__setattr__(self, "code", _normalise(text))
        self._parsed  # noqa: B018  validate now: a bad code fails at construction

    # ----- parsing -------------------------------------------------------------------------------
    @cached_property
    def _parsed(self) -> tuple[Kind, int, int, int, InfNaN]:
        code = self.code
        if m := _INT_CODE.match(code):
            unsigned, bits = m.group(1) == "u", int(m.group(2))
            if not 2 <= bits <= 32:
                raise ValueError(f"integer width must be 2..32 bits, got {bits} in {code!r}")
            if unsigned:
                return Kind.UINT, 0, bits, 0, InfNaN.FNUZ
            return Kind.INT, 1, bits - 2, 1, InfNaN.FNUZ
        m = _FLOAT_CODE.match(code)
        if m is None:
            raise ValueError(
                f"unknown number spec {code!r}: expected eXmY[bZ][fn|fnuz|ocp], intK, uintK, eXm0 or a common name"
            )
        ebits, mbits = int(m.group(1)), int(m.group(2))
        bias = int(m.group(3)) if m.group(3) is not None else 2 ** (ebits - 1) - 1
        mode = InfNaN(m.group(4)) if m.group(4) else InfNaN.IEEE
        if not 1 <= ebits <= 11:
            raise ValueError(f"exponent width must be 1..11 bits, got {ebits} in {code!r}")
        if not 0 <= mbits <= 52:
            raise ValueError(f"mantissa width must be 0..52 bits, got {mbits} in {code!r}")
        if mbits == 0 and mode is not InfNaN.INUZ:  # P3109's binary8p1 is a float without mantissa
            if mode is not InfNaN.IEEE:
                raise ValueError(f"exponent types eXm0 take no {mode.value} suffix ({code!r})")
            if ebits < 2:
                raise ValueError(f"exponent type needs at least 2 exponent bits ({code!r})")
            return Kind.EXPONENT, ebits, 0, bias, InfNaN.IEEE
        if mode is InfNaN.IEEE and ebits < 2:
            raise ValueError(f"IEEE-style {code!r} needs 2+ exponent bits (one code is reserved for inf/NaN)")
        if mode in (InfNaN.FN, InfNaN.INUZ) and ebits + mbits < 2:
            raise ValueError(f"{code!r} is too narrow to reserve an all-ones code")
        return Kind.FLOAT, ebits, mbits, bias, mode

    # ----- basic fields ---------------------------------------------------------------------------
    @property
    def kind(self) -> Kind:
        return self._parsed[0]

    @property
    def ebits(self) -> int:
        return self._parsed[1]

    @property
    def mbits(self) -> int:
        return self._parsed[2]

    @property
    def bias(self) -> int:
        return self._parsed[3]

    @property
    def infnan(self) -> InfNaN:
        return self._parsed[4]

    @property
    def is_float(self) -> bool:
        return self.kind is Kind.FLOAT

    @property
    def is_int(self) -> bool:
        return self.kind is Kind.INT

    @property
    def is_uint(self) -> bool:
        return self.kind is Kind.UINT

    @property
    def is_exponent(self) -> bool:
        return self.kind is Kind.EXPONENT

    @property
    def is_signed(self) -> bool:
        return self.kind in (Kind.FLOAT, Kind.INT)

    is_codebook = False
    meta_bits = 0  # bits a value's format choice costs (a codebook's table choice)

    @property
    def has_inf(self) -> bool:
        return self.kind is Kind.FLOAT and self.infnan in (InfNaN.IEEE, InfNaN.INUZ)

    @property
    def has_nan(self) -> bool:
        return self.kind is Kind.EXPONENT or (self.kind is Kind.FLOAT and self.infnan is not InfNaN.OCP)

    @property
    def signed_zero(self) -> bool:
        """Whether -0 is a value of its own (IEEE, FN and OCP floats; not fnuz, inuz, integers)."""
        return self.kind is Kind.FLOAT and self.infnan not in (InfNaN.FNUZ, InfNaN.INUZ)

    @property
    def significant_bits(self) -> int:
        """Bits of the widest significand of a value: a float's mbits + 1, an integer's magnitude
        bits, 1 for powers of two (what the argument for a float32 quotient needs)."""
        if self.kind is Kind.FLOAT:
            return self.mbits + 1
        if self.kind is Kind.INT:
            return self.bits - 1
        if self.kind is Kind.UINT:
            return self.bits
        return 1

    @property
    def bits(self) -> int:
        if self.kind is Kind.UINT:
            return self.mbits
        if self.kind is Kind.INT:
            return self.mbits + 2
        if self.kind is Kind.EXPONENT:
            return self.ebits
        return 1 + self.ebits + self.mbits

    # ----- range ----------------------------------------------------------------------------------
    @property
    def emin(self) -> int:
        if self.kind is Kind.UINT:
            return 0
        if self.kind is Kind.EXPONENT:
            return -self.bias
        return 1 - self.bias

    @property
    def emax(self) -> int:
        if self.kind is Kind.UINT:
            return max(0, self.bits - 1)
        if self.kind is Kind.INT:
            return 0
        top = 2**self.ebits - 1
        if self.kind is Kind.EXPONENT or self.infnan is InfNaN.IEEE:
            return top - 1 - self.bias
        if self.infnan is InfNaN.INUZ and self.mbits == 0:  # the top exponent holds only Inf
            return top - 1 - self.bias
        return top - self.bias

    @property
    def max(self) -> float:
        if self.kind is Kind.UINT:
            return float(2**self.bits - 1)
        if self.kind is Kind.EXPONENT:
            return math.ldexp(1.0, self.emax)
        mantissa = 2.0 - math.ldexp(1.0, -self.mbits)
        if self.infnan in (InfNaN.FN, InfNaN.INUZ):  # the all-ones code is NaN (fn) or Inf (inuz)
            mantissa = 2.0 - math.ldexp(1.0, 1 - self.mbits)
            if self.mbits == 0:
                mantissa = 1.0
        return math.ldexp(mantissa, self.emax)

    @property
    def min(self) -> float:
        if self.kind is Kind.UINT:
            return 0.0
        if self.kind is Kind.EXPONENT:
            return math.ldexp(1.0, self.emin)
        return -self.max

    @property
    def smallest_normal(self) -> float:
        if self.kind is Kind.UINT:
            return 1.0
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        if self.kind is Kind.UINT:
            return 1.0
        if self.kind is Kind.EXPONENT:
            return math.ldexp(1.0, self.emin)
        return math.ldexp(1.0, self.emin - self.mbits)

    @property
    def eps(self) -> float:
        if self.kind is Kind.UINT:
            return 1.0
        return math.ldexp(1.0, -self.mbits)

    @property
    def midmax(self) -> float:
        """Midway between max and 2**(emax+1): an alternative threshold for choosing scales."""
        return (self.max + math.ldexp(1.0, self.emax + 1)) / 2

    @property
    def torch_dtype(self) -> Any:
        """The torch dtype with exactly this format, or None."""
        import torch

        exact = {
            "e11m52": torch.float64,
            "e8m23": torch.float32,
            "e5m10": torch.float16,
            "e8m7": torch.bfloat16,
            "e4m3fn": getattr(torch, "float8_e4m3fn", None),
            "e5m2": getattr(torch, "float8_e5m2", None),
            "e4m3b8fnuz": getattr(torch, "float8_e4m3fnuz", None),
            "e5m2b16fnuz": getattr(torch, "float8_e5m2fnuz", None),
            "e8m0": getattr(torch, "float8_e8m0fnu", None),
            "uint8": torch.uint8,
        }
        return exact.get(self.code)

    # ----- helpers used by the engines ---------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "kind": self.kind.value,
            "bits": self.bits,
            "ebits": self.ebits,
            "mbits": self.mbits,
            "bias": self.bias,
            "emax": self.emax,
            "emin": self.emin,
            "max": self.max,
            "min": self.min,
            "smallest_normal": self.smallest_normal,
            "smallest_subnormal": self.smallest_subnormal,
            "eps": self.eps,
            "midmax": self.midmax,
            "infnan": self.infnan.value if self.kind in (Kind.FLOAT, Kind.EXPONENT) else "none",
            "torch_dtype": str(self.torch_dtype) if self.torch_dtype is not None else None,
        }

    def __str__(self) -> str:
        return self.code

    def __repr__(self) -> str:
        return f"NumberSpec({self.code!r})"
