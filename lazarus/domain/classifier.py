"""Classify why a distributed PyTorch training run failed, from the tail of its log.

The classifier is a table of weighted regular-expression rules, one block per
:class:`~lazarus.domain.failure_classes.FailureClass`, kept as data in
:mod:`lazarus.domain.classifier_rules`; this module is the engine that runs it. Every
rule targets wording that the real stack prints (PyTorch / c10d / ProcessGroupNCCL,
NCCL itself, torchrun's elastic agent, DeepSpeed, Lightning, Slurm, the NVIDIA driver,
the Linux kernel, Ray, gloo), not anything specific to one job. Scoring works like
this:

* Each rule has literal *needles*; a rule only runs on the lines around needle
  hits, and a needle is only looked for when its words occur in the log at all,
  so a 1 MB tail takes tens of milliseconds.
* A rule that matches on ``n`` distinct lines adds ``weight * (1 + 0.1 * (n-1))``
  (at most ``1.5 * weight``) to its class: repetition across ranks helps a bit,
  but one decisive line beats a flood of noise.
* *Hint* rules (a bare SIGKILL, an exit code, a traceback frame) are capped per
  class, so circumstantial evidence never outvotes one explicit message.
* Collective timeouts and NCCL transport errors are usually *symptoms*: when
  another class has a concrete message (a non-hint rule of weight >= 6), their
  scores are scaled down, so an ECC error, a CUDA OOM or a Python exception on
  one rank wins over the other ranks' watchdog timeouts.
* Nothing above ``_MIN_SCORE`` means ``UNKNOWN``. ``HANG`` is never produced here:
  it comes from Lazarus's own progress monitoring.

Everything here is pure, deterministic and standard-library only.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from lazarus.domain.classifier_rules import RULES, VOCAB_CHUNK, VOCAB_STEP, Rule
from lazarus.domain.failure_classes import FailureClass

__all__ = ["Classification", "RootCause", "classify", "root_cause"]

_FC = FailureClass

# The rule table (:mod:`lazarus.domain.classifier_rules`), read through this name so a
# test may swap it (tests/classifier_accuracy.py drops one rule at a time).
_RULES: tuple[Rule, ...] = RULES

# Tuning knobs, on the rule weights' scale: >= 10 means "this line alone settles it",
# 5-8 strong, <= 4 supporting.
_MIN_SCORE = 2.5  # below this the answer is UNKNOWN
_HINT_CAP = 7.0  # total a class may collect from hint rules
_DECISIVE = 6.0  # a non-hint rule this heavy marks its class as a concrete cause
_SYMPTOM_FACTOR = 0.3  # applied to timeout/transport classes when a cause is present
_MAX_EVIDENCE = 5
_MAX_LINES_PER_RULE = 32  # matched lines kept per rule
_MAX_SCAN_PER_NEEDLE = 64  # lines examined per needle, newest first
_EVIDENCE_CHARS = 300
_DEWRAP_BELOW = 10.0  # retry with hard wraps undone when the best score is below this
_DEWRAP_MIN_WIDTH = 60  # narrower "wrap widths" are just short lines
_LONG_LINE = 4096  # on longer lines, regexes only look this far around a needle hit

_SYMPTOM_CLASSES = frozenset({_FC.NCCL_TIMEOUT, _FC.NCCL_ERROR})

# Deterministic tie-break between equal scores: more specific / actionable first.
_PRIORITY: tuple[FailureClass, ...] = (
    _FC.GPU_HARDWARE,
    _FC.OOM_GPU,
    _FC.OOM_HOST,
    _FC.KILLED,
    _FC.NODE_LOST,
    _FC.PREEMPTED,
    _FC.STORAGE,
    _FC.NUMERICAL,
    _FC.RENDEZVOUS,
    _FC.NCCL_ERROR,
    _FC.NCCL_TIMEOUT,
    _FC.USER_CODE,
    _FC.HANG,
    _FC.UNKNOWN,
)


@dataclass(frozen=True)
class Classification:
    """The verdict for one log.

    ``evidence`` holds the (trimmed) log lines that decided it, in log order;
    ``confidence`` is in [0, 1]; ``scores`` maps every class that matched anything
    to its final score, so callers can see the runner-up.

    ``circumstantial`` is True when the verdict rests on hints alone (an exit code,
    a signal, a bare "Killed" or "exitcode: -9" line) and no explicit message: a
    bare SIGKILL reads as ``oom_host`` here because that is its most common cause
    in published logs, but the supervisor only keeps that class when the kernel
    confirms it (see :mod:`activities.kernel_evidence`).
    """

    failure_class: FailureClass
    evidence: list[str]
    confidence: float
    suspect_rank: int | None
    suspect_node: str | None
    scores: dict[str, float]
    circumstantial: bool = False


@dataclass(frozen=True)
class RootCause:
    """The earliest-failing rank of a job and the ranks whose failures followed it."""

    rank: int
    ended_at: float
    classification: Classification
    collateral: list[tuple[int, float, Classification]]


# bytes.translate table: keep lowercase ASCII letters and "_", blank out everything else
_WORD_BYTES = bytes(c if (97 <= c <= 122 or c == 95) else 32 for c in range(256))
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _normalise(text: str) -> str:
    # tqdm progress bars separate updates with '\r'; treat them as line breaks.
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _lower_same_length(text: str) -> str:
    lower = text.lower()
    # A few non-ASCII characters change length when lowered; offsets must stay aligned.
    return lower if len(lower) == len(text) else text.translate(_ASCII_LOWER)


def _line_bounds(text: str, pos: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return start, (len(text) if end == -1 else end)


class _Scanner:
    """One log prepared for rule matching: normalised text, a same-length lowercase
    copy, the log's vocabulary, and needle positions shared between rules."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lower = _lower_same_length(text)
        # Distinct words of the log. A needle is only searched for in the full text
        # if all of its letter runs occur here, which rules out most rules cheaply.
        words = set(self.lower.encode("utf-8", "ignore").translate(_WORD_BYTES).split())
        long_words = [w for w in words if len(w) > VOCAB_CHUNK]
        if long_words:
            # Blobs (a megabyte of one "word") would make every membership test slow:
            # keep them as overlapping chunks, so any gate word up to
            # VOCAB_CHUNK - VOCAB_STEP letters still appears whole in one chunk.
            words.difference_update(long_words)
            for w in long_words:
                words.update(w[i : i + VOCAB_CHUNK] for i in range(0, len(w), VOCAB_STEP))
        self.vocabulary = b" ".join(words)
        self._lines: dict[str, list[tuple[int, int]]] = {}

    def needle_lines(self, needle: str, gate: tuple[bytes, ...]) -> list[tuple[int, int]]:
        """``(line_start, position)`` of the newest hit of ``needle`` on each of the
        last ``_MAX_SCAN_PER_NEEDLE`` lines containing it, newest first (failures are
        reported at the end of a log)."""
        cached = self._lines.get(needle)
        if cached is not None:
            return cached
        hits: list[tuple[int, int]] = []
        if all(word in self.vocabulary for word in gate):
            text, lower = self.text, self.lower
            pos = lower.rfind(needle)
            while pos != -1 and len(hits) < _MAX_SCAN_PER_NEEDLE:
                start = text.rfind("\n", 0, pos) + 1
                hits.append((start, pos))
                pos = lower.rfind(needle, 0, start) if start > 0 else -1
        self._lines[needle] = hits
        return hits

    def matched_lines(self, rule: Rule) -> list[int]:
        """Start offsets (in log order) of lines on which ``rule`` matches.

        The regex runs on the previous, current and next line around each needle
        hit, so a phrase hard-wrapped across two lines still matches; a match is
        attributed to the line where it starts.
        """
        text = self.text
        size = len(text)
        found: set[int] = set()
        checked: set[int] = set()
        for needle, gate in zip(rule.needles, rule.gates, strict=True):
            for start, pos in self.needle_lines(needle, gate):
                if len(found) >= _MAX_LINES_PER_RULE:
                    break
                if start in checked:
                    continue
                checked.add(start)
                end = _line_bounds(text, start)[1]
                if end - start > _LONG_LINE:
                    # a huge "line" (a blob, a progress bar without newlines): only
                    # look around the needle instead of running the regex on all of it
                    win_start = max(start, pos - _LONG_LINE // 2)
                    win_end = min(end, pos + _LONG_LINE // 2)
                else:
                    win_start = text.rfind("\n", 0, start - 1) + 1 if start > 0 else 0
                    nxt = text.find("\n", end + 1) if end < size else -1
                    win_end = size if nxt == -1 else nxt
                for m in rule.pattern.finditer(text, win_start, win_end):
                    if m.end() <= start or m.start() > end:
                        continue
                    found.add(text.rfind("\n", 0, m.start()) + 1)
        return sorted(found)


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _EVIDENCE_CHARS else line[: _EVIDENCE_CHARS - 3] + "..."


# ---------------------------------------------------------------- exit code / signal hints

_EXIT_CODE_HINTS: dict[int, tuple[FailureClass, float]] = {
    -9: (_FC.OOM_HOST, 5.0),
    137: (_FC.OOM_HOST, 5.0),
    -15: (_FC.PREEMPTED, 5.0),
    143: (_FC.PREEMPTED, 5.0),
    -1: (_FC.PREEMPTED, 5.0),
    129: (_FC.PREEMPTED, 5.0),
    -2: (_FC.PREEMPTED, 4.0),
    130: (_FC.PREEMPTED, 4.0),
    -7: (_FC.OOM_HOST, 2.0),
    135: (_FC.OOM_HOST, 2.0),
    1: (_FC.USER_CODE, 1.5),
}

_SIGNAL_HINTS: dict[str, tuple[FailureClass, float]] = {
    "KILL": (_FC.OOM_HOST, 5.0),
    "TERM": (_FC.PREEMPTED, 5.0),
    "HUP": (_FC.PREEMPTED, 5.0),
    "INT": (_FC.PREEMPTED, 4.0),
    "BUS": (_FC.OOM_HOST, 2.0),
}
_SIGNAL_NUMBERS = {"9": "KILL", "15": "TERM", "1": "HUP", "2": "INT", "7": "BUS"}


def _signal_hint(signal: str | None) -> tuple[FailureClass, float] | None:
    if not signal:
        return None
    name = signal.strip().upper().rsplit(".", 1)[-1].split(":", 1)[0].strip()
    name = name.removeprefix("SIG")
    name = _SIGNAL_NUMBERS.get(name.lstrip("-"), name)
    return _SIGNAL_HINTS.get(name)


# ---------------------------------------------------------------- suspect rank / node

_RC_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)", re.MULTILINE)
_RC_HOST_RE = re.compile(r"^\s*host\s*:\s*(\S+)", re.MULTILINE)

_RANK_RES: tuple[re.Pattern[str], ...] = (
    re.compile(r"\[rank(\d+)\]:"),  # torch log prefix "[rank3]:"
    re.compile(r"\[Rank\s+(\d+)\s*\]"),  # ProcessGroupNCCL "[Rank 3]"
    re.compile(r"\[rank:\s*(\d+)\]"),  # Lightning "[rank: 3]"
    re.compile(r"(?<![\w-])rank\s*[:=]?\s*(\d+)\b", re.IGNORECASE),  # "Rank 3", "rank: 3"
    re.compile(r"\blocal_rank\s*[:=]\s*(\d+)"),  # torchrun "failed (exitcode: -9) local_rank: 3"
)
_ERROR_LINE_RANK_RE = re.compile(
    r"\s*(?:\d+:\s*)?\[rank(\d+)\]:.*(?:Error|Exception|error:|Traceback)"
)

_NOT_A_HOST = re.compile(r"(?:error|warn|info|debug|fatal|\.py)$|^(?:python|cuda|epoch|iter)", re.I)
_NODE_RES: tuple[re.Pattern[str], ...] = (
    re.compile(r"^([\w.-]+):\d+:\d+\s+\[\d+\]"),  # NCCL "host:pid:tid [dev] ..."
    re.compile(r"^\[([A-Za-z][\w.-]*):\d+\]:"),  # srun --label style "[gpu187:2]:"
    re.compile(r"^([A-Za-z][\w-]*\d[\w.-]*):\s"),  # pdsh / DeepSpeed "node-12: ..."
    re.compile(r"\bON\s+(\S+)\s+CANCELLED\s+AT"),  # Slurm "*** JOB 1 ON node1 CANCELLED AT"
    re.compile(r"srun:\s+error:\s+([\w.-]+):\s+tasks?\s"),  # "srun: error: node1: task 0: ..."
    re.compile(r"Node\s+failure\s+on\s+([\w.-]+)"),
    re.compile(r"^\w{3}\s+\d+\s+\d\d:\d\d:\d\d\s+(\S+)\s+kernel:"),  # syslog
    re.compile(r"\bnode:\s*([\w.-]+)"),  # Megatron "Device: 5, node: node-15-11"
    re.compile(r"\bhost(?:name)?\s*[:=]\s*([\w.-]+)"),
)


def _rank_in(line: str) -> int | None:
    for rx in _RANK_RES:
        m = rx.search(line)
        if m:
            return int(m.group(1))
    return None


def _node_in(line: str) -> str | None:
    for rx in _NODE_RES:
        m = rx.search(line)
        if m and not _NOT_A_HOST.search(m.group(1)):
            return m.group(1)
    return None


def _suspects(scanner: _Scanner, evidence: list[str]) -> tuple[int | None, str | None]:
    """Best guess at the rank and node where the failure started.

    torchrun's "Root Cause (first observed failure)" block wins when present;
    otherwise the decisive evidence lines are searched for rank prefixes and host
    names, and finally the last ``[rankN]:`` line that reports an error.
    """
    text, lower = scanner.text, scanner.lower
    rank: int | None = None
    node: str | None = None
    at = lower.find("root cause (first observed failure)")
    if at != -1:
        block = text[at : at + 2000]
        if (rm := _RC_RANK_RE.search(block)) is not None:
            rank = int(rm.group(1))
        if (hm := _RC_HOST_RE.search(block)) is not None:
            node = hm.group(1)
    for line in evidence:
        if rank is None:
            rank = _rank_in(line)
        if node is None:
            node = _node_in(line)
    if rank is None:
        for start, _ in scanner.needle_lines("[rank", (b"rank",)):
            line = text[start : _line_bounds(text, start)[1]]
            if (em := _ERROR_LINE_RANK_RE.match(line)) is not None:
                rank = int(em.group(1))
                break
    return rank, node


# ---------------------------------------------------------------- hard-wrapped logs


def _dewrap(text: str) -> str | None:
    """Undo fixed-width hard wrapping, or return None if the log does not look wrapped.

    A log is taken as wrapped at width ``w`` when ``w`` is both the longest line
    length (ignoring trailing blanks) and shared by several lines: a terminal or
    issue tracker cut every long line there. Each line of exactly that length is
    then joined to the next one without a separator (the cut falls mid-word).
    """
    lines = text.split("\n")
    lengths = Counter(len(line) for line in lines if len(line) >= _DEWRAP_MIN_WIDTH)
    if not lengths:
        return None
    width, count = lengths.most_common(1)[0]
    if count < 2 or width != max(lengths):
        return None
    out: list[str] = []
    carry = ""
    for line in lines:
        if len(line) == width and not line.endswith(" "):
            carry += line
            continue
        out.append(carry + line)
        carry = ""
    if carry:
        out.append(carry)
    return "\n".join(out)


# ---------------------------------------------------------------- classify


def classify(
    log_text: str, exit_code: int | None = None, signal: str | None = None
) -> Classification:
    """Classify one log (typically a rank's or launcher's last ~1 MB of output).

    ``exit_code`` and ``signal`` are what the supervisor observed, if anything
    (``-9``/``137``, ``"SIGTERM"``...); they only tip the balance when the text
    itself says little.
    """
    text = _normalise(log_text or "")
    result, best = _classify_text(text, exit_code, signal)
    if best < _DEWRAP_BELOW:
        # Weak verdict: the log may have been hard-wrapped at a fixed width (pasted
        # from a narrow terminal), splitting the decisive phrase. Re-join and retry.
        unwrapped = _dewrap(text)
        if unwrapped is not None:
            alt, alt_best = _classify_text(unwrapped, exit_code, signal)
            if alt_best > best:
                return alt
    return result


def _classify_text(
    text: str, exit_code: int | None, signal: str | None
) -> tuple[Classification, float]:
    """Classify normalised text; also return the winning score."""
    scanner = _Scanner(text)

    strong: dict[FailureClass, float] = {}
    hints: dict[FailureClass, float] = {}
    top_weight: dict[FailureClass, float] = {}
    hits: dict[FailureClass, list[tuple[float, int]]] = {}

    concrete: set[FailureClass] = set()  # symptom classes with a root-cause hit

    for rule in _RULES:
        lines = scanner.matched_lines(rule)
        if len(lines) < rule.min_count:
            continue
        if rule.requires is not None and not scanner.matched_lines(rule.requires):
            continue
        if rule.cause:
            concrete.add(rule.failure_class)
        repeats = min(len(lines) - rule.min_count + 1, 6)
        contribution = rule.weight * (1.0 + 0.1 * (repeats - 1))
        cls = rule.failure_class
        bucket = hints if rule.hint else strong
        bucket[cls] = bucket.get(cls, 0.0) + contribution
        if not rule.hint:
            top_weight[cls] = max(top_weight.get(cls, 0.0), rule.weight)
        hits.setdefault(cls, []).extend((rule.weight, start) for start in lines)

    exit_hint = _EXIT_CODE_HINTS.get(exit_code) if exit_code is not None else None
    for hint in (exit_hint, _signal_hint(signal)):
        if hint is not None:
            hints[hint[0]] = hints.get(hint[0], 0.0) + hint[1]

    scores: dict[FailureClass, float] = {}
    for cls in set(strong) | set(hints):
        scores[cls] = strong.get(cls, 0.0) + min(hints.get(cls, 0.0), _HINT_CAP)

    # Timeouts and transport errors are what the *other* ranks see when one rank dies
    # of something concrete; let the concrete cause win. A symptom class hit by a
    # ``cause`` rule (NCCL's own shared memory failing on this node) is a cause itself.
    symptoms = _SYMPTOM_CLASSES - concrete
    if any(w >= _DECISIVE for c, w in top_weight.items() if c not in symptoms):
        for cls in symptoms & scores.keys():
            scores[cls] *= _SYMPTOM_FACTOR

    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], _PRIORITY.index(kv[0])))
    score_view = {str(c): round(s, 2) for c, s in ranked}
    if not ranked or ranked[0][1] < _MIN_SCORE:
        return Classification(_FC.UNKNOWN, [], 0.0, None, None, score_view), 0.0

    winner, best = ranked[0]
    runner_up = ranked[1][1] if len(ranked) > 1 else 0.0
    confidence = round((best / (best + runner_up)) * min(1.0, best / 10.0), 3)

    chosen: list[int] = []
    for _, start in sorted(hits.get(winner, []), key=lambda h: (-h[0], h[1])):
        if start not in chosen:
            chosen.append(start)
        if len(chosen) == _MAX_EVIDENCE:
            break
    evidence = [_clip(text[s : _line_bounds(text, s)[1]]) for s in sorted(chosen)]
    rank, node = _suspects(scanner, evidence)
    circumstantial = strong.get(winner, 0.0) == 0.0
    return (
        Classification(winner, evidence, confidence, rank, node, score_view, circumstantial),
        best,
    )


# ---------------------------------------------------------------- root cause across ranks

# When two ranks stop at the same instant, prefer the one with a concrete cause.
_COLLATERAL_LIKE = frozenset({_FC.NCCL_TIMEOUT, _FC.NCCL_ERROR, _FC.UNKNOWN})


def root_cause(reports: Sequence[tuple[int, float, Classification]]) -> RootCause:
    """Pick the root cause among per-rank failures.

    ``reports`` holds ``(rank, ended_at, classification)`` per failed rank. The rank
    that failed first is the root cause; everyone else is collateral (returned in
    the order they failed). Ties on ``ended_at`` go to a rank with a concrete class
    over a timeout / transport error / unknown, then to the lowest rank.
    """
    if not reports:
        raise ValueError("root_cause() needs at least one report")
    ordered = sorted(reports, key=lambda r: (r[1], r[2].failure_class in _COLLATERAL_LIKE, r[0]))
    rank, ended_at, classification = ordered[0]
    return RootCause(rank, ended_at, classification, list(ordered[1:]))
