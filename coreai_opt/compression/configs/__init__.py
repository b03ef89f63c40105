"""The weight passes' configs: one frozen, validated, serialisable dataclass per pass, all built on
`WeightConfig` (fields with their command-line `Flag`, per-weight `Override`s, `to_dict` /
`from_dict` with a version). A new pass is one module here and one `registry.register_config`
line; which algorithms a config offers is the registry's fact, not the config's."""

from ._base import (
    CONFIG_VERSION,
    Flag,
    Override,
    WeightConfig,
    check_methods_with,
    check_options,
    flag_names,
    flags,
    option,
    parse_override,
    plain_fields,
)
from ._options import (
    JOINT_DTYPES,
    LUT_DTYPES,
    N_BITS,
    PALETTIZE_GRANULARITIES,
    QUANTIZE_GRANULARITIES,
    WEIGHT_DTYPES,
    CompressionGranularity,
    DType,
    QScheme,
)
from ._palettize import PalettizeConfig
from ._quantize import QuantizeConfig
from ._sparsify import SparsifyConfig

__all__ = [
    "CONFIG_VERSION",
    "JOINT_DTYPES",
    "LUT_DTYPES",
    "N_BITS",
    "PALETTIZE_GRANULARITIES",
    "QUANTIZE_GRANULARITIES",
    "WEIGHT_DTYPES",
    "CompressionGranularity",
    "DType",
    "Flag",
    "Override",
    "PalettizeConfig",
    "QScheme",
    "QuantizeConfig",
    "SparsifyConfig",
    "WeightConfig",
    "check_methods_with",
    "check_options",
    "flag_names",
    "flags",
    "option",
    "parse_override",
    "plain_fields",
]
