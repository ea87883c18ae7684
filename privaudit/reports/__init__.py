"""Reports: figures (matplotlib) and rendering (JSON, CSV, Markdown, HTML).

- :func:`write_report` writes a report folder from an experiment's results dict:
  ``results.json``, ``results.csv``, ``accuracy_vs_<param>.png``/``.svg``, ``report.md`` and a
  self-contained ``report.html``;
- :func:`rerender` rebuilds every file of a folder from its ``results.json`` alone;
- :func:`format_console` is what the CLI prints (verdicts, the decision columns; 100 columns),
  :func:`format_table` the full table (every metric and baseline);
- :mod:`privaudit.reports.audit` renders ``audit.json``/``audit.html`` of an audit.

Reports read results dicts only (:mod:`privaudit.results`), never the registry or the
experiment code, and escape every string they take from them.
"""

from privaudit.reports.render import (
    default_out_dir,
    format_console,
    format_table,
    read_results,
    rerender,
    write_json,
    write_report,
)

__all__ = [
    "default_out_dir",
    "format_console",
    "format_table",
    "read_results",
    "rerender",
    "write_json",
    "write_report",
]
