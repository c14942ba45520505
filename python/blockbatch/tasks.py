"""Task sets and how a generation is scored against them: what ``blockbatch bench`` and
``blockbatch tune`` decode and check.

Three sources:

- the toy task's held-out problems (``path`` None): its own answer check;
- a JSONL file: one task per line, ``{"prompt": TEXT}`` or ``{"ids": [TOKEN, ...]}`` (as
  ``blockbatch generate --input`` reads them), with ``"answer"``: a string or a number (checked
  against the generated text by an :class:`AnswerCheck`) or a list of token ids (the generated
  ids, cut at EOS, must equal it);
- an lm-evaluation-harness generation task (:func:`load_lm_eval`): its documents, prompts (with
  the task's few-shot context), stop strings, filters and metric, through the harness's own API.

A :class:`Sample`'s ``check`` takes the generation (anything with ``.text`` and ``.ids``) and
returns its score in [0, 1]: 1.0 / 0.0 for an answer check, the task metric's value for an
lm-eval task.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import os
import re
import signal
import threading
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Protocol


class Generated(Protocol):
    text: str
    ids: list[int]


@dataclasses.dataclass
class Sample:
    prompt: str | list[int]  # text, or token ids
    check: Callable[[Generated], float] | None  # None: no answer (``answers_optional``)
    answer: Any = None  # what the check compares against, for reports (None: no answer)
    # How a text prompt becomes ids (``encode``): "chat", through the checkpoint's chat template
    # when it has one (Engine.encode's default); "raw", the text as it is; "harness", an lm-eval
    # context as blockbatch.lm_eval encodes it (raw, the special tokens' texts as tokens).
    encoding: str = "chat"


@dataclasses.dataclass
class TaskSet:
    samples: list[Sample]
    source: str  # "toy", the file's path, or "lm-eval:NAME"
    sha256: str  # of the task file's bytes, or of the documents and prompts (toy, lm-eval)
    scored_by: str  # "toy check", "exact", "last-number", "regex ...", "ids", "lm-eval ...", "reference"
    available: int  # tasks the source holds (at least len(samples))


# --------------------------------------------------------------------------- answer checks

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


def _number(text: str) -> Decimal | None:
    """``text`` as an exact number (None: not a finite number). Never rounded: Decimal's
    normalize() would round to 28 digits and make two long numbers equal; equality of Decimals
    is exact and ignores trailing zeros ("2.5" == "2.50")."""
    try:
        value = Decimal(text.replace(",", ""))
    except (InvalidOperation, ValueError):
        return None
    return value if value.is_finite() else None  # "Infinity", "NaN", "sNaN": no answer can equal them


# --------------------------------------------------------------------------- a time bound on user regexes

# A user's regular expression (--answer-regex, an lm-eval task's regex filter) may backtrack
# catastrophically ('(.+)+!' on a long generation runs for minutes): each check runs under this
# bound, and one that exceeds it stops the run with an error naming the flag and the pattern (an
# answer check that silently scored 0 would bias the sweep).
REGEX_SECONDS = 1.0
LM_EVAL_SECONDS = 5.0  # a task's filters and metric: more room (a metric's first call may import)


class RegexTimeout(ValueError):
    """A check with a user regex ran past REGEX_SECONDS; the message names the flag and pattern."""


@contextlib.contextmanager
def time_bound(seconds: float, message: str):
    """Raise RegexTimeout(``message``) when the body runs longer than ``seconds`` (SIGALRM: the
    regex engine checks for signals as it backtracks). Only in the main thread, where Python
    handles signals; elsewhere the body runs unbounded."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    class _Expired(BaseException):  # not an Exception: no `except Exception` in the body swallows it
        pass

    def expire(signum, frame):
        raise _Expired()

    previous = signal.signal(signal.SIGALRM, expire)
    outer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Expired:
        raise RegexTimeout(message) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer[0] > 0:  # an outer timer was running: it goes on (less the time spent here)
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - seconds, 1e-3), outer[1])


@dataclasses.dataclass(frozen=True)
class AnswerCheck:
    """How a text generation is compared with a task's answer.

    - ``exact``: the stripped generation equals the stripped answer;
    - ``last-number``: the last number in the generation (``-3``, ``1,234``, ``2.50``) equals the
      answer as a number (``"2.5"`` == ``2.50``); no number: wrong;
    - ``regex``: the last match of ``pattern`` in the generation; its first capture group (the
      whole match when the pattern has none), stripped, equals the stripped answer; no match: wrong.
    """

    kind: str = "exact"
    pattern: str | None = None

    KINDS = ("exact", "last-number")

    def __post_init__(self):
        if self.kind == "regex":
            if not self.pattern:
                raise ValueError("--answer-regex: the pattern is empty")
            try:
                re.compile(self.pattern)
            except re.error as e:
                raise ValueError(f"--answer-regex {self.pattern!r}: not a valid regular expression ({e})") from None
        elif self.kind not in self.KINDS:
            raise ValueError(f"--answer {self.kind!r}: the answer checks are exact, last-number (or --answer-regex)")

    @property
    def name(self) -> str:
        return f"regex {self.pattern}" if self.kind == "regex" else self.kind

    def extract(self, text: str) -> str | None:
        """The part of ``text`` compared with the answer (None: nothing to compare)."""
        if self.kind == "exact":
            return text.strip()
        if self.kind == "last-number":
            found = _NUMBER.findall(text)
            return found[-1] if found else None
        assert self.pattern is not None
        last = None
        with time_bound(
            REGEX_SECONDS,
            f"--answer-regex {self.pattern!r}: matching one generation ({len(text)} characters) took more than "
            f"{REGEX_SECONDS:g} s: the pattern backtracks catastrophically (nested repeats such as '(.+)+'); "
            "rewrite it without nested or overlapping repeats",
        ):
            for last in re.finditer(self.pattern, text):
                pass
        if last is None:
            return None
        got = last.group(1) if last.re.groups else last.group(0)
        return None if got is None else got.strip()

    def matches(self, text: str, answer: str) -> bool:
        got = self.extract(text)
        if got is None:
            return False
        if self.kind == "last-number":
            a, g = _number(answer.strip()), _number(got)
            return a is not None and g is not None and a == g
        return got == answer.strip()


def _text_check(check: AnswerCheck, answer: str) -> Callable[[Generated], float]:
    return lambda g: float(check.matches(g.text, answer))


def _ids_check(answer: list[int]) -> Callable[[Generated], float]:
    return lambda g: float(list(g.ids) == answer)


# --------------------------------------------------------------------------- sources


def load_toy(n: int) -> TaskSet:
    from .toy import task

    problems = task.make_problems(n, 0, "test")
    samples = [
        Sample(p.prompt, (lambda p: lambda g: float(task.check_answer(p, g.text)))(p), p.answer) for p in problems
    ]
    return TaskSet(samples, "toy", _sha([s.prompt for s in samples]), "toy check", n)


def load_jsonl(
    path: str, n: int, check: AnswerCheck | None = None, answers_optional: bool = False, encoding: str = "chat"
) -> TaskSet:
    """The first ``n`` tasks of a JSONL file (see the module docstring). Errors name the file, the
    line and the key. ``answers_optional``: a line may leave out "answer" (its check is None).
    ``encoding``: how text prompts become ids (``Sample.encoding``)."""
    from .errors import CheckpointError, open_checked

    check = check or AnswerCheck()
    try:
        f, _ = open_checked(path, "task file")
    except CheckpointError as e:
        raise ValueError(str(e)) from None
    out: list[Sample] = []
    digest = hashlib.sha256()
    available = 0
    with f:
        for lineno, raw in enumerate(f, 1):
            digest.update(raw)
            if not raw.strip():
                continue
            available += 1
            if len(out) >= n:
                continue  # counted and hashed, not parsed
            out.append(dataclasses.replace(_line(path, lineno, raw, check, answers_optional), encoding=encoding))
    kinds = {"ids" if isinstance(s.answer, list) else "text" for s in out if s.check is not None}
    scored_by = "reference" if not kinds else "/".join(sorted(check.name if k == "text" else k for k in kinds))
    return TaskSet(out, path, digest.hexdigest(), scored_by, available)


def jsonl_text(raw: bytes, line: int) -> str:
    """A JSONL line's text: UTF-8 (a BOM at the start of the file dropped), else ValueError
    naming the byte and its offset in the line. (Task files and ``generate --input`` alike.)"""
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at byte offset {e.start} of the line)") from None


ONE_PROMPT = 'give exactly one of "prompt" (text) and "ids" (token ids)'


def prompt_field(row: dict) -> tuple[Any, str]:
    """A request line's prompt and its key: exactly one of "prompt" and "ids" (else ValueError)."""
    if ("prompt" in row) == ("ids" in row):
        raise ValueError(ONE_PROMPT)
    return (row["prompt"], "prompt") if "prompt" in row else (row["ids"], "ids")


def _line(path: str, lineno: int, raw: bytes, check: AnswerCheck, answers_optional: bool) -> Sample:
    where = f"{path}:{lineno}"
    try:
        line = jsonl_text(raw, lineno)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    try:
        row = json.loads(line)
    except RecursionError:
        raise ValueError(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, or an integer literal of more than 4300 digits
        raise ValueError(f'{where}: not a JSON object ({e}); expected {{"prompt": ..., "answer": ...}}') from None
    if not isinstance(row, dict):
        raise ValueError(f'{where}: expected a JSON object {{"prompt": ..., "answer": ...}}, got {type(row).__name__}')
    if ("prompt" in row) == ("ids" in row):
        raise ValueError(f"{where}: {ONE_PROMPT}")
    if "prompt" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f'{where}: "prompt" must be a non-empty string, got {_kind(prompt)}')
    else:
        prompt = row["ids"]
        bad = _not_ids(prompt)
        if bad:
            raise ValueError(f'{where}: "ids" {bad}')
    if "answer" not in row or row["answer"] is None:
        if answers_optional:
            return Sample(prompt, None)
        raise ValueError(f'{where}: no "answer" (a string, a number or a list of token ids)')
    answer = row["answer"]
    if isinstance(answer, list):
        bad = _not_ids(answer, allow_empty=True)
        if bad:
            raise ValueError(f'{where}: "answer" as token ids {bad}')
        if check.kind != "exact":
            raise ValueError(f'{where}: "answer" is token ids, which only the exact check compares (not {check.name})')
        return Sample(prompt, _ids_check([int(t) for t in answer]), [int(t) for t in answer])
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
        raise ValueError(f'{where}: "answer" must be a string, a number or a list of token ids, got {_kind(answer)}')
    if isinstance(answer, float) and not math.isfinite(answer):
        # 1e400 parses as inf, NaN / Infinity literals as themselves: no generation can equal them
        raise ValueError(
            f'{where}: "answer" is not a finite number ({answer!r} as parsed; a literal such as 1e400 is '
            f'past the float range): give it as a string, e.g. "1e400"'
        )
    text = answer if isinstance(answer, str) else json.dumps(answer)
    if check.kind == "last-number" and _number(text.strip()) is None:
        finite = "finite " if _is_decimal(text.strip()) else ""  # "Infinity", "NaN": numbers no text can equal
        raise ValueError(f'{where}: "answer" {text!r} is not a {finite}number, which --answer last-number needs')
    return Sample(prompt, _text_check(check, text), text)


def _is_decimal(text: str) -> bool:
    try:
        Decimal(text.replace(",", ""))
    except (InvalidOperation, ValueError):
        return False
    return True


def _kind(x: Any) -> str:
    return "an empty string" if x == "" else type(x).__name__


def _not_ids(x: Any, allow_empty: bool = False) -> str | None:
    """Why ``x`` is not a list of token ids (None: it is one)."""
    if not isinstance(x, list):
        return f"must be a list of integer token ids, got {type(x).__name__}"
    if not x and not allow_empty:
        return "must hold at least one token id"
    for i, t in enumerate(x):
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            return f"[{i}] must be a non-negative integer token id, got {t!r}"
    return None


def _sha(items: list) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- lm-evaluation-harness


def load_lm_eval(
    name: str,
    n: int,
    include_path: str | None = None,
    metric: str | None = None,
    filter_name: str | None = None,
) -> TaskSet:
    """The first ``n`` documents of an lm-evaluation-harness ``generate_until`` task: the prompt
    the harness builds (the task's few-shot context included), and a check that cuts the
    generation at the task's stop strings, runs the task's filter and scores it with its metric
    (``metric``: the first of the task's metrics by default; ``filter_name``: the first filter)."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise ValueError(f"--lm-eval-task needs lm-eval installed (pip install lm-eval): {e}") from None
    import logging

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    if include_path is not None:
        if not os.path.exists(include_path):
            raise ValueError(f"--include-path {include_path}: no such folder")
        if not os.path.isdir(include_path):
            raise ValueError(f"--include-path {include_path}: not a folder (give the folder of your task YAMLs)")
    try:
        manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    except Exception as e:  # the harness's own errors are plain exceptions
        raise ValueError(f"--include-path {include_path}: lm-eval cannot read its task files ({e})") from None
    if name not in manager.all_tasks:
        close = [t for t in manager.all_tasks if name.lower() in t.lower()][:8]
        hint = f"; close names: {', '.join(close)}" if close else ""
        broken = _yaml_errors(include_path) if include_path else []
        if broken:  # lm-eval skips a YAML it cannot read: say which and why, not "no such task"
            raise ValueError(
                f"--lm-eval-task {name!r}: lm-eval knows no such task, and --include-path {include_path} holds "
                f"task files it cannot read: " + "; ".join(broken)
            )
        where = f" (with --include-path {include_path})" if include_path else " (give --include-path DIR for your own)"
        raise ValueError(f"--lm-eval-task {name!r}: lm-eval knows no such task{where}{hint}")
    yaml_path = _task_yaml(manager, name)
    try:
        tasks = dict(manager.load([name])["tasks"])
    except (StopIteration, IndexError) as e:
        if isinstance(e, StopIteration) or "size 0" in str(e):  # the harness takes the first document
            raise ValueError(
                f"--lm-eval-task {name}: its data holds no documents (task file {yaml_path}; the split it "
                f"reads is empty)"
            ) from None
        raise ValueError(f"--lm-eval-task {name}: lm-eval cannot load it ({type(e).__name__}: {e})") from None
    except Exception as e:
        raise ValueError(f"--lm-eval-task {name}: lm-eval cannot load it ({type(e).__name__}: {e})") from None
    if len(tasks) != 1:
        raise ValueError(
            f"--lm-eval-task {name}: a group of {len(tasks)} tasks ({', '.join(sorted(tasks))}); give one of them"
        )
    [(task_name, task)] = tasks.items()
    if task.OUTPUT_TYPE != "generate_until":
        raise ValueError(
            f"--lm-eval-task {name}: output_type is {task.OUTPUT_TYPE!r}; the tuner decodes generate_until tasks "
            "(a masked diffusion model has no left-to-right likelihood)"
        )
    try:
        task.build_all_requests(limit=n, rank=0, world_size=1)
    except StopIteration:
        raise ValueError(f"--lm-eval-task {name}: its data holds no documents (task file {yaml_path})") from None
    instances = sorted(task.instances, key=lambda i: i.doc_id)
    if not instances:
        raise ValueError(f"--lm-eval-task {name}: its data holds no documents (task file {yaml_path})")
    filters = list(getattr(task, "_filters", []))
    names = [f.name for f in filters] or ["none"]
    if filter_name is not None and filter_name not in names:
        raise ValueError(f"--lm-eval-filter {filter_name!r}: task {task_name} has the filters {', '.join(names)}")
    fname = filter_name or names[0]
    metrics = list(task.aggregation())
    if metric is not None and metric not in metrics:
        raise ValueError(f"--lm-eval-metric {metric!r}: task {task_name} reports {', '.join(metrics)}")
    metric = metric or metrics[0]
    samples = []
    for inst in instances:
        context, gen_kwargs = inst.args
        until = gen_kwargs.get("until")
        check = _lm_eval_check(task, inst, filters, fname, metric, until)
        samples.append(Sample(context, check, task_name, encoding="harness"))
    docs = [[inst.doc_id, inst.args[0]] for inst in instances]
    scored = f"lm-eval {task_name} {metric}" + (f" ({fname})" if fname != "none" else "")
    return TaskSet(samples, f"lm-eval:{task_name}", _sha(docs), scored, len(instances))


def _task_yaml(manager, name: str) -> str:
    """The YAML file lm-eval read task ``name`` from ("?" when its index does not say)."""
    entry = getattr(manager, "task_index", {}).get(name)
    path = getattr(entry, "yaml_path", None) or (entry.get("yaml_path") if isinstance(entry, dict) else None)
    return str(path) if path and path != -1 else "?"


def _yaml_errors(folder: str) -> list[str]:
    """'FILE: problem' for each YAML file under ``folder`` that does not parse (lm-eval's own
    tags such as !function taken as they are)."""
    try:
        import yaml
    except ImportError:
        return []

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    out = []
    for root, _dirs, files in os.walk(folder):
        for file in sorted(files):
            if not file.endswith((".yaml", ".yml")):
                continue
            path = os.path.join(root, file)
            try:
                with open(path, encoding="utf-8") as f:
                    doc = yaml.load(f, Loader=Loader)  # noqa: S506 - SafeLoader with inert tags
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                problem = getattr(e, "problem", None) or str(e).splitlines()[0]
                out.append(f"{path}: not valid YAML ({problem}{at})")
                continue
            except (OSError, UnicodeDecodeError) as e:
                out.append(f"{path}: cannot be read ({e})")
                continue
            if not isinstance(doc, dict):
                out.append(f"{path}: not a mapping of task keys (got {type(doc).__name__})")
    return out


ENCODINGS = ("chat", "raw", "harness")


def harness_ids(codec, context: str, template_applied: bool = False) -> list[int]:
    """An lm-eval context's ids as the harness model (blockbatch.lm_eval) feeds them: the text as
    it is, never through the chat template (the harness renders its own with
    --apply_chat_template, and then the tokenizer's BOS is already in it); the special tokens'
    texts a template rendered are those tokens."""
    return codec.encode(context, chat=False, add_special_tokens=not template_applied, special_tokens=True)


def encode(engine, sample: Sample):
    """A sample's prompt as the int64 ids its decode gets (``Sample.encoding``)."""
    import torch

    if sample.encoding not in ENCODINGS:
        raise ValueError(f"Sample.encoding must be one of {', '.join(ENCODINGS)}, got {sample.encoding!r}")
    if sample.encoding == "harness" and isinstance(sample.prompt, str) and engine.codec is not None:
        return engine.encode(torch.tensor(harness_ids(engine.codec, sample.prompt), dtype=torch.long))
    return engine.encode(sample.prompt, False if sample.encoding == "raw" else None)


def cut_at_stops(text: str, until: str | list[str] | None) -> str:
    """``text`` up to its first stop string (as a left-to-right engine stops there); ``until`` as
    lm-eval's gen_kwargs give it (one string, a list, or nothing)."""
    for s in [until] if isinstance(until, str) else until or []:
        if s:
            i = text.find(s)
            if i >= 0:
                text = text[:i]
    return text


def _lm_eval_check(task, inst, filters, fname: str, metric: str, until: str | list[str] | None):
    name = getattr(task, "config", None) and getattr(task.config, "task", None) or "the task"

    def check(g: Generated) -> float:
        one = copy.copy(inst)
        one.resps = [cut_at_stops(g.text, until)]
        one.filtered_resps = {}
        # the task's filters and metric may run its own regular expressions: bounded as --answer-regex is
        with time_bound(
            LM_EVAL_SECONDS,
            f"--lm-eval-task {name}: its filters and metric took more than {LM_EVAL_SECONDS:g} s on one generation "
            f"({len(g.text)} characters): a regular expression of the task (regex filter, regexes_to_ignore) "
            "backtracks catastrophically; rewrite it",
        ):
            for f in filters:
                f.apply([one])
            resp = one.filtered_resps.get(fname, one.resps[0]) if filters else one.resps[0]
            value = task.process_results(inst.doc, [resp])[metric]
        return float(value)

    return check
