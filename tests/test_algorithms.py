"""The algorithm registry: a new algorithm is one function and one `register` line, and the driver
feeds it statistics - layer by layer, each weight compressed before the next one's are taken."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
import torch

from coreai_opt.compression import (
    BUILT_IN,
    Algorithm,
    DType,
    Override,
    PalettizeConfig,
    QuantizeConfig,
    SparsifyConfig,
    algorithm_for,
    compress_,
    methods,
    register,
    unregister,
)
from coreai_opt.compression.algorithms._rtn import quantize
from coreai_opt.errors import ConfigError
from coreai_opt.io import load_pt2
from coreai_opt.weights import Needs, Statistics, WeightSite
from tests.conftest import SAMPLES

SEEN: list[tuple[str, int]] = []


def toy_encoder(w: torch.Tensor, site: WeightSite, config: QuantizeConfig, statistics: Statistics):  # type: ignore[no-untyped-def]
    """Round to nearest, after checking that the statistics belong to this weight."""
    assert statistics.moments is not None and statistics.moments.shape == (site.shape[site.input_axis],)
    SEEN.append((site.name, statistics.rows))
    return quantize(w, site, config)


TOY = Algorithm(QuantizeConfig, "toy", toy_encoder, Needs.INPUT_MOMENTS, sequential=True, summary="a test")


class RecordingCalibration:
    """A calibration that makes up statistics and records what the driver asks, and when."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.replaced: dict[str, torch.Tensor] = {}

    def statistics(self, names: Sequence[str], needs: Needs, *, final: bool = False) -> dict[str, Statistics]:
        self.events.append(("statistics", ",".join(names)))
        return {name: Statistics(1) for name in names}

    def sequential(
        self, names: Sequence[str], needs: Needs, *, final: bool = False
    ) -> Iterator[tuple[str, Statistics]]:
        assert needs is Needs.INPUT_MOMENTS
        program = load_pt2(SAMPLES / "mlp.pt2")
        for rows, name in enumerate(names, 1):
            self.events.append(("asked", name))
            width = program.state_dict[name].shape[1]
            yield name, Statistics(rows, moments=torch.ones(width, dtype=torch.float64))

    def replace(self, name: str, value: torch.Tensor, *, keep_original: bool = True) -> None:
        self.events.append(("replaced", name))
        self.replaced[name] = value


@pytest.fixture
def toy() -> Iterator[Algorithm]:
    register(TOY)
    SEEN.clear()
    yield TOY
    unregister(TOY)


def test_the_built_in_algorithms_are_the_data_free_passes_and_those_that_learn() -> None:
    assert [(a.config.__name__, a.method, a.needs, a.sequential) for a in BUILT_IN] == [
        ("QuantizeConfig", "rtn", Needs.NOTHING, False),
        ("PalettizeConfig", "kmeans", Needs.NOTHING, False),
        ("SparsifyConfig", "magnitude", Needs.NOTHING, False),
        ("QuantizeConfig", "gptq", Needs.INPUT_GRAM, True),
        ("PalettizeConfig", "sensitive", Needs.GRADIENT_SQUARES, True),
        ("PalettizeConfig", "importance", Needs.INPUT_MOMENTS, False),
        ("PalettizeConfig", "gptq", Needs.INPUT_GRAM, True),
        ("SparsifyConfig", "sparsegpt", Needs.INPUT_GRAM, True),
    ]
    assert algorithm_for(QuantizeConfig()).name == "QuantizeConfig.rtn"
    assert algorithm_for(PalettizeConfig()).method == "kmeans"
    assert algorithm_for(SparsifyConfig()).method == "magnitude"


def test_a_registered_algorithm_is_a_method_of_its_config(toy: Algorithm) -> None:
    assert methods(QuantizeConfig) == ("rtn", "gptq", "toy")
    assert algorithm_for(QuantizeConfig(dtype=DType.INT8, method="toy")) is toy
    with pytest.raises(ConfigError, match="no method 'nope'; choose one of rtn, gptq, toy"):
        QuantizeConfig(method="nope")


def test_an_algorithm_that_learns_needs_calibration(toy: Algorithm) -> None:
    with pytest.raises(ConfigError, match=r"--method toy learns from data: give --calibration") as refused:
        compress_(load_pt2(SAMPLES / "mlp.pt2"), QuantizeConfig(method="toy", weight_num_threshold=0))
    assert refused.value.fields == ("calibration",)


def test_layer_by_layer_each_weight_is_replaced_before_the_next_is_asked(toy: Algorithm) -> None:
    config = QuantizeConfig(dtype=DType.INT4, method="toy", weight_num_threshold=0)
    calibration = RecordingCalibration()
    program = load_pt2(SAMPLES / "mlp.pt2")
    report = compress_(program, config, calibration=calibration)
    names = ["fc1.weight", "fc2.weight", "fc3.weight"]
    assert [w.name for w in report.weights] == names
    assert calibration.events == [event for name in names for event in (("asked", name), ("replaced", name))]
    assert [(name, rows) for rows, name in enumerate(names, 1)] == SEEN
    # what was swapped in is the weight as its encoding decodes: RTN's, as the toy delegates
    rtn = load_pt2(SAMPLES / "mlp.pt2")
    compress_(rtn, QuantizeConfig(dtype=DType.INT4, weight_num_threshold=0))
    from coreai_opt._export import fold_decompression

    folded = rtn.module()
    fold_decompression(folded)
    dense = sorted((tuple(b.shape), b) for n, b in folded.named_buffers() if n.startswith("_coreopt_dense"))
    for name in names:
        match = [b for shape, b in dense if shape == tuple(calibration.replaced[name].shape)]
        assert any(torch.equal(b, calibration.replaced[name]) for b in match), name


def test_data_free_and_learned_weights_mix_by_override(toy: Algorithm) -> None:
    """An override can give some weights another method: data-free ones are written first (no
    statistics asked for them), the learned ones after, layer by layer."""
    config = QuantizeConfig(
        dtype=DType.INT8,
        method="toy",
        weight_num_threshold=0,
        overrides=(Override.of("fc2.*", method="rtn"),),
    )
    calibration = RecordingCalibration()
    report = compress_(load_pt2(SAMPLES / "mlp.pt2"), config, calibration=calibration)
    assert [w.name for w in report.weights] == ["fc2.weight", "fc1.weight", "fc3.weight"]
    assert [name for kind, name in calibration.events if kind == "asked"] == ["fc1.weight", "fc3.weight"]
    assert ("replaced", "fc2.weight") in calibration.events  # the layer-by-layer pass sees it compressed
