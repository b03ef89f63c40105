"""A coreopt program as lm-eval-harness's model, so its own tasks run on `.pt2` and `.aimodel` files.

`HarnessModel` needs no lm-eval: it answers the arguments of lm-eval's three requests as its
Hugging Face model (HFLM) does. `loglikelihood`: a (context, continuation) pair cut by `PairCoder`
(the context's trailing spaces moved on; the model's start token for an empty context), scored as
`coreopt eval --task` scores a choice, with whether greedy decoding makes the continuation.
`loglikelihood_rolling`: a whole text, every token predicted once, the first after the start token,
in windows of the program's length, each with as much context before it as the window holds.
`generate_until`: greedy tokens after the context cut to the window less `max_gen_toks` (or its
aliases), until a stop string, an end-of-sequence id or `max_gen_toks`. The start token is the
model config's (start of sequence, else end of sequence); lm-eval's model reads the tokenizer's,
which differs for a few models (Qwen2.5-Instruct): `prefix_token_id` gives it, as there.

`lm_eval_model()` wraps it in lm-eval's `LM` class and registers it as "coreopt"; nothing imports
lm-eval until then (it depends on scikit-learn, which coreopt does not install: the user does).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from coreai_opt.errors import ConfigError
from coreai_opt.io import model_format, require_existing

from ._language import LanguageSide
from ._tasks import PairCoder, continuation_loglikelihood

_MAX_GEN_TOKS = 256  # lm-eval's default for `generate_until` when a task names none
_MAX_TOKENS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")  # lm-eval's order
LM_EVAL_NAME = "coreopt"  # the model name `lm_eval --model` takes


class HarnessModel:
    """One program (a `.pt2` on `device`, or an `.aimodel` on the Core AI runtime) and its tokenizer
    (default: the one `coreopt export` saved beside it), answering lm-eval's requests' arguments."""

    def __init__(
        self,
        path: Path | str,
        tokenizer: Path | str | None = None,
        trust_pickle: bool = False,
        device: str | None = None,
        prefix_token_id: int | None = None,
    ) -> None:
        from ._tokens import tokenizer_for

        self.path = Path(path)
        require_existing(self.path)
        model_format(self.path)
        found = tokenizer_for(self.path, "", tokenizer)
        assert found is not None
        self.coder = PairCoder(found, self.path, prefix_token_id)
        self._stack = contextlib.ExitStack()
        self.side = LanguageSide.open(self.path, trust_pickle, self._stack, None, device)

    @property
    def max_length(self) -> int:
        """The tokens one run of the program sees."""
        return self.side.length

    def close(self) -> None:
        self._stack.close()

    def loglikelihood(self, pairs: Iterable[tuple[str, str]]) -> list[tuple[float, bool]]:
        """Each continuation's summed log-probability after its context, and whether it is greedy."""
        return [continuation_loglikelihood(self.side, self.coder.pair(c, x)) for c, x in pairs]

    def loglikelihood_rolling(self, texts: Iterable[str]) -> list[float]:
        """Each text's summed log-probability, every token predicted once (see the module)."""
        return [
            sum(
                continuation_loglikelihood(self.side, pair)[0]
                for pair in self._windows(self.coder.encode(text))
            )
            for text in texts
        ]

    def generate_until(self, requests: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
        """Greedy text after each context, cut before the first of its `until` strings."""
        return [self._generate(context, dict(options)) for context, options in requests]

    def _windows(self, ids: list[int]) -> Iterator[tuple[list[int], list[int]]]:
        """(context, continuation) pairs predicting `ids` once each: the start token then `ids`, cut
        into runs of the window's length, each pair's whole the window's length plus one."""
        if not ids:
            return
        tokens, length = [self.coder.start(), *ids], self.max_length
        done = 0
        while done < len(ids):
            end = min(done + length, len(ids))
            yield tokens[max(0, end - length) : done + 1], ids[done:end]
            done = end

    def _generate(self, context: str, options: dict[str, Any]) -> str:
        until = options.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        most = int(next((options[k] for k in _MAX_TOKENS if options.get(k) is not None), _MAX_GEN_TOKS))
        sampled = options.get("do_sample")
        if sampled or (sampled is None and float(options.get("temperature") or 0) > 0):
            raise ConfigError(
                "coreopt generates greedily for lm-eval: a task that samples is not taken", "gen_kwargs"
            )
        if not 0 < most < self.max_length:
            raise ConfigError(f"max_gen_toks {most} leaves no room for a context in the program's window "
                              f"of {self.max_length} tokens", "gen_kwargs")  # fmt: skip
        ids = (self.coder.encode(context) or [self.coder.start()])[-(self.max_length - most) :]
        made: list[int] = []
        text = ""
        for _ in range(most):  # the context and what is made fit the window, as lm-eval's model cuts them
            token = int(self.side.sequence_logits(ids + made)[-1].argmax())
            if token in self.coder.stops:
                break
            made.append(token)
            text = self.coder.tokenizer.decode(made)
            cuts = [text.find(s) for s in until if s and s in text]
            if cuts:
                return text[: min(cuts)]
        return text


def lm_eval_model() -> type:
    """lm-eval's `LM` over `HarnessModel`, registered as "coreopt" (`lm_eval --model coreopt
    --model_args path=smol.pt2[,tokenizer=...,device=cuda]`); needs lm-eval installed."""
    from lm_eval.api.model import LM
    from lm_eval.api.registry import get_model, register_model

    with contextlib.suppress(Exception):  # registered already (a second call): the same class
        return get_model(LM_EVAL_NAME)  # type: ignore[no-any-return]

    class CoreoptLM(LM):  # type: ignore[misc]
        """A coreopt program: `path`, optional `tokenizer`, `device` (a `.pt2`'s) and `trust_pickle`."""

        def __init__(self, path: str, tokenizer: str | None = None, device: str | None = None,
                     trust_pickle: bool | str = False, prefix_token_id: int | str | None = None,
                     **_: Any) -> None:  # fmt: skip
            super().__init__()
            trusted = str(trust_pickle).lower() in ("1", "true", "yes")
            prefix = None if prefix_token_id is None else int(prefix_token_id)
            self.model = HarnessModel(path, tokenizer, trusted, _available(device), prefix)

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
            return self.model.loglikelihood(r.args for r in requests)

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
            return self.model.loglikelihood_rolling(r.args[0] for r in requests)

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            return self.model.generate_until(r.args for r in requests)

        @property
        def tokenizer_name(self) -> str:
            return str(self.model.coder.path)

    register_model(LM_EVAL_NAME)(CoreoptLM)
    return CoreoptLM


def _available(device: str | None) -> str | None:
    """lm-eval's `--device` (its default is "cuda"), or the CPU where no GPU is, as its own model does."""
    import torch

    if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"no CUDA device: the program runs on the CPU, not {device}", stacklevel=3)
        return None
    return device
