"""The README's Prometheus alert rules, and a small evaluator of their instant expressions over one
scrape (no promtool here): ``max by (lane) (METRIC) OP N``, ``max(METRIC{k="v"}) OP N`` and
``A and on (lane) B``. Rules over ``rate``/``increase``/``histogram_quantile`` need a range of
scrapes and are not evaluated."""

from __future__ import annotations

import operator
import re
from pathlib import Path
from typing import Any

from tests.metrics_support import Sample

README = Path(__file__).resolve().parents[1] / "README.md"
OPS = {
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
}
_CMP = re.compile(
    r"^max(?: by \((?P<by>[a-z_, ]+)\))? ?\((?P<metric>[a-z_]+)(?:\{(?P<sel>[^}]*)\})?\) "
    r"(?P<op>[<>=!]=?|==) (?P<n>[0-9.]+)$"
)


def readme_rules() -> list[dict[str, Any]]:
    """The alert rules (``alert``, ``expr``) of the README's ``yaml`` block that holds ``groups:``."""
    for block in re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S):
        if block.startswith("groups:"):
            found = re.findall(r"- alert: (\S+).*?\n\s+expr: (.+)", block)
            return [{"alert": name, "expr": expr.strip()} for name, expr in found]
    raise AssertionError("the README has no alert rules")


def instant(expr: str) -> bool:
    return not any(f in expr for f in ("rate(", "increase(", "histogram_quantile("))


def _compare(expr: str, scrape: dict[Sample, float]) -> dict[tuple[str, ...], float]:
    m = _CMP.match(expr.strip())
    if m is None:
        raise ValueError(f"not an expression this evaluator reads: {expr!r}")
    by = [b.strip() for b in (m["by"] or "").split(",") if b.strip()]
    want = dict(re.findall(r'([a-z_]+)="([^"]*)"', m["sel"] or ""))
    groups: dict[tuple[str, ...], float] = {}
    for (name, labels), value in scrape.items():
        lab = dict(labels)
        if name != m["metric"] or any(lab.get(k) != v for k, v in want.items()):
            continue
        key = tuple(lab.get(b, "") for b in by)
        groups[key] = max(groups.get(key, value), value)
    return {k: v for k, v in groups.items() if OPS[m["op"]](v, float(m["n"]))}


def evaluate(expr: str, scrape: dict[Sample, float]) -> set[tuple[str, ...]]:
    """The label values (of the ``by``/``on`` labels) for which the instant expression fires."""
    parts = re.split(r" and on \([a-z_]+\) ", expr.strip())
    firing = set(_compare(parts[0], scrape))
    for part in parts[1:]:
        firing &= set(_compare(part, scrape))
    return firing
