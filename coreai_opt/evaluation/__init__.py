"""How much compression costs on real data: perplexity, KL divergence and top-1 agreement of
language models on a text (`evaluate_text`); what each weight's compression alone costs
(`weight_sensitivity`, `trial_divergences`); other models' output agreement over a dataset is
`coreai_opt.comparison.compare_many` with `inputs=`."""

from ._config import EvalConfig
from ._plot import plot_evaluation
from ._sensitivity import (
    NotALanguageModel,
    SensitivityResult,
    WeightSensitivity,
    spearman,
    trial_divergences,
    trial_products,
    weight_sensitivity,
)
from ._text import TextEvaluation, TextScore, evaluate_text
from ._tokens import Windows, file_token_ids, text_token_ids

__all__ = [
    "EvalConfig",
    "NotALanguageModel",
    "SensitivityResult",
    "TextEvaluation",
    "TextScore",
    "WeightSensitivity",
    "Windows",
    "evaluate_text",
    "file_token_ids",
    "plot_evaluation",
    "spearman",
    "text_token_ids",
    "trial_divergences",
    "trial_products",
    "weight_sensitivity",
]
