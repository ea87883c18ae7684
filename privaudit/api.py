"""What the Python API returns: :class:`Results` (an experiment's ``results.json``) and
:class:`AuditResults` (an audit's ``audit.json``).

Each is the wire dict itself (a ``dict`` subclass: every documented key indexes as before,
``json.dumps`` and every function taking the dict accept it) with

- typed attributes read through :mod:`privaudit.results.typed` (``results.verdicts[0].sentence``,
  ``results.points[0].attack_metrics``, ``audit.matrix[0].verdict``; any top-level field by name,
  ``results.record`` the whole :class:`~privaudit.results.typed.ExperimentRun`): snapshots, so
  change the dict, not them;
- ``to_dict()`` (the wire dict, written through the typed records: lossless), ``to_json()``
  (the text of the ``results.json`` / ``audit.json`` the CLI writes) and ``read(path)``;
- ``write_report(folder)``: the folder the CLI writes for the same run (``plan.toml`` included
  when the object came from a plan: :attr:`Results.plan_toml`);
- ``_repr_html_``: a notebook shows the verdicts and the decision table (every string escaped).
"""

from __future__ import annotations

import copy
import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privaudit.errors import PrivauditError
from privaudit.results.typed import (
    AuditCell,
    AuditRecord,
    AuditRun,
    ExperimentRun,
    Point,
    Record,
    SummaryEntry,
    Verdict,
)

__all__ = ["AuditResults", "Results", "write_report"]


class _Document(dict):
    """A wire dict with its typed record (the shared half of :class:`Results` and :class:`AuditResults`)."""

    KIND = ""
    RECORD: type[Record] = Record

    def __init__(self, data: Mapping[str, Any] = (), *, plan_toml: str | None = None) -> None:
        super().__init__(data)
        #: the ``plan.toml`` text of the plan that produced these results (None when unknown)
        self.plan_toml = plan_toml

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, plan_toml: str | None = None):
        """A copy of the wire dict ``data`` (a ``results.json`` / ``audit.json`` read as JSON)."""
        if not isinstance(data, Mapping):
            raise PrivauditError(f"{cls.__name__}.from_dict needs a mapping, got {type(data).__name__}")
        return cls(copy.deepcopy(dict(data)), plan_toml=plan_toml)

    @classmethod
    def read(cls, path: str | Path):
        """The file at ``path``, validated against its schema (bounded read, one-line errors)."""
        from privaudit import report_schema

        doc, kind = report_schema.load(path)
        if kind != cls.KIND:
            raise PrivauditError(f"{path}: a {kind}.json, not a {cls.KIND}.json")
        return cls(doc)

    @property
    def record(self) -> Record:
        """The typed record of the whole document (a snapshot of the dict as it is now)."""
        return self.RECORD.from_dict(self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.RECORD.declared():
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.record, name)

    def to_dict(self) -> dict[str, Any]:
        """The wire dict, written through the typed record (a new dict)."""
        return self.record.to_dict()

    def to_json(self) -> str:
        """The JSON text the CLI writes (``schema_version`` and ``privaudit_version`` first,
        NaN as null)."""
        from privaudit.report_schema import stamped
        from privaudit.reports.files import dumps_json

        return dumps_json(stamped(self.to_dict(), self.KIND))


def _refuse_full(out: Path, force: bool) -> None:
    if not force and out.is_dir() and any(out.iterdir()):
        raise PrivauditError(f"{out}: the folder is not empty; pass force=True to replace its report")


def _verdict_html(sentence: Any, detail: Any = None) -> str:
    text = f'<p class="verdict"><b>Verdict.</b> {html.escape(str(sentence or ""))}'
    if isinstance(detail, str) and detail.strip():
        text += f"<br><small>{html.escape(detail)}</small>"
    return text + "</p>"


class Results(_Document):
    """An experiment's results (``results.json``; see the module docstring).

    Attributes
    ----------
    points : list of Point
    verdicts : list of Verdict
    summary : list of SummaryEntry
    reference : list of Point
        The undefended reference runs (empty when there are none).
    record : ExperimentRun
        Every field typed; other top-level fields read by name (``results.protocol``).
    plan_toml : str or None
        The resolved plan (``privaudit attack --config`` reruns it).
    """

    KIND = "results"
    RECORD = ExperimentRun

    @property
    def points(self) -> list[Point]:
        return list(self.record.points or [])

    @property
    def verdicts(self) -> list[Verdict]:
        return list(self.record.verdicts or [])

    @property
    def summary(self) -> list[SummaryEntry]:
        return list(self.record.summary or [])

    @property
    def reference(self) -> list[Point]:
        return list(self.record.reference or [])

    def write_report(self, out_dir: str | Path | None = None, *, force: bool = False) -> Path:
        """Write the folder ``privaudit attack`` writes (``results.json``, ``results.csv``, the
        figures, ``report.md``, ``report.html``, ``plan.toml`` when known); the folder. A folder
        holding files is refused unless ``force``. Default: the CLI's
        ``privaudit-report/<protocol>-<sweep>-<dataset>/``."""
        return write_report(self, out_dir, force=force)

    def _repr_html_(self) -> str:
        from privaudit.reports.markup import html_table
        from privaudit.reports.render import console_rows

        head = (
            f"<p><b>{html.escape(str(self.get('protocol')))}</b>, attack "
            f"<b>{html.escape(str(self.get('attack')))}</b>, sweep {html.escape(str(self.get('sweep') or 'none'))}, "
            f"{len(self.get('points') or [])} points</p>"
        )
        verdicts = "".join(_verdict_html(v.plain or v.sentence, v.detail if v.plain else None) for v in self.verdicts)
        return f'<div class="privaudit-results">{head}{verdicts}{html_table(*console_rows(self), left=1)}</div>'


class AuditResults(_Document):
    """An audit's results (``audit.json``; see the module docstring).

    Attributes
    ----------
    matrix : list of AuditCell
    verdicts : list of AuditVerdict
    runs : list of AuditRun
    record : AuditRecord
        Every field typed; other top-level fields read by name (``audit.attacks``).
    plan_toml : str or None
        The audit's plan (``privaudit audit --config`` reruns it).
    """

    KIND = "audit"
    RECORD = AuditRecord

    @property
    def matrix(self) -> list[AuditCell]:
        return list(self.record.matrix or [])

    @property
    def runs(self) -> list[AuditRun]:
        return list(self.record.runs or [])

    def write_report(self, out_dir: str | Path | None = None, *, force: bool = False) -> Path:
        """Write the folder ``privaudit audit`` writes (``audit.json``, ``audit.html``,
        ``plan.toml`` when known); the folder. A folder holding files is refused unless
        ``force``. Default: ``privaudit-report/<protocol>-audit/``."""
        from privaudit.reports.audit import write_audit_report

        if "rows" in self:
            raise PrivauditError(
                "a transcript audit's folder is written by privaudit.integrations.recorded.write_audit "
                "(privaudit audit --transcript)"
            )
        out = Path(out_dir) if out_dir is not None else default_audit_dir(str(self.get("protocol")))
        _refuse_full(out, force)
        return write_audit_report(self.record, out, plan_toml=self.plan_toml)  # the renderers read any Mapping

    def _repr_html_(self) -> str:
        from privaudit.reports.markup import html_table
        from privaudit.results import fmt, fmt_advantage, fmt_value

        record = self.record
        head = f"<p><b>{html.escape(str(record.protocol))}</b> audit</p>"
        verdicts = "".join(_verdict_html(v.sentence) for v in record.verdicts or [])
        verdicts += "".join(
            _verdict_html(r.verdict and f"{r.attack}: {r.verdict}", r.reason) for r in record.rows or []
        )
        rows = [
            [
                c.attack,
                "no defense" if c.defense is None else f"{c.defense} = {fmt_value(c.value)}",
                fmt_advantage(c.advantage, c.advantage_high, c.advantage_low),
                c.verdict_label or c.verdict,
                "-" if c.defense is None else fmt(c.utility_cost, 4),
            ]
            for c in record.matrix or []
        ]
        table = html_table(["attack", "defense", "advantage [bounds]", "verdict", "utility cost"], rows, left=2)
        return f'<div class="privaudit-audit">{head}{verdicts}{table if rows else ""}</div>'


def default_audit_dir(protocol: str) -> Path:
    """``privaudit audit``'s default report folder of ``protocol``."""
    return Path("privaudit-report") / f"{protocol}-audit"


def write_report(
    results: Mapping[str, Any], out_dir: str | Path | None = None, *, experiment: Any = None, force: bool = False
) -> Path:
    """Write the report folder ``privaudit attack`` writes for ``results`` (a :class:`Results`
    or its dict); ``plan.toml`` from ``experiment`` (its ``plan()``) when given, else from
    :attr:`Results.plan_toml`. The folder (see :func:`privaudit.write_report`)."""
    from privaudit.plan import plan_to_toml
    from privaudit.reports import render

    out = Path(out_dir) if out_dir is not None else render.default_out_dir(results)
    _refuse_full(out, force)
    if experiment is not None:
        plan_toml = plan_to_toml(experiment.plan())
    else:
        plan_toml = getattr(results, "plan_toml", None)
    data = results.record if isinstance(results, Results) else results  # the renderers read any Mapping
    return render.write_report(data, out, plan_toml=plan_toml)
