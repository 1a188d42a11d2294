"""`vime report JOB`: a run's curves as one self-contained HTML file with inline SVG (no
script, no server, nothing downloaded), written into the job folder.

The records are the run's metrics.jsonl files (runtime/rl/metrics.py writes one line per
rollout): the job's own and those of the other jobs in its experiment folder, the run's
resumptions, the latest job winning a rollout both logged. Each panel plots the keys of one
question; a panel whose keys the run never logged says so instead of drawing nothing.

Each <svg> carries its axis ranges (data-x-min, data-x-max, data-y-min, data-y-max) and each
<polyline> its key (data-key), so the picture can be read back into numbers
(tests/test_report.py does).
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from pathlib import Path

from runtime.rl.metrics import read as read_records
from vime.launch.jobdir import JobFolder, is_job_folder

REPORT_FILE = "report.html"

# the plot area inside each SVG, in pixels
WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 32
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]  # exact metric names
    patterns: tuple[str, ...] = ()  # regular expressions over the names (eval keys vary)
    note: str = ""

    def series(self, names: list[str]) -> list[str]:
        chosen = [k for k in self.keys if k in names]
        chosen += sorted(n for n in names if n not in chosen
                         and any(re.fullmatch(p, n) for p in self.patterns))
        return chosen


PANELS = (
    Panel("Reward", ("reward/mean", "reward/acc"),
          note="mean reward and accuracy of each rollout's samples"),
    Panel("Eval", (), (r"eval/.+/(reward|acc|pass@\d+)",),
          note="the eval sets' scores, on the rollouts that ran them"),
    Panel("Response length (tokens)", ("response_len/mean", "response_len/max"),
          (r"eval/.+/response_len",)),
    Panel("Log-prob gap, rollout vs training", ("rollout/logprob_abs_diff",
                                                "train/rollout_logprob_abs_diff",
                                                "rollout/logprob_abs_diff_max"),
          note="mean |log p(engine) - log p(actor)| of the sampled tokens"),
    Panel("Route match (routing replay)", ("train/replayed_route_match",),
          note="fraction of the actor's expert choices equal to the engine's"),
    Panel("Time per phase (s)", ("time/rollout",), (r"time/.+",)),
)


def run_folders(job: JobFolder) -> list[Path]:
    """The job's folder and the other job folders of its experiment folder with metrics."""
    siblings = [p for p in job.path.parent.iterdir()
                if p != job.path and is_job_folder(p) and (p / "metrics.jsonl").is_file()]
    return [job.path, *siblings]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    span = high - low
    step = 10 ** math.floor(math.log10(span / count))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= count:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:.3g}" if value != 0 else "0"


def _range(values: list[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if high == low:
        pad = abs(high) * 0.1 or 1.0
        return low - pad, high + pad
    pad = (high - low) * 0.05
    return low - pad, high + pad


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def svg(records: list[dict], keys: list[str]) -> str:
    """An SVG line chart of keys over the rollouts (each key logged by at least one record);
    records lacking a key are skipped."""
    points = {k: [(r["rollout"], r[k]) for r in records if _number(r.get(k))] for k in keys}
    xs = [x for series in points.values() for x, _ in series]
    ys = [y for series in points.values() for _, y in series]
    x0, x1 = (min(xs), max(xs)) if min(xs) != max(xs) else (min(xs) - 1, max(xs) + 1)
    y0, y1 = _range(ys)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + (y1 - y) / (y1 - y0) * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" data-x-min="{x0!r}" data-x-max="{x1!r}" '
             f'data-y-min="{y0!r}" data-y-max="{y1!r}" data-left="{LEFT}" data-top="{TOP}" '
             f'data-plot-width="{plot_w}" data-plot-height="{plot_h}">',
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" '
             'stroke="#999"/>']
    for tick in _ticks(y0, y1):
        y = py(tick)
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.2f}" y2="{y:.2f}" '
                     'stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.2f}" text-anchor="end">'
                     f'{_label(tick)}</text>')
    for tick in _ticks(x0, x1):
        if float(tick).is_integer():
            x = px(tick)
            parts.append(f'<text x="{x:.2f}" y="{HEIGHT - 12}" text-anchor="middle">'
                         f'{int(tick)}</text>')
    parts.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 1}" '
                 'text-anchor="middle">rollout</text>')
    for index, key in enumerate(keys):
        color = COLORS[index % len(COLORS)]
        coords = " ".join(f"{px(x):.2f},{py(y):.2f}" for x, y in points[key])
        parts.append(f'<polyline data-key="{html.escape(key)}" points="{coords}" fill="none" '
                     f'stroke="{color}" stroke-width="1.5"/>')
        if len(points[key]) == 1:  # a single point draws no line
            x, y = points[key][0]
            parts.append(f'<circle cx="{px(x):.2f}" cy="{py(y):.2f}" r="3" fill="{color}"/>')
    parts.append("</svg>")
    return "\n".join(parts)


def _legend(records: list[dict], keys: list[str]) -> str:
    items = []
    for index, key in enumerate(keys):
        last = next((r[key] for r in reversed(records) if _number(r.get(key))), None)
        items.append(f'<li><span style="color:{COLORS[index % len(COLORS)]}">&#9632;</span> '
                     f'{html.escape(key)}: last {_label(last) if last is not None else "-"}</li>')
    return f'<ul class="legend">{"".join(items)}</ul>'


def render(records: list[dict], title: str, source: str) -> str:
    """The report page for these records."""
    names = sorted({k for r in records for k in r})
    jobs = sorted({str(r.get("job", "")) for r in records} - {""})
    rollouts = [r["rollout"] for r in records]
    head = (f"{len(records)} rollouts ({min(rollouts)} to {max(rollouts)})" if records
            else "no rollouts logged yet")
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p>{head}; jobs: {html.escape(', '.join(jobs) or '-')}; from "
            f"{html.escape(source)}</p>"]
    for panel in PANELS:
        keys = [k for k in panel.series(names) if any(_number(r.get(k)) for r in records)]
        body.append(f'<section data-panel="{html.escape(panel.title)}">'
                    f"<h2>{html.escape(panel.title)}</h2>")
        if panel.note:
            body.append(f'<p class="note">{html.escape(panel.note)}</p>')
        if keys:
            body.append(svg(records, keys))
            body.append(_legend(records, keys))
        else:
            wanted = ", ".join([*panel.keys, *panel.patterns])
            body.append(f'<p class="empty">not logged by this run ({html.escape(wanted)})</p>')
        body.append("</section>")
    style = ("body{font:14px sans-serif;margin:24px;max-width:700px}"
             "svg text{font:11px sans-serif;fill:#333}.note,.empty{color:#666}"
             ".legend{list-style:none;padding:0;columns:2}")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/>"
            f"<title>{html.escape(title)}</title><style>{style}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write(job: JobFolder, output: Path | None = None) -> tuple[Path, int]:
    """Write the report of the job's run; returns (its path, how many rollouts it shows)."""
    records = read_records(run_folders(job))
    title = f"{job.path.parent.name}: {job.path.name}"
    target = output or job.path / REPORT_FILE
    target.write_text(render(records, title, str(job.path.parent)), encoding="utf-8")
    return target, len(records)
