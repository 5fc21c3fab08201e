#!/usr/bin/env python3
"""Plots `kvtier-bench sim --json` output: modeled mean TTFT per policy per budget, one
panel per workload (kvtier's policies, LRU tiering, the peers' policies and the optimum).

Usage:
    build/kvtier-bench sim --workload all --json > bench/results/sim.json
    /usr/bin/python3 bench/plot_sim.py bench/results/sim.json bench/results/sim.png

Needs matplotlib (Debian: apt-get install python3-matplotlib; that package is for the
system interpreter, /usr/bin/python3). Nothing else in the build or tests needs it.
"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = [
    ("p2", "2 LRU tiering", "-"),
    ("s3fifo", "S3-FIFO", "--"),
    ("slru", "SLRU", "--"),
    ("arc", "ARC", "--"),
    ("tinylfu", "TinyLFU + LRU", "--"),
    ("wtinylfu", "W-TinyLFU", "--"),
    ("workload", "workload-aware", "--"),
    ("p3", "3 session-aware", "-"),
    ("p4", "4 predictive", "-"),
    ("p8", "offline optimum", ":"),
]
WORKLOADS = ["trace", "long-chats", "one-shot", "doc-qa", "agents"]


def budget_bytes(text):
    """'10.0 GiB/64.0 GiB/1.0 TiB' -> total bytes (for ordering budgets)."""
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
    total = 0.0
    for part in text.split("/"):
        value, unit = part.strip().split(" ")
        total += float(value) * units[unit]
    return total


def prefix(workload):
    return "" if workload == "trace" else workload + "_"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        report = json.load(f)
    config, results = report["config"], report["results"]
    budgets = sorted((k for k in config if re.fullmatch(r"b\d+", k)),
                     key=lambda k: budget_bytes(config[k]))
    labels = [f"{b}\n" + config[b].replace(".0 ", " ").replace("/", " / ") for b in budgets]
    xs = list(range(len(budgets)))
    workloads = [w for w in WORKLOADS if f"{prefix(w)}{budgets[0]}_p2_ttft_mean_ms" in results]

    columns = min(3, len(workloads))
    rows = (len(workloads) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.4 * rows), squeeze=False)
    panels = [ax for row in axes for ax in row]
    for ax in panels[len(workloads):]:
        ax.set_visible(False)
    for ax, workload in zip(panels, workloads):
        p = prefix(workload)
        for key, name, style in POLICIES:
            ttft = [results.get(f"{p}{b}_{key}_ttft_mean_ms") for b in budgets]
            if any(v is None for v in ttft):
                continue
            width = 2.2 if key == "p4" else 1.2
            ax.plot(xs, ttft, marker="o", linestyle=style, linewidth=width, label=name)
        ideal = results.get(p + "ideal_ttft_mean_ms")
        if ideal is not None:
            ax.axhline(ideal, color="gray", linestyle=":", linewidth=1, label="infinite cache")
        ax.set_title(f"{workload}: mean TTFT (lower is better)", fontsize=10)
        ax.set_ylabel("ms")
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_xlabel("budget (HBM / RAM / NVMe), tightest first", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.set_yscale("log")
    handles, names = panels[0].get_legend_handles_labels()
    if len(workloads) < len(panels):
        panels[-1].set_visible(True)
        panels[-1].axis("off")
        panels[-1].legend(handles, names, loc="center", fontsize=9)
    else:
        panels[0].legend(fontsize=7)
    fig.suptitle(
        f"kvtier-bench sim, seed {config.get('seed', 1)}: kvtier's policies against LRU tiering\n"
        f"and the peers' (S3-FIFO, SLRU, ARC, TinyLFU, W-TinyLFU, workload-aware); "
        f"RAM {config['ram_gbps']} GB/s, NVMe {config['nvme_gbps']} GB/s, "
        f"prefill {config['prefill_tokens_per_s']:.0f} tok/s",
        fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)


if __name__ == "__main__":
    main()
