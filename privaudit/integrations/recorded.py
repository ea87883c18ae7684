"""Attacking one recorded transcript: every applicable attack, with or without ground truth.

:func:`audit_transcript` runs every registered attack that reads the transcript's protocol on
the attacker's view and gives one row per attack: its metrics beside the random and the
prior-only baselines, and a verdict by the rules of a sweep (every privacy metric tested against
the attack on the null view, the prior-only and the random guess on a cluster bootstrap over the
victims, Holm-corrected): ``leaks``, ``attack below prior``,
``inconclusive``, ``no evidence of leakage`` (one transcript has no weaker setting to show the
attack's power, so never ``protected``), ``not applicable`` with the reason, naming the active
defense when one hides the uploads, or ``unscored`` when the transcript holds no ``private``
messages. :func:`transcript_point` and :func:`pooled_verdict` give the same verdict pooled over
several recordings of one app (seeds; benchmarks/flower_calibration.py). :func:`reconstruct` runs
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
from privaudit.report_schema import stamped
from privaudit.results import MIN_VICTIMS as RESULTS_MIN_VICTIMS
from privaudit.results import (
    PROTECTION_MARGIN,
    decide_rows,
    declared_specs,
    floats,
    jsonable,
    point_bootstrap,
    privacy_metrics,
    strength_rows,
    verdict_label,
)
from privaudit.schema import validate
from privaudit.transcript import Transcript, load_validated

__all__ = [
    "applicable_attacks",
    "audit_transcript",
    "format_audit",
    "pooled_verdict",
    "reconstruct",
    "transcript_point",
    "write_audit",
]

#: Fewer scored victims than this give no verdict: no bootstrap over so few victims is an interval.
MIN_VICTIMS = RESULTS_MIN_VICTIMS
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


def pooled_verdict(
    cls: type, points: list[dict[str, Any]], defended: bool, margin: float = PROTECTION_MARGIN
) -> dict[str, Any]:
    """The verdict of one attack on one or more recordings of the same app (one point of
    :func:`transcript_point` per recording, each a seed): the recordings are one grid value of a
    sweep (:func:`privaudit.results.strength_rows` + :func:`~privaudit.results.decide_rows`:
    every privacy metric tested against every message-free guess -- the attack on the null view,
    the prior-only guess, the random guess -- on the victim cluster bootstrap of each run, the
    runs pooled with a between-run variance; Holm over those metrics). With no weaker setting to
    show the attack's power, it never reads "protected"."""
    if not points:
        raise PrivauditError(f"{cls.name}: no recorded points to judge")
    specs = declared_specs(cls, list(points[0]["attack_metrics"]))
    names = privacy_metrics(points, specs)
    (row,) = strength_rows([{**p, "value": None} for p in points], names, specs, None, margin)
    primary = getattr(cls, "primary_metric", "accuracy")
    decide_rows([[row]], primary, [[defended]], [False])
    out = {k: row[k] for k in ("verdict", "tests", "leak_metrics", "advantage", "advantage_low", "advantage_high")}
    # shown: the primary metric when it leaks or nothing does (as decide_rows picks it), else the
    # most significant leaking metric
    tests, leaks = row["tests"], row["leak_metrics"]
    if primary in tests and (primary in leaks or not leaks):
        shown = primary
    else:
        shown = (leaks or [next(iter(tests), None)])[0]
    if shown is not None:
        t = tests[shown]
        out.update(tested_metric=shown, advantage=t["advantage"], advantage_low=t["low"], advantage_high=t["high"])
    victims = min(p["attack_metrics"].get("victims", math.inf) for p in points)
    targets = min(p["attack_metrics"].get("targets", math.inf) for p in points)
    if not out["tests"]:
        out["verdict"] = "unscored"
        out["reason"] = f"the ground truth holds nothing {cls.name} scores ({primary} undefined)"
    elif victims < MIN_VICTIMS or targets < MIN_TARGETS:
        out["verdict"] = f"too few victims to judge ({int(min(victims, targets))})"
    return out


def transcript_point(cls: type, transcript: Transcript) -> tuple[dict[str, Any] | None, str]:
    """``(point, "")``: attack ``cls`` evaluated on a transcript with ground truth, as a sweep's
    point (its metrics, the random, prior-only and null-view guesses, the victim bootstrap); or
    ``(None, reason)`` when the attack does not apply to it."""
    attack = cls()
    ok, reason = attack.applicable(transcript.view(attack.party))
    if not ok:
        return None, reason
    outcome = attack.evaluate(transcript, _seed_rng(transcript))
    if not outcome.reconstruction.supported:
        return None, outcome.reconstruction.reason
    metrics = outcome.metrics
    point = {
        "attack_metrics": floats(metrics),
        "baseline_random": floats(outcome.baseline),
        "baseline_prior": floats(outcome.baseline_prior),
        "bootstrap": point_bootstrap(metrics, outcome.victims, outcome.decisions),
    }
    if outcome.baseline_null:  # the attack on the null view: the guess that carries its own prior
        point["baseline_null"] = floats(outcome.baseline_null)
    return point, ""


def audit_transcript(
    transcript: Transcript | str | Path,
    attacks: list[str] | None = None,
    max_bytes: int | None = None,
    margin: float = PROTECTION_MARGIN,
) -> dict[str, Any]:
    """Every applicable attack on one transcript -> ``{"transcript", "defenses", "rows"}``.

    ``margin`` is the protection margin as a fraction of the gap between the stronger baseline
    and a perfect attack (as in sweeps); a row's ``tests`` hold each privacy metric's test."""
    t = _as_transcript(transcript, max_bytes)
    scored = t.has_private
    defenses = t.config.get("defenses", [])
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
            point, reason = transcript_point(cls, t)
            if point is None:
                row.update({"applies": False, "verdict": "not applicable", "reason": reason})
            else:
                row.update(pooled_verdict(cls, [point], bool(defenses), margin))
                row.update(
                    {
                        "metrics": point["attack_metrics"],
                        "baseline_random": point["baseline_random"],
                        "baseline_prior": point["baseline_prior"],
                    }
                )
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    from privaudit.integrations._flower_dp import check_claims
    from privaudit.integrations.flower_canary import canary_check

    return {
        "protocol": t.protocol,
        "app": t.config.get("app"),
        "defenses": defenses,
        # every recorded Flower DP mod or wrapper checked against the mechanism it runs
        "dp_claims": check_claims(defenses if isinstance(defenses, list) else []),
        # the canary client's one-run epsilon lower bound (privaudit record --canaries), or None
        "canaries": canary_check(t),
        "private_included": scored,
        "margin": margin,
        "rows": rows,
    }


def _fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and not math.isnan(x) else "-"


def format_audit(result: dict[str, Any]) -> str:
    """A fixed-width table: attack, metric, value, random, prior, the advantage over the stronger
    baseline with its Holm-corrected bounds, and the verdict (and reason)."""
    head = f"{'attack':<29} {'metric':<9} {'value':>7} {'random':>7} {'prior':>7}  {'advantage [bounds]':<24}  verdict"
    lines = [head]
    for r in result["rows"]:
        metric = r.get("tested_metric", r["metric"])
        value = r.get("metrics", {}).get(metric)
        random = _fmt(r.get("baseline_random", {}).get(metric))
        prior = _fmt(r.get("baseline_prior", {}).get(metric))
        adv = "-"
        if isinstance(r.get("advantage"), float) and not math.isnan(r["advantage"]):
            adv = f"{r['advantage']:+.3f} [{_fmt(r.get('advantage_low'))}, {_fmt(r.get('advantage_high'))}]"
        reason = f": {r['reason']}" if r.get("reason") else ""
        verdict = verdict_label(r) if "tests" in r else r["verdict"]
        row = f"{r['attack']:<29} {metric:<9} {_fmt(value):>7} {random:>7} {prior:>7}  {adv:<24}  {verdict}{reason}"
        lines.append(printable(row))
    return "\n".join(lines)


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
    doc = stamped(result, "audit")  # schema_version and privaudit_version first
    write_text_file(out / "audit.json", json.dumps(jsonable(doc), indent=2, allow_nan=False))
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
        "victims": jsonable(recon.victims),
        "meta": jsonable(recon.meta),
    }
    from privaudit.reports.render import write_text_file

    write_text_file(out / "reconstruction.json", json.dumps(doc, indent=1))
    return out, cls.name
