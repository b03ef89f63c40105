"""A multiple-choice item from a line of a task file: ours, or as the public tasks are distributed,
worded as lm-eval-harness words them (its prompts, its HellaSwag clean-up, Winogrande's partial
contexts), so the scores are comparable with its own.

- ours: `{"context": str, "choices": [str, ...], "label": int}` - each choice after a space;
- HellaSwag: `ctx_a`, `ctx_b`, `endings`, `label` (and `activity_label`);
- ARC: `question` (AI2's object with `stem` and `choices`, or Hugging Face's text with a `choices`
  object of `text` and `label` lists) and `answerKey`;
- PIQA: `goal`, `sol1`, `sol2`, `label`;
- Winogrande: `sentence` (with one `_`), `option1`, `option2`, `answer` ("1" or "2"): each option
  completes the sentence up to the blank, and the words after it are what is scored (`acc_norm`
  divides by those partial contexts' lengths, as lm-eval-harness would; it reports `acc` only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_MIN_CHOICES = 2


@dataclass(frozen=True)
class TaskItem:
    """One item: a (context, continuation) pair per choice, the right choice's index, and each
    choice's length in characters (what `acc_norm` divides by)."""

    pairs: tuple[tuple[str, str], ...]
    label: int
    lengths: tuple[int, ...]


def task_item(data: Any) -> TaskItem:
    """The item a line's JSON object holds; ValueError (or a lookup error) says what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if "context" in data:
        return _choices(data["context"], data["choices"], data["label"])
    if "endings" in data:
        return _hellaswag(data)
    if "answerKey" in data:
        return _arc(data)
    if "goal" in data:
        return _choices(
            f"Question: {data['goal']}\nAnswer:", [data["sol1"], data["sol2"]], int(data["label"])
        )
    if "sentence" in data:
        return _winogrande(data)
    raise ValueError(
        "not a task item: give context, choices and label (or a HellaSwag, ARC, PIQA or Winogrande line)"
    )


def _choices(context: Any, choices: Any, label: Any) -> TaskItem:
    """Each choice after the context and a space (lm-eval-harness's target delimiter)."""
    if not isinstance(context, str):
        raise ValueError("context is not a string")
    if (
        not isinstance(choices, list)
        or len(choices) < _MIN_CHOICES
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise ValueError(f"choices are not a list of {_MIN_CHOICES} or more non-empty strings")
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
        raise ValueError(f"label {label!r} is not the index of one of the {len(choices)} choices")
    return TaskItem(tuple((context, " " + c) for c in choices), label, tuple(len(c) for c in choices))


def _clean(text: str) -> str:
    """lm-eval-harness's clean-up of HellaSwag's WikiHow text."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def _hellaswag(data: dict[str, Any]) -> TaskItem:
    context = f"{data.get('activity_label', '')}: {data['ctx_a']} {str(data['ctx_b']).capitalize()}"
    return _choices(_clean(context), [_clean(str(e)) for e in data["endings"]], int(data["label"]))


def _arc(data: dict[str, Any]) -> TaskItem:
    question = data["question"]
    if isinstance(question, dict):  # AI2's own layout
        stem, options = question["stem"], question["choices"]
        texts, labels = [o["text"] for o in options], [o["label"] for o in options]
    else:  # Hugging Face's
        stem, texts, labels = question, data["choices"]["text"], data["choices"]["label"]
    return _choices(f"Question: {stem}\nAnswer:", list(texts), list(labels).index(data["answerKey"]))


def _winogrande(data: dict[str, Any]) -> TaskItem:
    sentence = str(data["sentence"])
    blank = sentence.index("_")
    after = " " + sentence[blank + 1 :].strip()
    options = [str(data["option1"]), str(data["option2"])]
    label = int(data["answer"]) - 1
    if label not in (0, 1):
        raise ValueError(f"answer {data['answer']!r} is not 1 or 2")
    contexts = tuple(sentence[:blank] + o for o in options)
    return TaskItem(tuple((c, after) for c in contexts), label, tuple(len(c) for c in contexts))  # as lm-eval
