"""Recipes: ordered steps (compress, quantize activations, cast, convert, check a budget) run on a
model file by one harness - load once, every step in memory, save once, atomically.

`Recipe.load("recipe.yaml")` and `apply_recipe(recipe, "model.pt2", "out.aimodel")` run a file
(`coreopt apply`); `compress_file`, `cast_file`, `convert_file`, `quantize_activations_file` are
the recipes of one step every single-step command runs.
"""

from ._apply import apply_recipe, default_output, one_step
from ._files import (
    cast_file,
    compress_file,
    convert_file,
    palettize_file,
    quantize_activations_file,
    quantize_file,
    sparsify_file,
)
from ._recipe import RECIPE_VERSION, Recipe, config_from_text
from ._results import (
    ActivationsFileResult,
    BudgetResult,
    CastFileResult,
    CompressionFileResult,
    ConversionResult,
    RecipeResult,
    StepResult,
)
from ._steps import STEP_TYPES, Budget, Cast, Compress, Convert, KVCache, QuantizeActivations, Step, Transform

__all__ = [
    "RECIPE_VERSION",
    "STEP_TYPES",
    "ActivationsFileResult",
    "Budget",
    "BudgetResult",
    "Cast",
    "CastFileResult",
    "Compress",
    "CompressionFileResult",
    "ConversionResult",
    "Convert",
    "KVCache",
    "QuantizeActivations",
    "Recipe",
    "RecipeResult",
    "Step",
    "StepResult",
    "Transform",
    "apply_recipe",
    "cast_file",
    "compress_file",
    "config_from_text",
    "convert_file",
    "default_output",
    "one_step",
    "palettize_file",
    "quantize_activations_file",
    "quantize_file",
    "sparsify_file",
]
