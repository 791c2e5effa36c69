#!/usr/bin/env python3
"""Charts for `make bench`: reads results/results.json, writes PNGs beside it.

- latency_<scenario>.png: p50..p999 per configuration (log scale), with the
  extra load in the legend;
- timeline_<scenario>.png: the learned delay and the hedge rate over time
  (adaptive-hedge and Envoy's static 10 ms hedging), for the scenarios that
  change during the run;
- streaming.png: time to first byte and to the end of the stream, per
  configuration, for the streaming scenario.
"""
import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUANTILES = ["p50", "p90", "p95", "p99", "p999"]


def slug(text):
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def main(folder):
    folder = Path(folder)
    data = json.loads((folder / "results.json").read_text())
    scenarios = {}
    for run in data["runs"]:
        for target in run["targets"]:
            name = run["scenario"]
            if len(run["targets"]) > 1:
                name = f'{name}: {target["cluster"]}'
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
    print(f"wrote {len(written)} charts to {folder}: {', '.join(written)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results")
