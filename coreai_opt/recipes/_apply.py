"""The one file harness: check the paths, load the model once, run a recipe's steps on it in
memory, save the result atomically (or nothing, when a step's check fails).

Every command that writes a model is a recipe: `coreopt quantize|palettize|sparsify` one
`Compress` step, `coreopt cast` one `Cast`, `coreopt convert` one `Convert`, `coreopt quantize
--activations` one `QuantizeActivations`; `coreopt apply` runs a recipe file. Bad input fails
before any work (formats, output, overwrite, options); the input is never modified.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreai_opt.errors import ConfigError, NothingDoneError
from coreai_opt.io import (
    ConversionError,
    ModelFileError,
    ModelFormat,
    asset_bytes,
    check_output,
    load_aimodel,
    load_pt2,
    model_format,
    require_existing,
    running,
    save_aimodel,
    save_pt2,
)

from ._recipe import Recipe
from ._results import (
    ActivationsFileResult,
    BudgetResult,
    CastFileResult,
    CompressionFileResult,
    ConversionResult,
    RecipeResult,
    StepResult,
)
from ._steps import Budget, Cast, Compress, Convert, KVCache, QuantizeActivations, Step, Transform

Progress = Callable[[int, int, str], None]
_PT2_ONLY = (QuantizeActivations, Cast, Convert, KVCache)


def default_output(source: Path, recipe: Recipe) -> Path:
    """`model.pt2` -> `model.<tags>.<suffix>` beside the input: each step's tag (`int8`, `lut4`,
    `fp16`, `w8a8`, ...) in order, and `.aimodel` once a step converts."""
    tags = [tag for tag in (step.tag() for step in recipe.steps) if tag]
    suffix = ModelFormat.AIMODEL.value if any(isinstance(s, Convert) for s in recipe.steps) else source.suffix
    return source.with_name(".".join([source.stem, *tags]) + suffix)


def _formats(recipe: Recipe) -> tuple[tuple[ModelFormat, ...], ModelFormat | None]:
    """(the formats the source may have, the output's format: None for the source's)."""
    converts = [i for i, step in enumerate(recipe.steps) if isinstance(step, Convert)]
    first = recipe.steps[0]
    sources = (
        (ModelFormat.PT2,)
        if isinstance(first, _PT2_ONLY) or converts
        else (ModelFormat.AIMODEL, ModelFormat.PT2)
    )
    if converts:
        after = recipe.steps[converts[0] + 1 :]
        late = next((s for s in after if isinstance(s, _PT2_ONLY)), None)
        if late is not None:
            raise ValueError(f"a {late.KIND} step needs a .pt2 program: put it before the convert step")
    return sources, ModelFormat.AIMODEL if converts else None


@dataclass
class _Run:
    """What the steps share: the paths and the options of the run."""

    source: Path
    output: Path
    force: bool
    trust_pickle: bool
    executor: Any
    allow_empty: bool
    progress: Progress | None
    sidecars: Any  # `models.Sidecars` read before the load: a bad one fails before anything is written
    calibration: Any = None  # the recipe's CalibrationSpec
    keep_statistics: bool = False  # a transform's report keeps the result's statistics it knows


def apply_recipe(
    recipe: Recipe,
    source: Path | str,
    output: Path | str | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
    trust_pickle: bool = False,
    executor: Any = None,
    allow_empty: bool = False,
    keep_statistics: bool = False,
) -> RecipeResult:
    """Run `recipe` on the model file `source` into `output` (default: beside the input, named by
    the steps). A step whose check fails (a cast's, a budget) stops the run: nothing is written
    unless that cast step keeps failures (`keep_failed`). A compress step that changes nothing
    raises `NothingDoneError` unless `allow_empty`. `keep_statistics`: a transform step's report
    keeps the statistics of its result on the recipe's samples that it knows without a run
    (`TransformReport.known`), for a caller that goes on with the output on those samples;
    otherwise they are let go with the step."""
    from coreai_opt._memory import release_garbage, spilling

    source = Path(source)
    sources, produced = _formats(recipe)
    kind = model_format(source, sources)
    require_existing(source)
    out = Path(output) if output is not None else default_output(source, recipe)
    model_format(out, (produced or kind,))
    check_output(out, force=force, inputs=(source,))
    from coreai_opt.models import read_sidecars

    run = _Run(source, out, force, trust_pickle, executor, allow_empty, progress, read_sidecars(source),
               recipe.calibration, keep_statistics)  # fmt: skip
    _check_steps(recipe, run)
    program = (
        load_aimodel(source) if kind is ModelFormat.AIMODEL else load_pt2(source, trust_pickle=trust_pickle)
    )
    result = RecipeResult(source, out, 0.0, False)
    start = time.perf_counter()
    with spilling(_existing_folder(out)):  # the program's new tensors wait for the save as file pages
        for index, step in enumerate(recipe.steps):
            with running(source):  # a failure of one of the program's own nodes: one line naming it
                program, outcome, failed = _RUNNERS[type(step)](step, program, run, index)
            result.steps.append((step.KIND, outcome))
            if failed is not None:
                result.failed = failed
                if not (isinstance(step, Cast) and step.keep_failed):
                    result.seconds = time.perf_counter() - start
                    return result
    result.seconds = time.perf_counter() - start
    _save(program, out, run)
    result.written = True
    del program  # with the steps' freed temporaries, back to the system: a caller that goes on (the
    release_garbage(asset_bytes(run.source))  # judge of optimize's rounds) starts nearer its start
    for _, outcome in result.steps:
        if isinstance(outcome, CompressionFileResult | ActivationsFileResult):
            outcome.file_bytes_after = asset_bytes(out)
    return result


def _check_steps(recipe: Recipe, run: _Run) -> None:
    """What can fail before the load fails now: executors, op names, a method that learns from
    data given none."""
    from coreai_opt.compression import algorithm_for, executor_of, learns_from_data

    for step in recipe.steps:
        if isinstance(step, Compress):
            executor_of(run.executor)  # an unknown name or a missing extra
            # its own method (an override's is the driver's to check, on the weights it selects)
            if not algorithm_for(step.config).data_free and run.calibration is None:
                raise ConfigError(learns_from_data([step.config.method]), "calibration")
        if isinstance(step, QuantizeActivations):
            from coreai_opt.calibration import check_source

            check_source(step.calibration)
        if isinstance(step, KVCache):
            info = run.sidecars.info
            if info is None or info.context is None:
                raise ModelFileError(run.source, "is not a stateful decoder coreopt exported (its .model.json "
                                     "names no context): export it with --kv-cache --kv-cache-dtype")  # fmt: skip
        if isinstance(step, Cast):
            from coreai_opt.casting import resolve_op

            for name in step.ignored_ops:
                resolve_op(name)


def _existing_folder(out: Path) -> Path:
    """The output's folder, or its nearest existing ancestor where it is still to be made: where
    the spill's unnamed file goes (on the output's disk, not in a temporary folder in memory)."""
    folder = out.absolute().parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def _save(program: Any, out: Path, run: _Run) -> None:
    from coreai_opt.models import write_sidecars

    if model_format(out) is ModelFormat.AIMODEL:
        save_aimodel(program, out, force=run.force, inputs=(run.source,))
    else:
        save_pt2(program, out, force=run.force, inputs=(run.source,))
    write_sidecars(run.sidecars, run.source, out)  # what `coreopt export` said of the model, its tokenizer


StepOutcome = tuple[Any, StepResult, str | None]  # (the program after, the step's record, a failed check)


def _compress(step: Compress, program: Any, run: _Run, index: int) -> StepOutcome:
    from coreai_opt.compression import compress_

    calibration = _calibration(step, program, run)
    start = time.perf_counter()
    report = compress_(program, step.config, run.progress, run.executor, calibration)
    if calibration is not None and hasattr(calibration, "samples"):
        report.calibration = calibration.samples.describe()
    seconds = time.perf_counter() - start
    if report.problems and not run.allow_empty:
        raise NothingDoneError(
            f"{run.source}: {'; '.join(report.problems)}: no output written (--allow-empty writes it anyway)"
        )
    method = type(step.config).KIND  # type: ignore[attr-defined]
    before = asset_bytes(run.source)
    outcome = CompressionFileResult(
        run.source, run.output, method, step.config.options(), report, seconds, before, 0
    )
    return program, outcome, None


def _calibration(step: Compress, program: Any, run: _Run) -> Any:
    """The statistics source for methods that learn from data (None when none does)."""
    from coreai_opt.compression import learning_methods

    if not learning_methods(step.config) or run.calibration is None:
        return None  # data-free (a missing calibration is refused before the load)
    return _calibrated(program, run)


def _calibrated(program: Any, run: _Run) -> Any:
    """A calibration of `program` (or, for a Core AI program, of the `.pt2` it came from) on the
    recipe's samples."""
    from coreai_opt._export import checked_device
    from coreai_opt.calibration import Samples, calibrate
    from coreai_opt.models import model_tokenizer

    spec = run.calibration
    source, tokenizer = run.source, run.sidecars.tokenizer_file(run.source)  # the one read before the load
    if type(program).__name__ != "ExportedProgram":
        if spec.program is None:
            raise ValueError(
                f"{run.source}: methods that learn from data run the calibration through a .pt2: give the "
                ".pt2 it was converted from (--calibration-program), or compress before converting"
            )
        source = Path(spec.program)
        program = load_pt2(source, trust_pickle=run.trust_pickle)
        tokenizer = tokenizer or model_tokenizer(source)  # the .pt2's own, when the program has none
    samples = Samples.of(spec.source, count=spec.samples, tokens=spec.tokens, tokenizer=tokenizer)
    return calibrate(
        program, samples, device=checked_device(spec.device), exact_gradients=spec.exact_gradients
    )


def _quantize_activations(step: QuantizeActivations, program: Any, run: _Run, index: int) -> StepOutcome:
    from coreai_opt.calibration import RANDOM, Samples
    from coreai_opt.quantization import NothingToQuantize, Quantizer

    random = step.calibration == RANDOM
    samples = Samples.of(step.calibration, count=step.calibration_samples if random else None, seed=step.seed,
                         tokens=step.calibration_tokens, tokenizer=run.sidecars.tokenizer_file(run.source))  # fmt: skip
    batches = list(samples.inputs(program))  # read and checked before any work
    start = time.perf_counter()
    quantizer = Quantizer.of_program(program, step.config)
    try:
        prepared = quantizer.prepare(batches[0][1])
    except NothingToQuantize as exc:
        raise ModelFileError(run.source, str(exc)) from None
    with quantizer.calibration_mode():
        for done, (name, inputs) in enumerate(batches, 1):
            prepared(*inputs)
            if run.progress is not None:
                run.progress(done, len(batches), name)
    quantizer.finalize_program()
    assert quantizer.report is not None
    seconds = time.perf_counter() - start
    outcome = ActivationsFileResult(
        run.source, run.output, samples.describe(), len(batches), _activation_options(step.config),
        quantizer.report, seconds, asset_bytes(run.source), 0,
    )  # fmt: skip
    return program, outcome, None


def _activation_options(config: Any) -> dict[str, Any]:
    op = config.global_config
    acts = op.activations
    return {
        "weights": op.weights.options() if op.weights is not None else None,
        "activations": None if acts is None else {
            "dtype": acts.dtype.value, "qscheme": acts.qscheme.value, "observer": acts.observer.value,
            "percentile": acts.percentile, "averaging_constant": acts.averaging_constant,
        },
    }  # fmt: skip


def _cast(step: Cast, program: Any, run: _Run, index: int) -> StepOutcome:
    from coreai_opt.casting import (
        CastTarget,
        cast_program,
        check_inputs,
        compare_programs,
        op_matcher,
        resolve_op,
    )

    ops = tuple(resolve_op(name) for name in step.ignored_ops)
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    unmatched = [
        name for name, op in zip(step.ignored_ops, ops, strict=True) if not any(map(op_matcher(op), calls))
    ]
    if unmatched and not run.allow_empty:
        raise NothingDoneError(
            f"{run.source}: the program calls no {', no '.join(unmatched)} (--ignore-op matches nothing): no output "
            "written (--allow-empty writes it anyway)"
        )
    original = None
    if step.check:  # the program before the cast: a second load of an untouched file costs no memory
        original = (
            load_pt2(run.source, trust_pickle=run.trust_pickle) if index == 0 else copy.deepcopy(program)
        )
    start = time.perf_counter()
    target = CastTarget(step.to)
    report = cast_program(program, target, ops or None)
    seconds = time.perf_counter() - start
    checked = None
    if original is not None:
        tensors, label, rules = check_inputs(original, step.inputs, step.seed)
        try:
            checked = compare_programs(original, program, tensors, label, rules)
        except (RuntimeError, IndexError, ValueError) as exc:
            from coreai_opt.io import one_line

            hint = (
                "" if step.inputs is not None else "; pass --inputs with valid example inputs, or --no-check"
            )
            raise ModelFileError(
                run.source, f"the check could not run the programs ({one_line(exc)}){hint}"
            ) from None
    failed = None if checked is None or checked.ok else "cast check"
    written = failed is None or step.keep_failed
    return program, CastFileResult(run.source, run.output, target, report, checked, seconds, written), failed


def _convert(step: Convert, program: Any, run: _Run, index: int) -> StepOutcome:
    from coreai_opt._memory import trim_heap
    from coreai_opt.conversion import ConverterFailure, convert_with_log

    start = time.perf_counter()
    try:
        converted, log = convert_with_log(program)
    except ConverterFailure as exc:
        raise ConversionError(run.source, f"coreai-torch could not convert the program: {exc}") from None
    # the Core AI program holds its own copy of every weight: the converter's freed temporaries go
    # back before the save serializes it (the source program goes when `apply_recipe` lets go of it)
    del program
    trim_heap()
    return converted, ConversionResult(run.source, run.output, time.perf_counter() - start, log), None


def _budget(step: Budget, program: Any, run: _Run, index: int) -> StepOutcome:
    from coreai_opt.inspection import inspect_ai_program, inspect_exported_program

    if type(program).__name__ == "ExportedProgram":
        report = inspect_exported_program(program)
    else:
        report = inspect_ai_program(program)
    outcome = BudgetResult(run.source, run.output, report.weight_bytes, step.max_bytes)
    return program, outcome, None if outcome.ok else "budget"


def _transform(step: Transform, program: Any, run: _Run, index: int) -> StepOutcome:
    from coreai_opt._memory import release_garbage
    from coreai_opt.transforms import TransformError, transform_

    if type(program).__name__ != "ExportedProgram":
        raise ConfigError(
            f"step {index + 1} transforms a torch.export program, not a Core AI program", "steps"
        )
    calibration = None
    if step.config.learns():
        if run.calibration is None:
            raise ConfigError(
                f"step {index + 1} ({step.config.KIND}) learns from data: give the recipe a calibration",
                "calibration",
            )
        calibration = _calibrated(program, run)
        calibration.progress = run.progress  # the statistics it learns from, sample by sample
    try:
        report = transform_(program, step.config, calibration, run.progress)
    except TransformError as why:
        raise TransformError(f"{run.source}: {why}") from None
    del calibration  # it holds the weights as they were: they go back before the save
    if not run.keep_statistics:
        report.known = None  # nobody goes on with them: the Gram matrices go before the save
    release_garbage(asset_bytes(run.source))
    return program, report, None


def _kv_cache(step: KVCache, program: Any, run: _Run, index: int) -> StepOutcome:
    from coreai_opt.models import CacheError, quantize_kv_cache

    if type(program).__name__ != "ExportedProgram":
        raise ConfigError(
            f"step {index + 1} quantizes a .pt2 decoder's cache, not a Core AI program's", "steps"
        )
    try:
        made, report = quantize_kv_cache(program, step.dtype, run.sidecars.info)
    except CacheError as why:
        raise ModelFileError(run.source, str(why)) from None
    return made, report, None


_RUNNERS: dict[type, Callable[[Any, Any, _Run, int], StepOutcome]] = {
    Transform: _transform,
    KVCache: _kv_cache,
    Compress: _compress,
    QuantizeActivations: _quantize_activations,
    Cast: _cast,
    Convert: _convert,
    Budget: _budget,
}


def one_step(
    step: Step, source: Path | str, output: Path | str | None, calibration: Any = None, **options: Any
) -> StepResult:
    """A recipe of one step (reading `calibration`, a CalibrationSpec, if it learns), run; its
    step's record (what the single-step commands print)."""
    result = apply_recipe(Recipe((step,), calibration), source, output, **options)
    return result.steps[0][1]
