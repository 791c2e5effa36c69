#!/usr/bin/env python3
"""Charts for `make bench`: reads results/results.json, writes PNGs beside it.

- latency_<scenario>.png: p50..p999 per configuration (log scale), with the
  extra load in the legend;
- timeline_<scenario>.png: the learned delay and the hedge rate over time
  (adaptive-hedge and Envoy's static 10 ms hedging), for the scenarios that
  change during the run;
- streaming.png: time to first byte and to the end of the stream, per
  configuration, for the streaming scenario;
- frontier_<scenario>.png: p99 and p999 against extra load: Envoy's fixed
  delays as a line (the frontier a user could pick from in hindsight), no
  hedging at 0, adaptive-hedge as a point (medians over the runs; with
  several targets, geometric means of the targets').

With several runs per configuration (BENCH_RUNS) the other charts show the
run whose p99 is the median.
"""
import json
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUANTILES = ["p50", "p90", "p95", "p99", "p999"]


def slug(text):
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def tail(run, q):
    """A run's quantile: the geometric mean over its targets."""
    values = [max(t["latency_ms"][q], 1e-3) for t in run["targets"]]
    return math.exp(sum(math.log(v) for v in values) / len(values))


def median(values):
    return sorted(values)[len(values) // 2]


def median_runs(runs):
    """Per (scenario, configuration), the run whose p99 is the median."""
    groups = {}
    for run in runs:
        groups.setdefault((run["scenario"], run["configuration"]), []).append(run)
    return [median_run(g) for g in groups.values()], groups


def median_run(group):
    return sorted(group, key=lambda r: tail(r, "p99"))[len(group) // 2]


def frontier_charts(folder, groups):
    written = []
    scenarios = sorted({s for s, _ in groups})
    for scenario in scenarios:
        configs = {c: g for (s, c), g in groups.items() if s == scenario}
        if not any("static" in c for c in configs) or not any("adaptive" in c for c in configs):
            continue
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
        for ax, q in zip(axes, ("p99", "p999")):
            fixed = []
            for c, g in configs.items():
                point = (median([r["extra_load"] for r in g]) * 100, median([tail(r, q) for r in g]))
                if "static" in c or "no hedging" in c:
                    fixed.append(point)
                if "no hedging" in c:
                    ax.plot(*point, "ks", label="no hedging")
                if "adaptive" in c:
                    ax.plot(*point, "r*", markersize=14, label="adaptive-hedge (zero config)")
            fixed.sort()
            ax.plot([p[0] for p in fixed], [p[1] for p in fixed], "--o", color="grey", label="Envoy, fixed delays")
            for c, g in configs.items():
                if "static" in c:
                    ax.annotate(c.split("hedge ")[-1], (median([r["extra_load"] for r in g]) * 100, median([tail(r, q) for r in g])), fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.set_xlabel("extra load (% of requests)")
            ax.set_ylabel(f"{q} (ms, log scale)")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(q)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{scenario}: tail against extra load")
        fig.tight_layout()
        path = folder / f"frontier_{slug(scenario)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    return written


def fanout_chart(folder):
    """fanout.png from `make demo DEMO=fanout`: the front end's p50 and p99
    against the number of backends it waits for, per configuration, with
    each configuration's extra load in the legend."""
    path = folder / "fanout.json"
    if not path.exists():
        return False
    rows = json.loads(path.read_text())["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, q in zip(axes, ["p50", "p99"]):
        for name in dict.fromkeys(r["configuration"] for r in rows):
            mine = sorted((r for r in rows if r["configuration"] == name), key=lambda r: r["fanout"])
            extra = max(r["extra_load"] for r in mine) * 100
            ax.plot([r["fanout"] for r in mine], [r[q + "_ms"] for r in mine], marker="o",
                    label=f"{name} (extra load up to {extra:.1f}%)")
        ax.set_xscale("log")
        ax.set_xlabel("backends per front-end request (N)")
        ax.set_title(f"front end {q}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    out = folder / "fanout.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")
    return True


def main(folder):
    folder = Path(folder)
    fanout = fanout_chart(folder)
    results = folder / "results.json"
    if not results.exists():
        # BENCH_ONLY=... prints its section and writes no results.json;
        # `make demo DEMO=fanout` writes only fanout.json
        if not fanout:
            print(f"no {results}: no charts")
        return
    data = json.loads(results.read_text())
    runs, groups = median_runs(data["runs"])
    scenarios = {}
    for run in runs:
        for target in run["targets"]:
            name = run["scenario"]
            if len(run["targets"]) > 1:
                name = f'{name}: {target["cluster"]} {target.get("path", "")}'
            scenarios.setdefault(name, []).append((run, target))
    written = []
    for name, runs in scenarios.items():
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for run, target in runs:
            values = [target["latency_ms"][q] for q in QUANTILES]
            label = f'{run["configuration"]} (+{run["extra_load"] * 100:.1f}% load)'
            style = "-o" if "adaptive" in run["configuration"] else "--."
            ax.plot(QUANTILES, values, style, label=label, linewidth=2.2 if "adaptive" in run["configuration"] else 1)
        ax.set_yscale("log")
        ax.set_ylabel("latency (ms, log scale)")
        ax.set_title(f"{name}: client latency percentiles")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = folder / f"latency_{slug(name)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)

        timelines = [(run, t) for run, t in runs if run["timeline"] and ("adaptive" in run["configuration"] or "static hedge 10 ms" in run["configuration"])]
        if not timelines or not any(k in name for k in ("shift", "outage")):
            continue
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
        for run, _ in timelines:
            t = [p[0] for p in run["timeline"]]
            if "adaptive" in run["configuration"]:
                top.plot(t, [p[1] for p in run["timeline"]], label="adaptive-hedge: learned delay")
            bottom.plot(t, [p[2] * 100 for p in run["timeline"]], label=run["configuration"])
        top.axhline(10, color="grey", linestyle=":", label="static 10 ms")
        top.set_ylabel("hedge delay (ms)")
        top.legend(fontsize=7)
        top.set_title(f"{name}: delay and hedge rate over time")
        bottom.axhline(10, color="red", linestyle=":", label="10% budget")
        bottom.set_ylabel("extra attempts (% of requests)")
        bottom.set_xlabel("seconds into the measured run")
        bottom.legend(fontsize=7)
        for a in (top, bottom):
            a.grid(True, alpha=0.3)
        fig.tight_layout()
        path = folder / f"timeline_{slug(name)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    streaming = [(run, t) for run, t in scenarios.get("streaming", []) if t.get("first_byte_ms")]
    if streaming:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
        for run, target in streaming:
            label = f'{run["configuration"]} (+{run["extra_load"] * 100:.1f}% load)'
            first_byte = "first byte" in run["configuration"]
            style = "-o" if first_byte else "--."
            width = 2.2 if first_byte else 1
            left.plot(QUANTILES, [target["first_byte_ms"][q] for q in QUANTILES], style, label=label, linewidth=width)
            right.plot(QUANTILES, [target["latency_ms"][q] for q in QUANTILES], style, label=label, linewidth=width)
        left.set_title("time to first byte")
        right.set_title("time to the end of the stream")
        left.set_ylabel("ms (log scale)")
        for a in (left, right):
            a.set_yscale("log")
            a.grid(True, which="both", alpha=0.3)
        left.legend(fontsize=6)
        fig.suptitle("streaming: client percentiles")
        fig.tight_layout()
        path = folder / "streaming.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    written += frontier_charts(folder, groups)
    print(f"wrote {len(written)} charts to {folder}: {', '.join(written)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results")
