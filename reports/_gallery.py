"""Sample grids in the reports: a gallery of the front trials (and the worst complete one, for
contrast) in index.html, and each point's grid on hover or click in pareto_front.html. The grids
are the PNGs the driver keeps beside the study (WORKDIR/samples/STUDY/N/CONCEPT.png); every
image is inlined, so the pages stay offline."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd


def trial_grids(samples: Path | None, number: int) -> dict[str, str]:
    """Concept -> data URI of trial `number`'s grid (empty when it drew none)."""
    folder = samples / str(number) if samples is not None else None
    if folder is None or not folder.is_dir():
        return {}
    return {p.stem: "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode()
            for p in sorted(folder.glob("*.png"))}


def gallery_rows(rep: Any, samples: Path | None) -> list[tuple[str, pd.Series, dict[str, str]]]:
    """(label, trial row, grids): the front by memory, then the worst complete trial."""
    out = []
    for _, row in rep.front.sort_values("peak_mem_mb").iterrows():
        out.append(("Pareto front", row, trial_grids(samples, int(row["trial"]))))
    usable = rep.usable
    if len(usable) > len(rep.front):
        worst = usable.loc[usable["val_loss"].idxmax()]
        out.append(("worst complete trial", worst, trial_grids(samples, int(worst["trial"]))))
    return [r for r in out if r[2]]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def gallery_html(rep: Any, samples: Path | None) -> str:
    rows = gallery_rows(rep, samples)
    if not rows:
        return ""
    esc = html.escape
    parts = ["<h2>Samples</h2><p class='muted'>What each trial draws: per concept a row per prompt, a "
             "column per seed, the same prompts, seeds and scheduler for every trial.</p>",
             "<div class='gallery'>"]
    for label, row, grids in rows:
        facts = [f"val_loss {_fmt(row['val_loss'])}", f"peak_mem_mb {_fmt(row['peak_mem_mb'])}"]
        if "fidelity" in row.index:
            facts.append(f"fidelity {_fmt(row['fidelity'])}")
        shown, missing = (str(row.get("concepts_shown") or ""), str(row.get("concepts_not_shown") or ""))
        if missing and missing != "nan":  # samples that do not show their concept, said so
            facts.append(f"its samples do not show {missing}" + (f" (they show {shown})" if shown and shown != "nan" else ""))
        elif shown and shown != "nan":
            facts.append("its samples show every concept")
        health = str(row["health"]) if "health" in row.index else ""
        if health and health != "nan":
            facts.append(f"health {health}")
        params = ", ".join(f"{p}={_fmt(row[p])}" for p in rep.params if p in row)
        imgs = "".join(f"<figure><img class='grid' alt='{esc(c)}' src='{uri}'><figcaption class='muted'>"
                       f"{esc(c)}</figcaption></figure>" for c, uri in grids.items())
        parts.append(f"<div class='trial' id='samples-{int(row['trial'])}'><h3>trial {int(row['trial'])} "
                     f"<span class='muted'>({esc(label)})</span></h3><p>{esc('; '.join(facts))}</p>"
                     f"<p class='muted'>{esc(params)}</p><div class='cards'>{imgs}</div></div>")
    parts.append("</div>")
    return "".join(parts)


GALLERY_CSS = (".gallery .trial{border-top:1px solid #eee;padding:.4rem 0}"
               "img.grid{image-rendering:pixelated;width:12rem}")


def hover_script(rep: Any, samples: Path | None) -> str:
    """plotly `post_script` for pareto_front.html: hovering or clicking a point shows its grids
    under the plot."""
    grids = {int(t): g for t in rep.usable["trial"] if (g := trial_grids(samples, int(t)))}
    if not grids:
        return ""
    return """
var grids = %s;
var gd = document.getElementById('{plot_id}');
var box = document.createElement('div');
box.id = 'csweep-samples';
box.style.cssText = 'font-family:sans-serif;margin:8px';
box.textContent = 'Hover over or click a point to see what that trial draws.';
gd.parentNode.appendChild(box);
function show(ev) {
  var p = ev.points[0];
  var m = /trial (\\d+)/.exec(p.hovertext || p.text || '');
  if (!m || !grids[m[1]]) { return; }
  box.innerHTML = '';
  var h = document.createElement('div');
  h.textContent = 'trial ' + m[1];
  box.appendChild(h);
  Object.keys(grids[m[1]]).forEach(function (c) {
    var fig = document.createElement('figure');
    fig.style.cssText = 'display:inline-block;margin:4px';
    var img = document.createElement('img');
    img.src = grids[m[1]][c];
    img.alt = c;
    img.style.cssText = 'width:192px;image-rendering:pixelated';
    var cap = document.createElement('figcaption');
    cap.textContent = c;
    fig.appendChild(img); fig.appendChild(cap); box.appendChild(fig);
  });
}
gd.on('plotly_hover', show);
gd.on('plotly_click', show);
""" % json.dumps({str(k): v for k, v in grids.items()})
