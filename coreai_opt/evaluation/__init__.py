"""How much compression costs on real data: perplexity, KL divergence and top-1 agreement of
language models on a text (`evaluate_text`, in bounded memory), multiple-choice task accuracy as
lm-eval-harness scores it (`evaluate_task`, `read_task`), and a program as lm-eval-harness's own
model (`HarnessModel`, `lm_eval_model`); what each weight's compression alone costs
(`weight_sensitivity`, `trial_divergences`); other models' output agreement over a dataset is
`coreai_opt.comparison.compare_many` with `inputs=`."""

from ._config import EvalConfig
from ._harness import LM_EVAL_NAME, HarnessModel, lm_eval_model
from ._layouts import TaskItem
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
from ._spot import BROKEN_KL, BROKEN_TOP1, SpotCheck, shipped_text, spot_check
from ._tasks import TaskEvaluation, TaskScore, evaluate_task, read_task
from ._text import TextEvaluation, TextScore, evaluate_text
from ._tokens import Windows, file_token_ids, text_token_ids

__all__ = [
    "BROKEN_KL",
    "BROKEN_TOP1",
    "LM_EVAL_NAME",
    "EvalConfig",
    "HarnessModel",
    "NotALanguageModel",
    "SensitivityResult",
    "SpotCheck",
    "TaskEvaluation",
    "TaskItem",
    "TaskScore",
    "TextEvaluation",
    "TextScore",
    "WeightSensitivity",
    "Windows",
    "evaluate_task",
    "evaluate_text",
    "file_token_ids",
    "lm_eval_model",
    "plot_evaluation",
    "read_task",
    "shipped_text",
    "spearman",
    "spot_check",
    "text_token_ids",
    "trial_divergences",
    "trial_products",
    "weight_sensitivity",
]
