"""The HTML of the page: the report's tables and plots (drawn here), the index and episode containers,
the data as JSON, and the inline style and script.

Every text that reaches the HTML goes through `esc` (html.escape with quotes); every value for the
script goes through `json_script`, which escapes `<`, `>`, `&`, `'`, U+2028 and U+2029 so that no text
(`</script>` included) can end the element it sits in. A Content-Security-Policy allows only the page's
own script (by its hash), inline style and data: images: no network, no injected script.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from eval.names import legend, summary_names
from eval.report import LEGEND_NOTE, PairOrder
from eval.view.assets import CSS, JS

_JSON_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "'": "\\u0027",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def esc(value: Any) -> str:
    """Text for HTML content or a quoted attribute value."""
    return html.escape(str(value), quote=True)


def safe_json(value: Any) -> str:
    """Compact JSON that cannot close a `<script>` element or break a JavaScript string."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for raw, escaped in _JSON_ESCAPES.items():  # str.replace: several times faster than str.translate here
        text = text.replace(raw, escaped)
    return text


def json_script(element_id: str, value: Any) -> str:
    """A data element the script parses on demand (`type="application/json"` is never executed)."""
    return f'<script type="application/json" id="{esc(element_id)}">{safe_json(value)}</script>\n'


def csp() -> str:
    """Only this page's own script runs (its SHA-256), and nothing is fetched: images are data: URIs."""
    digest = base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()
    return f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"


# --- the report: summary.json's tables and the folder's plots ---------------------------------------------
# summary.json's per-method statistics in this order; keys it gains later follow, named as written.
_METHOD_COLUMNS = {
    "episodes": "episodes",
    "success_rate": "success",
    "success_ci95": "95% CI",
    "mean_score": "mean score",
    "agent_calls": "agent calls",
    "controller_calls": "controller calls",
    "controller_model_calls": "by the controller",
    "recoveries": "recoveries",
    "rollbacks": "rollbacks",
    "env_steps": "env steps",
    "wall_s": "wall s",
}
_PAIRED_COLUMNS = ("a", "b", "episodes", "a_only", "b_only", "both", "neither", "diff", "p_value", "significant")
_NAME_COLUMNS = ("a", "b")  # method keys, shown by their short labels
_NAMED = ' class="named"'  # the headline's and the room's rows
_CI = ' class="ci"'  # an interval, kept on one line


def cell(value: Any, key: str = "") -> str:
    """One table cell (`key`: its summary.json field): numbers right-aligned and rounded, a rate as a
    percentage, the rest as text."""
    if isinstance(value, bool) or value is None:
        return f"<td>{esc('-' if value is None else ('yes' if value else 'no'))}</td>"
    if isinstance(value, int | float):
        return f'<td class="num">{esc(_number(value, key))}</td>'
    if isinstance(value, list):
        return f"<td{_CI if key == 'success_ci95' else ''}>{esc(_interval(value, key))}</td>"
    return f"<td>{esc(value)}</td>"


def _number(value: float, key: str) -> str:
    """A rate as a percentage and a difference in points, as report.md writes them; others to 4 digits."""
    if key == "success_rate":
        return f"{value:.1%}"
    return f"{value * 100:+.1f} pts" if key == "diff" else f"{value:.4g}"


def _interval(values: list[Any], key: str) -> str:
    """A confidence interval as `[lo%, hi%]`; any other list as its items."""
    if key == "success_ci95" and len(values) == 2 and all(isinstance(v, int | float) for v in values):
        return f"[{values[0]:.1%}, {values[1]:.1%}]"
    return " - ".join(str(v) for v in values)


def name_cell(key: Any, labels: dict[str, str]) -> str:
    """A method key's cell: its short label, with the full key on hover where the label is shorter."""
    label = labels.get(str(key), str(key))
    title = f' title="{esc(key)}"' if label != str(key) else ""
    return f'<td class="name"{title}>{esc(label)}</td>'


def methods_table(methods: dict[str, Any], labels: dict[str, str]) -> str:
    stats = {k: v if isinstance(v, dict) else {} for k, v in methods.items()}
    keys = [k for k in _METHOD_COLUMNS if any(k in v for v in stats.values())]
    keys += [k for v in stats.values() for k in v if k not in _METHOD_COLUMNS and k not in keys]
    keys = list(dict.fromkeys(keys))
    head = "".join(f"<th>{esc(_METHOD_COLUMNS.get(k, k.replace('_', ' ')))}</th>" for k in keys)
    rows = [
        "<tr>" + name_cell(m, labels) + "".join(cell(v.get(k), k) for k in keys) + "</tr>" for m, v in stats.items()
    ]
    return f"<table><thead><tr><th>method</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def names_legend(labels: dict[str, str]) -> str:
    """The shortened labels with their full keys, under the methods table (as report.md has them)."""
    items = "".join(f"<li><b>{esc(label)}</b>: {esc(key)}</li>" for label, key in legend(labels))
    return f'<div class="legend names">{esc(LEGEND_NOTE)}<ul>{items}</ul></div>' if items else ""


def paired_table(paired: list[Any], summary: dict[str, Any], labels: dict[str, str]) -> str:
    """The pairs in report.md's order (`PairOrder`: the headline first, then the room), with that order
    said above the table and the headline's and room's rows marked."""
    order = PairOrder.of(summary)
    entries = [p for p in paired if isinstance(p, dict)]
    entries = [_swapped(p) if order.flips(str(p.get("a")), str(p.get("b")), _diff(p)) else p for p in entries]
    entries.sort(key=lambda p: order.key(str(p.get("a")), str(p.get("b")), _diff(p), _p_value(p)))
    head = "<th>role</th>" + "".join(f"<th>{esc(c.replace('_', ' '))}</th>" for c in _PAIRED_COLUMNS)
    rows = []
    for p in entries:
        role = order.role(str(p.get("a")), str(p.get("b")))
        cells = (name_cell(p.get(c), labels) if c in _NAME_COLUMNS else cell(p.get(c), c) for c in _PAIRED_COLUMNS)
        rows.append(f"<tr{_NAMED if role else ''}><td>{esc(role)}</td>{''.join(cells)}</tr>")
    note = f'<p class="note">{esc(order.note(labels, quote=str))}</p>'
    return f"{note}<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _diff(entry: dict[str, Any]) -> float:
    """A pair's difference; 0 where a hand-made or older summary.json lacks it (the page still renders)."""
    value = entry.get("diff")
    return float(value) if isinstance(value, int | float) else 0.0


def _p_value(entry: dict[str, Any]) -> float:
    """A pair's p-value; 1 (no evidence) where the entry lacks it."""
    value = entry.get("p_value")
    return float(value) if isinstance(value, int | float) else 1.0


def _swapped(entry: dict[str, Any]) -> dict[str, Any]:
    """A summary.json pair read the other way round (its p-value and flag do not change)."""
    turned = {**entry, "a": entry.get("b"), "b": entry.get("a"), "a_only": entry.get("b_only"),
              "b_only": entry.get("a_only")}  # fmt: skip
    return turned | ({"diff": -_diff(entry)} if "diff" in entry else {})


def plots(paths: Iterable[Path]) -> str:
    """The folder's PNG plots, embedded (the page must open without its folder)."""
    figures = [
        f'<figure><img alt="{esc(p.name)}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
        f"<figcaption>{esc(p.name)}</figcaption></figure>"
        for p in paths
    ]
    return f'<div class="plots">{"".join(figures)}</div>' if figures else ""


def report_section(summary: dict[str, Any] | None, pngs: list[Path]) -> str:
    """summary.json's methods and paired comparisons, and the plots; empty when the folder has neither."""
    if summary is None and not pngs:
        return ""
    parts = ['<section id="report"><h2>Report</h2>']
    if summary is not None:
        methods, paired, labels = summary.get("methods"), summary.get("paired"), summary_names(summary)
        if isinstance(methods, dict) and methods:
            parts += ["<h3>Methods</h3>", methods_table(methods, labels), names_legend(labels)]
        if isinstance(paired, list) and paired:
            parts += ["<h3>Paired comparisons (exact McNemar)</h3>", paired_table(paired, summary, labels)]
    parts += [plots(pngs), "</section>\n"]
    return "".join(parts)


# --- the page -----------------------------------------------------------------------------------------------
_INDEX = """<section id="index"><h2>Episodes</h2>
<div class="filters">
<label>method <select id="f-method"><option value="">all</option></select></label>
<label>controller <select id="f-controller"><option value="">all</option></select></label>
<label>task <select id="f-task"><option value="">all</option></select></label>
<label>outcome <select id="f-outcome"><option value="">all</option></select></label>
<label>episode id <input id="f-id" type="search" placeholder="contains"></label>
<span class="count" id="count"></span>
</div>
<div class="scroll"><table><thead><tr><th>episode</th><th>method</th><th>task</th><th class="num">variation</th>
<th class="num">seed</th><th>outcome</th><th class="num">score</th><th class="num">steps</th>
<th class="num">rollbacks</th><th>stop reason</th></tr></thead><tbody id="rows"></tbody></table></div>
<p><button id="more" type="button" class="hidden">show more</button></p>
</section>
<div id="episode" class="hidden"></div>
"""


def page(title: str, subtitle: str, report: str, meta: dict[str, Any], episodes: Iterable[str]) -> Iterator[str]:
    """The page in pieces (a 10,000-episode page is tens of megabytes: written as it is made).
    `episodes` are the `json_script` elements of the episodes, `ep-<index>` each."""
    yield (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(csp())}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style></head>\n<body>\n"
        f'<header><h1>{esc(title)}</h1><div class="sub">{esc(subtitle)}</div></header>\n<main>\n'
    )
    yield report
    yield _INDEX
    yield "</main>\n"
    yield json_script("rir-meta", meta)
    yield from episodes
    yield f"<script>{JS}</script>\n</body></html>\n"
