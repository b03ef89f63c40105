"""`coreopt-lm-eval`: lm-eval-harness's own command with coreopt's programs registered as the model
"coreopt", so its tasks (local task files included) run on `.pt2` and `.aimodel` files:

    coreopt-lm-eval --model coreopt --model_args path=smol.pt2 --tasks hellaswag --include_path my_tasks/

lm-eval is not among coreopt's dependencies (it depends on scikit-learn): install it yourself.
"""

from __future__ import annotations

import sys

from cli._common import EXIT_USER_ERROR


def main() -> None:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as exc:
        sys.stderr.write(
            f"error: lm-eval-harness does not import ({exc}): install it with pip install lm_eval "
            "(coreopt does not, as it brings scikit-learn)\n"
        )
        sys.exit(EXIT_USER_ERROR)
    from coreai_opt.evaluation import lm_eval_model

    lm_eval_model()
    cli_evaluate()


if __name__ == "__main__":
    main()
