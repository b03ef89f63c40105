"""Weight compression that knows no container: quantize, palettize, sparsify and their joint forms.

A config per pass (`QuantizeConfig`, `PalettizeConfig`, `SparsifyConfig`: `configs`, all
`WeightConfig`s) says what to do, with per-weight `Override`s by name pattern; the `registry`,
keyed by config type, holds the passes and the algorithms (`algorithms`) each offers.
`compress_(program, config)` selects the eligible weights of a program (`_sites`), encodes each one
as plain arrays (`weights.Encoding`: codes, LUTs, scales, masks; the numerics are tcast's) and lets
the program's container write them: Core AI programs through `coreai_opt._coreai`, `torch.export`
programs through `coreai_opt._export` (coreai-torch's ops), found by `weights.container_of`. The
report lists every weight, and every float tensor left alone with why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from typing import Any

from coreai_opt.errors import ConfigError
from coreai_opt.weights import (
    Calibration,
    Candidate,
    Consumer,
    Container,
    Encoding,
    Palettized,
    Quantized,
    ShiftScale,
    SkipKind,
    Skipped,
    Sparse,
    Stored,
    Use,
    WeightSite,
    Written,
    container_of,
)

from ._executors import Executor, ExecutorKind, LocalExecutor, RayExecutor, executor_of
from ._results import CompressionReport, Progress, WeightResult
from ._sites import select_sites
from .configs import (
    JOINT_DTYPES,
    LUT_DTYPES,
    N_BITS,
    PALETTIZE_GRANULARITIES,
    QUANTIZE_GRANULARITIES,
    WEIGHT_DTYPES,
    CompressionGranularity,
    DType,
    Override,
    PalettizeConfig,
    QScheme,
    QuantizeConfig,
    SparsifyConfig,
    WeightConfig,
    check_options,
    flag_names,
    flags,
    option,
    parse_override,
    plain_fields,
)
from .registry import (
    BUILT_IN,
    Algorithm,
    algorithm_for,
    algorithm_named,
    config_from_dict,
    config_type,
    config_types,
    learning_methods,
    learns_from_data,
    load_plugins,
    methods,
    register,
    register_config,
    unregister,
    unregister_config,
)

__all__ = [
    "BUILT_IN",
    "JOINT_DTYPES",
    "LUT_DTYPES",
    "N_BITS",
    "PALETTIZE_GRANULARITIES",
    "QUANTIZE_GRANULARITIES",
    "WEIGHT_DTYPES",
    "Algorithm",
    "Calibration",
    "Candidate",
    "CompressionGranularity",
    "CompressionReport",
    "ConfigError",
    "Consumer",
    "Container",
    "DType",
    "Encoding",
    "Executor",
    "ExecutorKind",
    "LocalExecutor",
    "MatrixView",
    "Override",
    "PalettizeConfig",
    "Palettized",
    "Progress",
    "QScheme",
    "QuantizeConfig",
    "Quantized",
    "RayExecutor",
    "ShiftScale",
    "SkipKind",
    "Skipped",
    "Sparse",
    "SparsifyConfig",
    "Stored",
    "Use",
    "WeightConfig",
    "WeightResult",
    "WeightSite",
    "Written",
    "algorithm_for",
    "algorithm_named",
    "check_options",
    "clusters_shared",
    "compress_",
    "config_from_dict",
    "config_type",
    "config_types",
    "container_of",
    "eligible_weights",
    "executor_of",
    "flag_names",
    "flags",
    "gram_fits",
    "gram_of",
    "learning_methods",
    "learns_from_data",
    "load_kmeans_kernels",
    "load_plugins",
    "methods",
    "option",
    "parse_override",
    "plain_fields",
    "register",
    "register_config",
    "sampled_trial_encodings",
    "select_sites",
    "trial_encodings",
    "unregister",
    "unregister_config",
]


def compress_(
    program: Any,
    config: WeightConfig,
    progress: Progress | None = None,
    executor: str | ExecutorKind | Executor | None = None,
    calibration: Calibration | None = None,
) -> CompressionReport:
    """Compress `program`'s weights in place as `config` says; report every weight and skip.

    `executor` runs the per-weight encoding of data-free algorithms: `"local"` (None) in this
    process, `"ray"` as Ray tasks (`pip install 'coreopt[ray]'`), or a `RayExecutor(...)` / any
    `Executor`; the result is the same program whichever runs it. Algorithms that learn from data
    (a config's `method`) take their statistics from `calibration`
    (`coreai_opt.calibration.calibrate(...)`), which the run uses up: unless tables are tuned, it
    lets go of each weight once read for the last time (so a pass holds about one copy of the
    model), and is not asked for anything afterwards - calibrate anew for another run."""
    from ._driver import compress_container  # the encoders import torch: only when compressing

    if not isinstance(config, WeightConfig):
        raise TypeError(
            f"config must be a WeightConfig (QuantizeConfig, PalettizeConfig, ...), not {config!r}"
        )
    return compress_container(container_of(program), config, progress, executor, calibration)


def load_kmeans_kernels() -> None:
    """Make palettization's k-means kernels ready now: numba compiles them on first use (about
    15 s) and loads them from its cache later (a second or two), so a command can say what it is
    waiting for before its first weight."""
    from .algorithms._kmeans_1d import warm_kernels

    warm_kernels()


@contextlib.contextmanager
def clusters_shared(configs: Collection[WeightConfig]) -> Iterator[None]:
    """Within it, encodings under `configs` that cluster alike (lut6 and lut6-q8: the same k-means,
    its tables stored otherwise) run that k-means once per weight: the same bytes, less time."""
    from ._row_sample import row_unit
    from .algorithms._shared_clusters import clusters_shared as scope

    with scope(configs, row_unit):  # configs sampled otherwise never meet: they share nothing
        yield


def eligible_weights(program: Any, config: WeightConfig) -> list[WeightSite]:
    """The weights `compress_(program, config)` would try to encode (size threshold, overrides and
    layouts applied; the encoding may still refuse one), nothing encoded."""
    sites, _ = select_sites(
        container_of(program).candidates(), config.weight_num_threshold, config.for_weight
    )
    return [site for site, _ in sites]


def trial_encodings(
    program: Any,
    config: WeightConfig,
    calibration: Calibration | None = None,
    only: Collection[str] | None = None,
    known: Any = None,
) -> Any:
    """Each weight `compress_(program, config)` would compress (of those in `only`, if given), with
    its encoding or why it stays, nothing written (`_driver.trial_encodings`; an iterator of
    `(WeightSite, Encoding | Skipped)`). The same encodings as `compress_`'s, without the data-free
    SNR a learned one's report puts beside it (`Learned.data_free_snr_db` None). `known`
    ({Needs: {name: Statistics}}): statistics of the program as it is, already taken; the
    calibration takes only the others."""
    from ._driver import trial_encodings as trials

    return trials(container_of(program), config, calibration, only, known)


def sampled_trial_encodings(
    program: Any,
    config: WeightConfig,
    calibration: Calibration | None = None,
    only: Collection[str] | None = None,
    elements: int = 0,
    known: Any = None,
) -> Any:
    """`trial_encodings`, each weight of more than `elements` values (0: none) whose encoding keeps
    its rows apart encoded on an evenly spread sample of its row groups: an iterator of
    `(WeightSite, Encoding | Skipped, RowSample | None)`, the outcome of the sample's rows."""
    from ._driver import sampled_trial_encodings as trials

    return trials(container_of(program), config, calibration, only, elements, known)


def __getattr__(name: str) -> Any:
    """`MatrixView`, `gram_of` and `gram_fits` (a weight as the matrix its consumer multiplies,
    its input Gram matrix in that order, whether there is one) import torch: loaded when asked for."""
    if name in ("MatrixView", "gram_of", "gram_fits"):
        from .algorithms import _layerwise

        return getattr(_layerwise, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
