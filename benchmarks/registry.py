"""The registry of named benchmarks and the rows they return.

Adding a benchmark: write ``def my_bench(ctx: BenchContext) -> list[Row]`` in a module of this
package, decorate it with ``@register("name", "what it measures")``, and add the module to
``MODULES``. It gets a :class:`benchmarks.harness.BenchContext` (private Redis, fresh databases,
worker/sweeper spawning with guaranteed cleanup, temp folders) and returns :class:`Row` objects;
``python -m benchmarks --only name`` runs it, the table and ``results.json`` show its rows.

Planned (see ``PLANNED``): the dispatcher's transaction time against the number of jobs (``scale``
measures it against the backlog size; ``locks`` what a small bound costs a run).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .harness import BenchContext

MODULES = (
    "benchmarks.goals",  # first: the goal rows of issue 9 lead the table and results.json
    "benchmarks.shapes",
    "benchmarks.throughput",
    "benchmarks.store_ops",
    "benchmarks.recovery",
    "benchmarks.submission",
    "benchmarks.locks",
    "benchmarks.analysis",
    "benchmarks.scale",
    "benchmarks.priority",
    "benchmarks.million",
    "benchmarks.cycle",
    "benchmarks.exif_lane",  # issue 40: the exif lane against exiftool alone
)

FIRST = ("goals", "shapes")  # run (and listed) first, whatever the import order

PLANNED: dict[str, str] = {
    "dispatcher": "dispatcher cost vs the number of jobs (``scale`` covers the backlog size)",
}


@dataclass
class Row:
    """One figure of a benchmark: what was measured, its value, and the goal it is held against."""

    benchmark: str
    case: str
    figure: str
    value: float | int | str | None
    unit: str = ""
    goal: str = ""
    verdict: str = ""  # "met", "missed", "skipped", "error" or ""
    note: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    baseline: str = ""  # the baseline measured in the same run, with its unit (goal rows)
    ratio: float | None = None  # value / baseline (goal rows)
    load: str = ""  # load average and CPU of other processes during the measurement

    def as_dict(self) -> dict[str, Any]:
        """The row as plain JSON-able data."""
        return asdict(self)


BenchFn = Callable[["BenchContext"], list[Row]]


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark: ``fn(ctx)`` runs it and returns its rows."""

    name: str
    title: str
    fn: BenchFn
    default: bool = True  # run when ``--only`` is not given


REGISTRY: dict[str, Benchmark] = {}


def register(name: str, title: str, *, default: bool = True) -> Callable[[BenchFn], BenchFn]:
    """Decorator: add ``fn`` to the registry under ``name``."""

    def add(fn: BenchFn) -> BenchFn:
        if name in REGISTRY:
            raise ValueError(f"benchmark {name!r} is registered twice")
        REGISTRY[name] = Benchmark(name, title, fn, default)
        return fn

    return add


def load_all() -> dict[str, Benchmark]:
    """Import every benchmark module (registering its benchmarks) and return the registry."""
    for module in MODULES:
        importlib.import_module(module)
    first = [n for n in FIRST if n in REGISTRY]
    ordered = {n: REGISTRY[n] for n in first} | {n: b for n, b in REGISTRY.items() if n not in first}
    REGISTRY.clear()
    REGISTRY.update(ordered)
    return REGISTRY
