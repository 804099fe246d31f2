"""The report of a pulse: report.json, a self-contained report.html, PNG plots, a table.

`write_report(report, out_dir)` writes report.json, overview.png (four panels on one
time axis), rate.png, status.png, latency.png, replicas.png (and, for LLM streams,
streams.png: TTFT and tokens/s, surge.loadtest.llm_report) and report.html, which
embeds the PNGs (base64), so the one file can be mailed or attached to an incident.
`summary_table` renders the post-mortem table as text; `compare_table` and
`write_compare` put two or more runs side by side.

Plots use matplotlib's object API (no pyplot, no global state) and the Agg renderer.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from surge.loadtest import llm_report

__all__ = ["PLOTS", "compare_table", "load_report", "summary_table", "write_compare",
           "write_report"]

PLOTS = ("overview", "rate", "status", "latency", "replicas")
_COLORS = {"offered": "#7f7f7f", "ok": "#2ca02c", "errors": "#d62728", "503": "#ff7f0e",
           "timeout": "#9467bd", "connection": "#8c564b", "p50": "#1f77b4", "p90": "#17becf",
           "p99": "#d62728", "replicas": "#1f77b4", "target": "#ff7f0e", "cpu": "#9467bd"}
_OTHER_COLORS = ("#e377c2", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78")


def load_report(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or "summary" not in data or "series" not in data:
        raise ValueError(f"{path} is not a surge pulse report.json")
    return data


# -- text ---------------------------------------------------------------------------------


def _int(value: Any) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _pct(part: float, whole: float) -> str:
    return "-" if not whole else f"{100 * part / whole:.2f}%"


def _ms(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms" if value < 1000 \
        else f"{value / 1000:.2f} s"


def _phase_column(phase: dict[str, Any] | None) -> dict[str, str]:
    """One column of the summary table: a phase, or the whole run's summary (same keys)."""
    if not phase:
        return {}
    errors = phase["errors"]
    sent = phase["sent"]
    other = sum(n for kind, n in errors.items() if kind not in ("503", "timeout", "connection"))
    return {"sent": _int(sent), "ok": _pct(phase["ok"], sent),
            "503": _pct(errors.get("503", 0), sent), "timeout": _int(errors.get("timeout", 0)),
            "connection": _int(errors.get("connection", 0)), "other": _int(other),
            "p50": _ms(phase["p50_ms"]), "p90": _ms(phase["p90_ms"]),
            "p99": _ms(phase["p99_ms"]), "p999": _ms(phase["p999_ms"]),
            "refused_p99": _ms(phase.get("refused_p99_ms"))}


_ROWS = (("sent", "requests sent"), ("ok", "ok (2xx)"), ("503", "503 (overload)"),
         ("timeout", "timeouts"), ("connection", "connection errors"),
         ("other", "other errors"), ("p50", "p50 (2xx)"), ("p90", "p90"), ("p99", "p99"),
         ("p999", "p99.9"), ("refused_p99", "p99 of 503/429"))


def _recovery_text(summary: dict[str, Any]) -> str:
    if summary.get("pulse") is None:
        return "no pulse in the schedule"
    if summary["recovery_s"] is None:
        return f"never during the pulse ({summary['over_slo_s']:.1f} s over the SLO)"
    if summary["recovery_s"] == 0 and summary["over_slo_s"] == 0:
        return "never above it"
    return (f"{summary['recovery_s']:.1f} s after the pulse began "
            f"({summary['over_slo_s']:.1f} s over the SLO)")


def _replicas_text(summary: dict[str, Any]) -> str:
    if summary.get("max_replicas") is None:
        return "not sampled (not a surge instance)"
    text = f"{summary['start_replicas']} -> max {summary['max_replicas']}"
    if summary["replicas_added_after_s"] is not None:
        text += (f" (first added {summary['replicas_added_after_s']:.1f} s after the pulse "
                 f"began, max at {summary['max_replicas_after_s']:.1f} s)")
    return text


def _node_text(summary: dict[str, Any]) -> str:
    if summary.get("node_cpu_peak_pct") is None:
        return "not sampled (the controller did not report it)"
    text = f"peak {summary['node_cpu_peak_pct']:.0f}% of all cores"
    if summary["machine_limited"]:
        text += (f"; saturated for {summary['node_saturated_s']:.1f} s while requests were "
                 "refused or slow: the machine was the limit, not the replica count")
    return text


def _generator_text(summary: dict[str, Any]) -> str:
    g = summary["generator"]
    state = (f"BEHIND schedule for {g['behind_s']:.1f} s (worst {g['lag_max_ms']:.0f} ms)"
             if g["behind"] else "on schedule")
    text = f"{state}; send lag p50 {_ms(g['lag_p50_ms'])}, p99 {_ms(g['lag_p99_ms'])}"
    if g["waited_for_connection"]:
        text += f"; {g['waited_for_connection']:,} requests waited for a connection"
    return text


def _facts(report: dict[str, Any]) -> list[tuple[str, str]]:
    s = report["summary"]
    return [
        ("peak offered / served", f"{s['peak_offered_rps']:,.0f} / "
                                  f"{s['peak_served_rps']:,.0f} req/s (per 100 ms)"),
        (f"p99 back under SLO ({s['slo_ms']:g} ms)", _recovery_text(s)),
        ("replicas", _replicas_text(s)),
        ("node CPU", _node_text(s)),
        ("unanswered", f"{s['unanswered']:,}"),
        ("generator", _generator_text(s)),
        *llm_report.facts(s),
    ]


def _title(report: dict[str, Any]) -> str:
    run = report["run"]
    rates = sorted({step["from_rps"] for step in run["schedule"]}
                   | {step["to_rps"] for step in run["schedule"]})
    return (f"{run['method']} {run['url']}  {run['arrivals']} arrivals, "
            f"{rates[0]:,.0f} -> {rates[-1]:,.0f} req/s, {run['schedule_duration_s']:g} s, "
            f"{run['workers']} worker{'s' if run['workers'] > 1 else ''}")


def summary_table(report: dict[str, Any]) -> str:
    """The post-mortem table, as aligned plain text."""
    s = report["summary"]
    columns = [("baseline", _phase_column(s["baseline"])), ("pulse", _phase_column(s["pulse"])),
               ("whole run", _phase_column(s))]
    columns = [(name, column) for name, column in columns if column]
    width = max(len(label) for _, label in _ROWS) + 2
    lines = [_title(report), "",
             " " * width + "".join(f"{name:>14}" for name, _ in columns)]
    for key, label in _ROWS:
        lines.append(f"{label:<{width}}" + "".join(f"{col[key]:>14}" for _, col in columns))
    lines.append("")
    facts = _facts(report)
    fact_width = max(len(label) for label, _ in facts) + 2
    lines += [f"{label:<{fact_width}}{value}" for label, value in facts]
    return "\n".join(lines)


def compare_table(reports: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """Two or more runs side by side: the pulse phase (or whole run) and the facts."""
    rows: list[tuple[str, list[str]]] = []
    for key, label in _ROWS:
        rows.append((f"pulse {label}" if key != "sent" else "pulse requests sent",
                     [(_phase_column(r["summary"]["pulse"]) or _phase_column(r["summary"]))[key]
                      for r in reports]))
    labels = list(dict.fromkeys(label for r in reports for label, _ in _facts(r)))
    for label in labels:
        rows.append((label, [dict(_facts(r)).get(label, "-") for r in reports]))
    width = max(len(label) for label, _ in rows) + 2
    col = max(22, *(len(n) + 2 for n in names))
    lines = [" " * width + "".join(f"{n:<{col}}" for n in names)]
    for label, values in rows:
        lines.append(f"{label:<{width}}" + "".join(f"{v:<{col}}" for v in values).rstrip())
    return "\n".join(lines)


# -- plots --------------------------------------------------------------------------------


def _shade_pulse(ax: Axes, summary: dict[str, Any]) -> None:
    pulse = summary.get("pulse")
    if pulse:
        ax.axvspan(pulse["from_s"], pulse["to_s"], color="#fdd0a2", alpha=0.25, lw=0)
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0)


def _times(series: list[dict[str, Any]]) -> list[float]:
    return [p["t"] for p in series]


def _plot_rate(ax: Axes, report: dict[str, Any], label: str = "") -> None:
    series, t = report["series"], _times(report["series"])
    ax.plot(t, [p["offered"] for p in series], color=_COLORS["offered"], lw=1.2,
            label=f"{label}offered")
    ax.plot(t, [p["ok"] for p in series], color=_COLORS["ok"], lw=1.2,
            label=f"{label}served (2xx)")
    errors = [sum(p["errors"].values()) for p in series]
    if any(errors):
        ax.plot(t, errors, color=_COLORS["errors"], lw=1, label=f"{label}errors")
    ax.set_ylabel("requests/s")
    ax.set_title("offered vs served rate (per 100 ms)", fontsize=10, loc="left")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_ylim(bottom=0)
    _shade_pulse(ax, report["summary"])


def _plot_status(ax: Axes, report: dict[str, Any]) -> None:
    series, t = report["series"], _times(report["series"])
    kinds = sorted({kind for p in series for kind in p["errors"]},
                   key=lambda k: (k not in ("503", "timeout", "connection"), k))
    stacks = [[p["ok"] for p in series]] + [[p["errors"].get(k, 0.0) for p in series]
                                            for k in kinds]
    others = iter(_OTHER_COLORS)
    colors = [_COLORS["ok"]] + [_COLORS.get(k) or next(others, "#333333") for k in kinds]
    ax.stackplot(t, *stacks, labels=["2xx", *kinds], colors=colors, alpha=0.85, lw=0)
    ax.set_ylabel("responses/s")
    ax.set_title("responses by status over time (completion time)", fontsize=10, loc="left")
    ax.legend(loc="upper right", fontsize=8, ncol=min(len(kinds) + 1, 5))
    ax.set_ylim(bottom=0)
    _shade_pulse(ax, report["summary"])


def _plain_log_ticks(ax: Axes) -> None:
    """Log scale labelled 1, 2, 3, 5, 10, 20, ... ms rather than 10^k."""
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _plot_latency(ax: Axes, report: dict[str, Any], label: str = "",
                  which: Sequence[str] = ("p50", "p90", "p99")) -> None:
    series, t = report["series"], _times(report["series"])
    for name in which:
        values = [p[f"{name}_ms"] if p[f"{name}_ms"] is not None else float("nan")
                  for p in series]
        ax.plot(t, values, color=_COLORS[name], lw=1.1, label=f"{label}{name}",
                marker="." if len(t) < 80 else None, ms=3)
    slo = report["summary"]["slo_ms"]
    ax.axhline(slo, color="black", ls="--", lw=0.8, label=f"SLO {slo:g} ms")
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    ax.set_ylabel("latency (ms, 2xx)")
    ax.set_title("latency of 2xx responses by scheduled send time", fontsize=10, loc="left")
    ax.legend(loc="upper right", fontsize=8, ncol=4)
    _shade_pulse(ax, report["summary"])


def _plot_replicas(ax: Axes, report: dict[str, Any], label: str = "") -> None:
    series, t = report["series"], _times(report["series"])
    if all(p["replicas"] is None for p in series):
        ax.text(0.5, 0.5, "replicas not sampled (target is not a surge instance)",
                ha="center", va="center", transform=ax.transAxes, color="#555555")
        ax.set_yticks([])
    else:
        nan = float("nan")
        ax.step(t, [nan if p["replicas"] is None else p["replicas"] for p in series],
                where="post", color=_COLORS["replicas"], lw=1.5, label=f"{label}running")
        ax.step(t, [nan if p["target_replicas"] is None else p["target_replicas"]
                    for p in series], where="post", color=_COLORS["target"], lw=1, ls="--",
                label=f"{label}target")
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        handles, labels = ax.get_legend_handles_labels()
        cpu = [p.get("node_cpu_pct") for p in series]
        if any(v is not None for v in cpu):
            twin = ax.twinx()
            twin.plot(t, [nan if v is None else v for v in cpu], color=_COLORS["cpu"],
                      lw=1, alpha=0.8, label=f"{label}node CPU %")
            twin.set_ylim(0, 105)
            twin.set_ylabel("node CPU (% of all cores)")
            more, names = twin.get_legend_handles_labels()
            handles, labels = handles + more, labels + names
        ax.legend(handles, labels, loc="upper right", fontsize=8)
    ax.set_ylabel("replicas")
    ax.set_title("replicas and node CPU over time", fontsize=10, loc="left")
    _shade_pulse(ax, report["summary"])


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def render_plots(report: dict[str, Any]) -> dict[str, bytes]:
    """name -> PNG bytes for every name in PLOTS."""
    pngs: dict[str, bytes] = {}
    overview = Figure(figsize=(11, 11), layout="constrained")
    axes = overview.subplots(4, 1, sharex=True)
    _plot_rate(axes[0], report)
    _plot_status(axes[1], report)
    _plot_latency(axes[2], report)
    _plot_replicas(axes[3], report)
    axes[3].set_xlabel("seconds since the start of the schedule (shaded: the pulse)")
    overview.suptitle(_title(report), fontsize=10)
    pngs["overview"] = _png(overview)
    for name, draw in (("rate", _plot_rate), ("status", _plot_status),
                       ("latency", _plot_latency), ("replicas", _plot_replicas)):
        figure = Figure(figsize=(10, 3.6), layout="constrained")
        ax = figure.subplots()
        draw(ax, report)
        ax.set_xlabel("seconds since the start of the schedule (shaded: the pulse)")
        pngs[name] = _png(figure)
    if report["summary"].get("llm"):
        figure = Figure(figsize=(10, 3.6), layout="constrained")
        ax = figure.subplots()
        llm_report.plot_streams(ax, report)
        ax.set_xlabel("seconds since the start of the schedule (shaded: the pulse)")
        pngs["streams"] = _png(figure)
    return pngs


# -- files --------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em;
       color: #222; max-width: 1200px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { padding: 4px 12px; border-bottom: 1px solid #ddd; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.warn { background: #fff3cd; border: 1px solid #e0c36c; padding: 0.6em 1em; }
img { max-width: 100%; } code { background: #f4f4f4; padding: 1px 4px; }
"""


def _html_table(report: dict[str, Any]) -> str:
    s = report["summary"]
    columns = [("baseline", _phase_column(s["baseline"])), ("pulse", _phase_column(s["pulse"])),
               ("whole run", _phase_column(s))]
    columns = [(name, column) for name, column in columns if column]
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns)
    rows = [f"<tr><th></th>{head}</tr>"]
    for key, label in _ROWS:
        cells = "".join(f"<td>{html.escape(column[key])}</td>" for _, column in columns)
        rows.append(f"<tr><td>{html.escape(label)}</td>{cells}</tr>")
    facts = "".join(f"<tr><td>{html.escape(label)}</td><td style='text-align:left'>"
                    f"{html.escape(value)}</td></tr>" for label, value in _facts(report))
    return f"<table>{''.join(rows)}</table><table>{facts}</table>"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _warnings(report: dict[str, Any]) -> str:
    s, run = report["summary"], report["run"]
    notes = []
    if s["generator"]["behind"]:
        notes.append(f"The generator fell behind its schedule for {s['generator']['behind_s']}"
                     f" s (worst {s['generator']['lag_max_ms']:.0f} ms); latencies include "
                     "that delay. The offered load was not lowered.")
    if s["generator"]["waited_for_connection"]:
        notes.append(f"{s['generator']['waited_for_connection']:,} requests waited for one of "
                     f"the {run['connections']} connections.")
    if s.get("machine_limited"):
        notes.append(f"The node's CPU was saturated for {s['node_saturated_s']} s while "
                     "requests were refused or slow: the machine was the limit; more "
                     "replicas on it would not have served more.")
    if run.get("stopped_early"):
        notes.append(f"Stopped at max_time_s={run['max_time_s']}: {s['unanswered']:,} "
                     "requests unanswered.")
    return "".join(f'<p class="warn">{html.escape(n)}</p>' for n in notes)


def render_html(report: dict[str, Any], pngs: dict[str, bytes]) -> str:
    run = report["run"]
    params = ", ".join(f"{k}={v}" for k, v in run.items() if k not in ("schedule", "url"))
    steps = "; ".join(f"{s['from_rps']:g}&rarr;{s['to_rps']:g}/s for {s['for_s']:g}s"
                      for s in run["schedule"])
    plots = "".join(f"<h2>{html.escape(name)}</h2>{_img(pngs[name], name)}"
                    for name in (*PLOTS[1:], "streams") if name in pngs)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>surge pulse: {html.escape(run['url'])}</title>
<style>{_CSS}</style></head><body>
<h1>surge pulse report</h1>
<p><code>{html.escape(run['method'])} {html.escape(run['url'])}</code></p>
<p>schedule: {steps}</p>
<p style="color:#666;font-size:0.85em">{html.escape(params)}</p>
{_warnings(report)}
<h2>summary</h2>{_html_table(report)}
<p style="color:#666;font-size:0.85em">Rates are per 100 ms point. Latencies are of 2xx
responses, measured from the scheduled send time (open loop: a slow server cannot slow
the generator down). Errors count every non-2xx answer and every request that got none.
The pulse is shaded.</p>
{_img(pngs['overview'], 'overview')}
{plots}
<p style="color:#666;font-size:0.85em">Data: report.json next to this file.</p>
</body></html>
"""


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write report.json, the PNGs and report.html into out_dir; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json"}
    paths["json"].write_text(json.dumps(report, indent=1) + "\n")
    pngs = render_plots(report)
    for name, png in pngs.items():
        paths[name] = out / f"{name}.png"
        paths[name].write_bytes(png)
    paths["html"] = out / "report.html"
    paths["html"].write_text(render_html(report, pngs))
    return paths


def write_compare(reports: Sequence[dict[str, Any]], names: Sequence[str],
                  out_dir: str | Path) -> dict[str, Path]:
    """compare.png (rates, p99, replicas of each run overlaid) and compare.html."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(11, 9), layout="constrained")
    axes = figure.subplots(3, 1, sharex=True)
    styles = ("-", "--", ":", "-.")
    for index, (report, name) in enumerate(zip(reports, names, strict=True)):
        style = styles[index % len(styles)]
        t = _times(report["series"])
        axes[0].plot(t, [p["offered"] for p in report["series"]], color="#7f7f7f", ls=style,
                     lw=1, label=f"{name}: offered")
        axes[0].plot(t, [p["ok"] for p in report["series"]], ls=style, lw=1.2,
                     label=f"{name}: served")
        axes[1].plot(t, [p["p99_ms"] if p["p99_ms"] is not None else float("nan")
                         for p in report["series"]], ls=style, lw=1.2, label=f"{name}: p99")
        if any(p["replicas"] is not None for p in report["series"]):
            axes[2].step(t, [float("nan") if p["replicas"] is None else p["replicas"]
                             for p in report["series"]], where="post", ls=style,
                         label=f"{name}: replicas")
    axes[0].set_ylabel("requests/s")
    axes[1].set_ylabel("p99 (ms, 2xx)")
    axes[1].set_yscale("log")
    _plain_log_ticks(axes[1])
    axes[2].set_ylabel("replicas")
    axes[2].set_xlabel("seconds since the start of the schedule")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    png = _png(figure)
    paths = {"png": out / "compare.png", "html": out / "compare.html"}
    paths["png"].write_bytes(png)
    table = html.escape(compare_table(reports, names))
    paths["html"].write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>surge pulse: compare"
        f"</title><style>{_CSS}</style></head><body><h1>surge pulse: "
        f"{' vs '.join(html.escape(n) for n in names)}</h1><pre>{table}</pre>"
        f"{_img(png, 'compare')}</body></html>\n")
    return paths
