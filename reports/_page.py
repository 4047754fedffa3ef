"""index.html: one self-contained, offline page (images inline, plotly.js inline, no CDN)."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._gallery import GALLERY_CSS
from ._tables import html_table

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1150px;
color:#222;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.muted{color:#666} .cards{display:flex;gap:1rem;flex-wrap:wrap}
.card{border:1px solid #ddd;border-radius:6px;padding:.6rem 1rem;min-width:8rem}
.card b{display:block;font-size:1.3rem}
table.csweep-table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
table.csweep-table th,table.csweep-table td{border-bottom:1px solid #e5e5e5;padding:.25rem .6rem;text-align:right}
table.csweep-table th{background:#f5f5f5} .scroll{overflow-x:auto;max-height:28rem}
img{max-width:100%;border:1px solid #eee} figure{margin:1rem 0} li{margin:.3rem 0}
"""


def _img(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption class='muted'>{html.escape(caption)}</figcaption></figure>")


def render_page(rep: Any, *, images: Mapping[str, Path], figure: Any, tracking_uri: str | None,
                experiment_id: str | None, gallery: str = "") -> str:
    s = rep.summary
    esc = html.escape
    counts = "".join(f"<div class='card'>{esc(k)}<b>{v}</b></div>" for k, v in sorted(s["counts_by_state"].items()))
    health = ", ".join(f"{esc(k)}: {v}" for k, v in sorted(s.get("counts_by_health", {}).items()))
    hv = f"{s['hypervolume']:.6g}" if s["reference_point"] else "n/a"
    ref = ", ".join(f"{v:.6g}" for v in s["reference_point"]) if s["reference_point"] else "n/a"
    couplings = "".join(f"<li>{esc(c.sentence())}</li>" for c in rep.couplings) or (
        "<li>Not enough completed trials with numeric parameters for a coupling analysis yet.</li>")
    laws = "".join(f"<li>{esc(f.sentence())}</li>" for f in rep.laws) or "<li>The space declares no laws.</li>"
    stab = getattr(rep, "stability", None)
    conclusions = _conclusions(rep, stab, esc)
    from ._analysis import coupling_frame
    from ._laws import scaling_frame
    from ._stability import MOVED_ABOVE, stability_frame

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>csweep report: {esc(rep.name)}</title><style>{CSS}{GALLERY_CSS}</style></head><body>",
        f"<h1>{esc(rep.name)}</h1><p class='muted'>csweep report — objectives: {esc(rep.objectives.words())}"
        f"{'; memory budget ' + str(s['max_mem_mb']) + ' MB' if s['max_mem_mb'] else ''}.</p>",
        f"<div class='cards'><div class='card'>trials<b>{s['n_trials']}</b></div>{counts}"
        f"<div class='card'>Pareto front<b>{s['pareto_size']}</b></div>"
        f"<div class='card'>hypervolume<b>{hv}</b></div></div>",
        _compute_cards(s),
        "<h2>Conclusions</h2>",
        f"<ul class='conclusions'>{conclusions}</ul>" if conclusions else
        f"<p class='no-verdict'>{esc(s.get('no_verdict_reason') or 'Not enough usable trials for a coupling verdict yet.')}</p>",
        f"<p class='early-stop-note'>{esc(s['early_stop_note'])}</p>" if s.get("early_stop_note") else "",
        f"<p class='muted'>Hypervolume reference point ({esc(s['reference_point_rule'])}): [{ref}].</p>",
        f"<p>Training health: {health}.</p>" if health else "",
        "<h2>Seed noise</h2>", "".join(f"<p>{esc(x)}</p>" for x in rep.sentences),
        "<h2>Pareto front</h2>",
        _img(images["Pareto front"], "Pareto front") if "Pareto front" in images else "",
        "<h3>Interactive</h3>",
        figure.to_html(full_html=False, include_plotlyjs=True),
        "<h3>Front table</h3><div class='scroll'>",
        html_table(rep.front, tracking_uri=tracking_uri, experiment_id=experiment_id), "</div>",
        gallery,
        "<h2>Coupling</h2><p class='muted'>Share of val_loss variance due to each pair's interaction "
        "(second-order functional ANOVA term of a fully Bayesian Gaussian-process surrogate of the usable trials that "
        "converged, over the whole search space; categorical knobs one-hot; 95% posterior interval, the surrogate's "
        "hyperparameters drawn too), strongest first. Coupled: the interval starts above 5%; no sign: it ends below. For a categorical knob "
        "against a numeric one, the numeric knob's best value per level.</p>",
        f"<p class='left-out'>{esc(rep.fit_note)}</p>" if rep.fit_note else "",
        f"<ul>{couplings}</ul>",
        f"<div class='scroll'>{html_table(coupling_frame(rep.couplings))}</div>" if rep.couplings else "",
        "<h2>Where training breaks</h2><p class='muted'>Every run that ran, converged or not (each seed a run), "
        "read by a Bayesian logistic model of P(a run does not converge) on the knobs. Per pair: does one knob move the "
        "range of the other where runs train stably? Coupled: across its own range it moves the other's ceiling (or "
        f"floor) by more than {MOVED_ABOVE:.0%} of that knob's range, both ways, with 95% posterior probability; "
        "no sign: by less. <code>ratio</code>: the ceiling of <code>param</code> at <code>by</code>'s high end over "
        "its low end.</p>",
        f"<p class='stability-reason'>{esc(stab.reason)}</p>" if stab is not None and stab.reason else "",
        _stability_list(stab, esc),
        f"<div class='scroll'>{html_table(stability_frame(stab).drop(columns=['advice']))}</div>"
        if stab is not None and stab.boundaries else "",
        "<h2>Fitted laws</h2>", f"<ul>{laws}</ul>",
        f"<div class='scroll'>{html_table(scaling_frame(rep.laws))}</div>" if rep.laws else "",
    ]
    for caption, path in images.items():
        if caption != "Pareto front":
            parts.append(_img(path, caption))
    if getattr(rep, "figure_notes", None):
        parts.append("<p class='muted figure-notes'>" + "<br>".join(esc(n) for n in rep.figure_notes) + "</p>")
    parts += [
        "<h2>All trials</h2><div class='scroll'>",
        html_table(rep.trials, tracking_uri=tracking_uri, experiment_id=experiment_id),
        "</div></body></html>",
    ]
    return "\n".join(parts)


def _conclusions(rep: Any, stab: Any, esc: Any) -> str:
    """The Conclusions' items: what a user may do, the decided verdicts first (where runs break,
    the front's reruns, the coupled pairs, the stated laws), then what the trials cannot decide
    yet, and per pair why to choose the knobs together."""
    s = rep.summary
    # what a user may do: the decided verdicts first, then what the trials cannot decide yet
    decided = [c for c in rep.couplings if c.decided]
    undecided = [c for c in rep.couplings if not c.decided]
    # per pair: together because of the boundary (where runs break), of the loss, both, or neither
    moved = [b for b in (stab.boundaries if stab else []) if b.verdict_key == "coupled" and b.side != "levels"]
    shown_moved: set[frozenset[str]] = set()
    conclusions = ""
    for b in moved:
        key = frozenset((b.param, b.by))
        if key not in shown_moved:
            shown_moved.add(key)
            conclusions += f"<li class='boundary'><b>Because of where runs break:</b> {esc(b.advice())}</li>"
    if s.get("reruns"):  # csweep rerun-front: did the front hold under fresh seeds
        from ._tables import rerun_sentence

        conclusions += f"<li class='rerun'>{esc(rerun_sentence(s['reruns'], s['front_under_fresh_seeds']))}</li>"
    conclusions += "".join(f"<li class='decided'>{esc(c.advice())}</li>" for c in decided)
    conclusions += "".join(f"<li class='law'>{esc(f.sentence())}</li>" for f in rep.laws if f.stated)
    conclusions += "".join(f"<li class='undecided'>{esc(c.advice())}</li>" for c in undecided)
    pairs = getattr(rep, "pairs", None) or []
    because = "".join(
        f"<tr><td>{esc(p['param_a'])} × {esc(p['param_b'])}</td><td>{esc(p['loss'] or 'no fit')}</td>"
        f"<td>{esc(p['boundary'] or 'no fit')}</td><td><b>{esc(_BECAUSE[p['because']])}</b></td></tr>" for p in pairs)
    if because:
        conclusions += ("<li class='pairs'>Per pair, why to choose the knobs together:<table class='csweep-table'>"
                        "<tr><th>pair</th><th>loss (runs that converged)</th><th>boundary (where runs break)</th>"
                        f"<th>choose</th></tr>{because}</table></li>")
    return conclusions


_BECAUSE = {"loss and boundary": "together: loss and boundary", "boundary": "together: the boundary",
            "loss": "together: the loss", "neither": "one at a time", "undecided": "not decided yet"}


def _stability_list(stab: Any, esc: Any) -> str:
    """One line per unordered pair: the ordered pair whose boundary moves most, its advice."""
    if stab is None or not stab.boundaries:
        return ""
    seen: set[frozenset[str]] = set()
    items = []
    for b in stab.boundaries:
        key = frozenset((b.param, b.by))
        if key in seen or (b.side == "levels" and any(o.param == b.by and o.by == b.param for o in stab.boundaries)):
            continue
        seen.add(key)
        items.append(f"<li>{esc(b.param)} by {esc(b.by)}: {esc(b.verdict())}. {esc(b.advice())}</li>")
    return f"<ul class='stability'>{''.join(items)}</ul>"


def _compute_cards(s: Mapping[str, Any]) -> str:
    """Compute spent (steps, trial-seconds) and what early stops saved, when trials recorded steps."""
    c = s.get("compute")
    if not c:
        return ""
    esc = html.escape
    cards = (f"<div class='cards compute'><div class='card'>steps trained<b>{c['steps_trained']}</b></div>"
             f"<div class='card'>trial-seconds<b>{c['trial_seconds']:.0f}</b></div>"
             f"<div class='card'>steps saved by early stops<b>{c['steps_saved_by_early_stop']}</b></div></div>")
    return cards + (f"<p class='compute'>{esc(s['compute_line'])}</p>" if s.get("compute_line") else "")
