"""A float stateful decoder's key/value cache made a quantized one (`coreopt quantize
--kv-cache-dtype`, a recipe's `kv_cache` step): the cache's codes, scales and the attention that
reads them are the exporter's own (`_stateful`), so the program is exported again - the model
rebuilt by transformers from the description `coreopt export` wrote beside it (its config, never
code from a file), every weight loaded from the program - and the result is what `coreopt export
--kv-cache-dtype` makes of the same weights.

Before the new program is made, the rebuilt model with a float cache must reproduce the program's
own logits: a program whose graph is not the one coreopt exports from its weights (a transform
that added ops, compressed weights) is refused, not silently replaced by one that computes
something else. Transforms that only change weight values (folded norms, a rotation of an untied
head) pass, and their cache quantizes like any other."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coreai_opt.errors import ConfigError

from ._exporter import traced_ids
from ._families import FAMILIES, ModelKind
from ._stateful import KEY, KEY_SCALE, KV_DTYPES, VALUE, decoder_context, decoder_problem, stateful_program

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from ._sidecar import ModelInfo

_TOLERANCE = 1e-4  # the rebuilt model's logits against the program's: relative RMS (float32 reorderings)
_CHECKED_TOKENS = 8  # a seeded call of this many tokens at position 0, as the exporter traces
_LATE_TOKENS = 64  # and a call of this many ending at the last position (rotary, windows, masks far out)
# keys of a description that are not the architecture: how to load or run it, never read from a file
# (a name like `_attn_implementation` could name code on the Hub); private keys (`_...`) too
_NOT_CONFIG = ("auto_map", "quantization_config", "dtype", "torch_dtype", "architectures", "attn_implementation",
               "experts_implementation", "trust_remote_code", "custom_pipelines", "transformers_version")  # fmt: skip
_REBUILD_ONLY = "quantize the cache before transforming or compressing it, or export with --kv-cache-dtype"


def check_kv_dtype(dtype: object, field: str = "kv_cache_dtype") -> None:
    """`ConfigError` (naming `field`) unless `dtype` is one of `KV_DTYPES`."""
    if dtype not in KV_DTYPES:
        raise ConfigError(f"{field} is one of {', '.join(KV_DTYPES)}, not {dtype!r}", field)


class CacheError(ValueError):
    """Why a program's cache cannot be quantized here (one line; the caller names the file)."""


@dataclass(frozen=True)
class KVCacheReport:
    """What quantizing the cache did: its codes, the state's bytes before and after, and how
    closely the rebuilt model reproduced the program before its cache changed."""

    dtype: str
    context: int
    state_bytes_before: int
    state_bytes_after: int
    relative_rms: float
    seconds: float

    def line(self) -> str:
        ratio = self.state_bytes_before / max(self.state_bytes_after, 1)
        return (
            f"key/value cache of {self.context} positions as {self.dtype} codes: {self.state_bytes_before:,} -> "
            f"{self.state_bytes_after:,} state bytes ({ratio:.2f}x smaller); the rebuilt decoder matched the "
            f"program within {self.relative_rms:.2g} relative RMS"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kv_cache_dtype": self.dtype, "context": self.context, "state_bytes_before": self.state_bytes_before,
            "state_bytes_after": self.state_bytes_after, "relative_rms": self.relative_rms,
            "seconds": round(self.seconds, 3),
        }  # fmt: skip


def quantize_kv_cache(program: ExportedProgram, dtype: str, info: ModelInfo | None) -> tuple[ExportedProgram, KVCacheReport]:  # fmt: skip
    """`program` (a float stateful decoder `coreopt export --kv-cache` made; `info`: the description
    beside it) exported again with its cache holding `dtype` codes (one of `KV_DTYPES`); the input
    is left as it was. `CacheError` says why a program cannot be, `ConfigError` a bad dtype."""
    import torch

    from coreai_opt._export import coreai_decompositions

    check_kv_dtype(dtype)
    began = time.perf_counter()
    context = _float_decoder(program, info)
    model = _rebuilt(program, info)  # type: ignore[arg-type]
    base = type(model)
    error = _difference(program, model, context)
    if not error <= _TOLERANCE:
        raise CacheError(
            f"is not the decoder coreopt exports from its weights (outputs differ by {error:.2g} relative RMS): "
            + _REBUILD_ONLY
        )
    model.__class__ = base  # the float cache's forward goes; the quantized one's comes
    ids = traced_ids(model, 1, min(_CHECKED_TOKENS, context))
    try:
        with torch.no_grad():
            made = stateful_program(model, context, ids, dtype).run_decompositions(coreai_decompositions())
    except Exception as exc:  # torch.export raises many types for code it cannot trace
        from coreai_opt.io import one_line

        raise CacheError(f"does not export with a {dtype} cache ({one_line(exc, 200)})") from None
    report = KVCacheReport(dtype, context, _state_bytes(program), _state_bytes(made), error,
                           time.perf_counter() - began)  # fmt: skip
    return made, report


def _float_decoder(program: ExportedProgram, info: ModelInfo | None) -> int:
    """The program's context, once it is a float32 stateful decoder of a family coreopt exports
    with its description beside it."""
    import torch

    problem = decoder_problem(program)
    if problem is not None:
        raise CacheError(f"is not a stateful decoder: it {problem}")
    if KEY_SCALE.format(0) in program.state_dict:
        raise CacheError("already keeps its key/value cache as codes")
    if info is None or not info.config:
        raise CacheError(
            "has no model description beside it (the .model.json coreopt export writes): export it with "
            "--kv-cache-dtype instead"
        )
    family = FAMILIES.get(info.model_type)
    if family is None or family.kind is not ModelKind.CAUSAL_LM:
        raise CacheError(
            f"is described as a {info.model_type!r} model, not a causal language model coreopt exports"
        )
    dtypes = {v.dtype for v in program.state_dict.values() if v.is_floating_point()}
    if dtypes != {torch.float32}:
        shown = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        raise CacheError(f"holds {shown} weights: quantize its cache before casting or compressing it")
    return decoder_context(program)  # type: ignore[return-value]


def _rebuilt(program: ExportedProgram, info: ModelInfo) -> Any:
    """The model transformers builds from the description's architecture (SDPA attention, as the
    exporter's), every weight the program's: the same names and shapes, or one line says which."""
    import torch

    try:
        import transformers
    except ImportError:
        raise ImportError(
            "quantizing a key/value cache needs transformers: pip install 'coreopt[hf]'"
        ) from None
    from coreai_opt.io import one_line

    from ._loading import quiet

    options = {k: v for k, v in info.config.items() if k not in _NOT_CONFIG and not k.startswith("_")}
    options.pop("model_type", None)
    mutated = set(program.graph_signature.buffers_to_mutate.values())
    weights = {k: v for k, v in program.state_dict.items() if k not in mutated}
    _stated_sizes(FAMILIES[info.model_type], options, weights)  # before a model of those sizes is built
    try:
        with quiet():
            config = transformers.AutoConfig.for_model(info.model_type, **options)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                                  attn_implementation="sdpa")  # fmt: skip
    except Exception as exc:  # transformers raises many types for a config it cannot build
        raise CacheError(
            f"has a model description transformers cannot build ({one_line(exc, 200)})"
        ) from None
    _same_weights(weights, model.state_dict(), info.model_type)
    model.load_state_dict(weights, strict=True)
    return model.eval()


def _stated_sizes(family: Any, options: dict[str, Any], weights: dict[str, Any]) -> None:
    """The description's layer count and widths are the program's weights' (`Shapes`: what a
    family's config says that its weights bear out)."""
    import re

    from ._families import Rule

    shapes = family.shapes
    layers = {int(m.group(1)) for name in weights if (m := re.search(shapes.layer, name))}
    found = [(shapes.layers, options.get(shapes.layers), len(layers))]
    for dim in shapes.dims:
        weight = next((w for n, w in weights.items() if dim.weight and n.endswith(dim.weight)), None)
        if dim.rule is Rule.EQUALS and weight is not None and dim.axis < weight.dim():
            found.append((dim.field, options.get(dim.field), weight.shape[dim.axis]))
    for field, stated, held in found:
        if stated != held:
            raise CacheError(f"has {held} where its description states {field} {stated!r}: the .model.json beside "
                             "it is not this program's")  # fmt: skip


def _same_weights(weights: dict[str, Any], expected: dict[str, Any], model_type: str) -> None:
    """The program's weights are the rebuilt model's, name for name and shape for shape."""
    extra, missing = sorted(set(weights) - set(expected)), sorted(set(expected) - set(weights))
    if extra or missing:
        named = f"holds {extra[0]}, which" if extra else f"lacks {missing[0]}, which"
        has = "has not" if extra else "needs"
        raise CacheError(f"{named} the {model_type} model coreopt exports {has}: {_REBUILD_ONLY}")
    for name, value in weights.items():
        if tuple(value.shape) != tuple(expected[name].shape):
            raise CacheError(
                f"holds {name} of shape {list(value.shape)} where its description's model has "
                f"{list(expected[name].shape)}: the .model.json beside it is not this program's"
            )


def _difference(program: ExportedProgram, model: Any, context: int) -> float:
    """The largest relative RMS between the program's logits and the rebuilt model's (a float
    cache of its own, emptied before each call), on seeded tokens at position 0 and on a chunk
    that ends at the last position; the program's state is left as it was."""

    from coreai_opt._export import runnable
    from coreai_opt.io import one_line

    from ._stateful import _give_cache

    late = min(_LATE_TOKENS, context)
    calls = [(min(_CHECKED_TOKENS, context), 0), (late, context - late)]
    try:
        _give_cache(model, context, None)
        module = runnable(program, stateless=True)
        return max(_call_difference(module, model, traced_ids(model, 1, n), at) for n, at in calls)
    except CacheError:
        raise
    except Exception as exc:  # the rebuilt model's code may fail in many ways on a description
        raise CacheError(f"does not run as the model its description builds ({one_line(exc, 200)})") from None


def _call_difference(module: Any, model: Any, ids: torch.Tensor, at: int) -> float:
    import torch

    from ._loading import quiet

    position = torch.tensor([at])
    with torch.no_grad():
        expected = module(ids, position)
        for name, buffer in model.named_buffers():
            if name.startswith((KEY.format(""), VALUE.format(""))):
                buffer.zero_()
        with quiet(), warnings.catch_warnings():  # transformers' deprecation notes are not ours to print
            warnings.simplefilter("ignore")
            got = model(ids, position)
    expected = expected[0] if isinstance(expected, tuple | list) else expected
    scale = float(expected.double().pow(2).mean().sqrt()) or 1.0
    return float((got.double() - expected.double()).pow(2).mean().sqrt()) / scale


def _state_bytes(program: ExportedProgram) -> int:
    state = program.state_dict
    return sum(
        state[n].numel() * state[n].element_size() for n in program.graph_signature.buffers_to_mutate.values()
    )
