"""The LLM part of a pulse report (runs with `--preset`): facts, and the streams plot.

`facts(summary)` gives the rows the summary table and the compare view add (TTFT, TPOT,
ITL and end-to-end p50/p99, goodput where objectives were given, output tokens,
tokens/s); `plot_streams(ax, report)` draws TTFT p50/p99 by scheduled send time and
output tokens/s over time on one panel.
"""

from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes

__all__ = ["facts", "plot_streams"]


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def _goodput(llm: dict[str, Any]) -> list[tuple[str, str]]:
    if llm.get("goodput") is None:
        return []
    objectives = " ".join(f"{k}<={v:g}ms" for k, v in llm["goodput"].items())
    of_answered = llm.get("goodput_of_answered_pct")
    shed = "" if of_answered is None else f"; {of_answered:g}% of served + shed"
    return [(f"goodput ({objectives})", f"{llm['good_completed']:,} streams "
                                        f"({llm['goodput_pct']:g}%{shed}), "
                                        f"{llm['request_goodput'] or 0:g} req/s")]


def facts(summary: dict[str, Any]) -> list[tuple[str, str]]:
    llm = summary.get("llm")
    if not llm:
        return []
    return [
        ("streams (2xx) / output tokens", f"{llm['streams']:,} / {llm['output_tokens']:,} "
                                          f"(p50 {llm['output_tokens_p50'] or 0:g} a stream)"),
        *((f"{label} p50 / p99", f"{_ms(llm[f'median_{key}_ms'])} / "
                                 f"{_ms(llm[f'p99_{key}_ms'])}")
          for label, key in (("time to first token", "ttft"),
                             ("time per output token", "tpot"),
                             ("inter-token latency", "itl"), ("end-to-end", "e2el"))),
        *_goodput(llm),
        ("shed (429) / 5xx / timeouts", f"{llm.get('shed', 0):,} ({llm.get('shed_pct') or 0:g}%)"
                                        f" / {llm.get('failed_5xx', 0):,} / "
                                        f"{llm.get('timeouts', 0):,}"),
        ("output tokens/s mean / peak", f"{llm['tokens_per_s_mean']:,.0f} / "
                                        f"{llm['tokens_per_s_peak']:,.0f}"),
    ]


def plot_streams(ax: Axes, report: dict[str, Any]) -> None:
    series = report["series"]
    t = [p["t"] for p in series]
    nan = float("nan")
    for key, color in (("ttft_p50_ms", "#1f77b4"), ("ttft_p99_ms", "#d62728")):
        ax.plot(t, [nan if p.get(key) is None else p[key] for p in series], color=color,
                lw=1.1, label=key.replace("_ms", "").replace("_", " "))
    ax.set_ylabel("time to first token (ms)")
    ax.set_yscale("log")
    ax.set_title("time to first token (by send time) and output tokens/s", fontsize=10,
                 loc="left")
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0)
    twin = ax.twinx()
    twin.plot(t, [p.get("tokens_per_s", 0.0) for p in series], color="#2ca02c", lw=1,
              label="output tokens/s")
    twin.set_ylabel("output tokens/s")
    twin.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    pulse = report["summary"].get("pulse")
    if pulse:
        ax.axvspan(pulse["from_s"], pulse["to_s"], color="#fdd0a2", alpha=0.25, lw=0)
