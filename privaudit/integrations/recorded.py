"""Attacking one recorded transcript: every applicable attack, with or without ground truth.

:func:`audit_transcript` runs every registered attack that reads the transcript's protocol on
the attacker's view and gives one row per attack: its primary metric beside the random and the
prior-only baselines, and a verdict (``leaks``, ``at baseline``, ``attack not adapted``,
``not applicable`` with the reason, naming the active defense when one hides the uploads, or
``unscored`` when the transcript holds no ``private`` messages). :func:`reconstruct` runs
attacks without scoring and writes what they recovered, for transcripts without ground truth.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from privaudit import registry
from privaudit._escape import printable
from privaudit.errors import PrivauditError
from privaudit.params import parse_spec
from privaudit.schema import validate
from privaudit.transcript import Transcript, load_validated

__all__ = ["LEAK_MARGIN", "applicable_attacks", "audit_transcript", "format_audit", "reconstruct", "write_audit"]

#: An attack "leaks" when its primary metric beats the stronger baseline by more than this.
LEAK_MARGIN = 0.02
#: Fewer scored victims than this give no verdict (one client's hit or miss is not a rate).
MIN_VICTIMS = 3
#: Attacks scored per client (``targets``: one decision per client and attribute) need this many.
MIN_TARGETS = 10


def _as_transcript(transcript: Transcript | str | Path, max_bytes: int | None = None) -> Transcript:
    """The transcript, read and checked against its protocol's schema before any attack runs."""
    if isinstance(transcript, Transcript):
        validate(transcript)
        return transcript
    return load_validated(transcript, **({} if max_bytes is None else {"max_bytes": max_bytes}))


def applicable_attacks(transcript: Transcript, names: list[str] | None = None) -> list[type]:
    """Registered attacks that read ``transcript``'s protocol (or those ``names``, checked)."""
    out = []
    for name, cls in registry.available("attack").items():
        targets = tuple(getattr(cls, "protocols", ()) or ())
        if names is not None:
            if name in names:
                out.append(cls)
        elif not targets or transcript.protocol in targets:
            out.append(cls)
    for name in names or []:
        registry.get("attack", name)  # one-line error for an unknown name
    if not out:
        raise PrivauditError(f"no registered attack reads protocol {transcript.protocol!r} transcripts")
    return out


def _seed_rng(transcript: Transcript) -> np.random.Generator:
    return np.random.default_rng([int(transcript.seed or 0), 17])


def _verdict(cls: type, metrics: dict, random: dict, prior: dict) -> tuple[str, float]:
    metric = getattr(cls, "primary_metric", "accuracy")
    spec = getattr(cls, "metric_specs", {}).get(metric)
    higher = True if spec is None else spec.higher_is_better
    value = metrics.get(metric, math.nan)
    bases = [b.get(metric, math.nan) for b in (random, prior)]
    bases = [b for b in bases if isinstance(b, (int, float)) and not math.isnan(b)]
    if not bases or not isinstance(value, (int, float)) or math.isnan(value):
        return "unscored", math.nan
    best = max(bases) if higher else min(bases)
    advantage = (value - best) if higher else (best - value)
    if advantage > LEAK_MARGIN:
        return "leaks", advantage
    if advantage < -LEAK_MARGIN:
        return "attack not adapted", advantage
    return "at baseline", advantage


def audit_transcript(
    transcript: Transcript | str | Path, attacks: list[str] | None = None, max_bytes: int | None = None
) -> dict[str, Any]:
    """Every applicable attack on one transcript -> ``{"transcript", "defenses", "rows"}``."""
    t = _as_transcript(transcript, max_bytes)
    scored = t.has_private
    rows = []
    for cls in applicable_attacks(t, attacks):
        attack = cls()
        t0 = time.perf_counter()
        view = t.view(attack.party)
        ok, reason = attack.applicable(view)
        row: dict[str, Any] = {"attack": cls.name, "metric": getattr(cls, "primary_metric", "accuracy"), "applies": ok}
        if not ok:
            row.update({"verdict": "not applicable", "reason": reason})
        elif not scored:
            recon = attack.run(view, {}, _seed_rng(t))
            row.update(
                {
                    "verdict": "unscored",
                    "reason": "no private messages: nothing to score against",
                    "victims": len(recon.victims),
                }
            )
        else:
            rng = _seed_rng(t)
            knowledge = attack.prior_knowledge(t, rng)
            recon = attack.run(view, knowledge, rng)
            if not recon.supported:
                row.update({"applies": False, "verdict": "not applicable", "reason": recon.reason})
            else:
                metrics = attack.score(recon, t)
                random = attack.baseline(t)
                try:
                    prior = attack.prior_baseline(t, knowledge)
                except NotImplementedError:
                    prior = {}
                verdict, advantage = _verdict(cls, metrics, random, prior)
                victims, targets = metrics.get("victims", math.inf), metrics.get("targets", math.inf)
                if verdict == "unscored":
                    row["reason"] = f"the ground truth holds nothing {cls.name} scores ({row['metric']} undefined)"
                elif victims < MIN_VICTIMS or targets < MIN_TARGETS:
                    verdict = f"too few victims to judge ({int(min(victims, targets))})"
                row.update(
                    {
                        "verdict": verdict,
                        "advantage": advantage,
                        "metrics": metrics,
                        "baseline_random": random,
                        "baseline_prior": prior,
                    }
                )
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    return {
        "protocol": t.protocol,
        "app": t.config.get("app"),
        "defenses": t.config.get("defenses", []),
        "private_included": scored,
        "rows": rows,
    }


def _fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and not math.isnan(x) else "-"


def format_audit(result: dict[str, Any]) -> str:
    """A fixed-width table: attack, metric, value, random, prior, verdict (and reason)."""
    lines = [f"{'attack':<29} {'metric':<9} {'value':>7} {'random':>7} {'prior':>7}  verdict"]
    for r in result["rows"]:
        metric = printable(r["metric"])
        value = r.get("metrics", {}).get(r["metric"])
        random = _fmt(r.get("baseline_random", {}).get(r["metric"]))
        prior = _fmt(r.get("baseline_prior", {}).get(r["metric"]))
        reason = f": {r['reason']}" if r.get("reason") else ""
        row = f"{r['attack']:<29} {metric:<9} {_fmt(value):>7} {random:>7} {prior:>7}  {r['verdict']}{reason}"
        lines.append(printable(row))
    return "\n".join(lines)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(float(x)) else float(x)
    return x


def _folder(out: str | Path) -> Path:
    """The output folder, created; a symbolic link or a non-folder is refused."""
    from privaudit.reports.render import check_folder

    out = Path(out)
    check_folder(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PrivauditError(f"{out}: cannot create the report folder ({exc.strerror or exc})") from None
    return out


def write_audit(result: dict[str, Any], out: str | Path) -> Path:
    """Write ``audit.json`` and ``audit.txt`` (the table) into ``out``."""
    from privaudit.reports.render import write_text_file

    out = _folder(out)
    write_text_file(out / "audit.txt", format_audit(result) + "\n")
    write_text_file(out / "audit.json", json.dumps(_jsonable(result), indent=2))
    return out


def reconstruct(transcript: Transcript | str | Path, attack: str | None, out: str | Path) -> tuple[Path, str]:
    """Run one attack without scoring; write ``reconstruction.json`` into ``out``.

    For transcripts without ``private`` messages. Returns the folder and the attack name.
    """
    t = _as_transcript(transcript)
    name, params = parse_spec(attack, "--attack") if attack else ("", {})
    if not name:
        proto = registry.get("protocol", t.protocol)
        name = getattr(proto, "default_attack", None) or ""
        if not name:
            raise PrivauditError(f"protocol {t.protocol!r} has no default attack; name one with --attack")
    cls = registry.get("attack", name)
    a = cls(**params)
    view = t.view(a.party)
    ok, reason = a.applicable(view)
    recon = a.run(view, {}, _seed_rng(t)) if ok else a.unsupported(reason)
    out = _folder(out)
    doc = {
        "attack": cls.name,
        "party": recon.party,
        "supported": recon.supported,
        "reason": recon.reason,
        "scored": False,
        "note": "the transcript holds no private messages: nothing to score against",
        "victims": _jsonable(recon.victims),
        "meta": _jsonable(recon.meta),
    }
    from privaudit.reports.render import write_text_file

    write_text_file(out / "reconstruction.json", json.dumps(doc, indent=1))
    return out, cls.name
