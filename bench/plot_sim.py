#!/usr/bin/env python3
"""Plots `kvtier-bench sim --json` output: modeled TTFT and hit rate per policy, by budget.

Usage:
    build/kvtier-bench sim --json > bench/results/sim.json
    python3 bench/plot_sim.py bench/results/sim.json bench/results/sim.png

Needs matplotlib (Debian: apt-get install python3-matplotlib; that package is for the
system interpreter, /usr/bin/python3). Nothing else in the build or tests needs it.
"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

POLICIES = {
    1: "1 HBM only, LRU",
    2: "2 LRU tiering",
    3: "3 session-aware",
    4: "4 predictive",
}


def budget_bytes(text):
    """'10.0 GiB/64.0 GiB/1.0 TiB' -> total bytes (for ordering budgets)."""
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
    total = 0.0
    for part in text.split("/"):
        value, unit = part.strip().split(" ")
        total += float(value) * units[unit]
    return total


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        report = json.load(f)
    config, results = report["config"], report["results"]
    budgets = sorted((k for k in config if re.fullmatch(r"b\d+", k)),
                     key=lambda k: budget_bytes(config[k]))
    labels = [f"{b}\n" + config[b].replace(".0 ", " ").replace("/", " / ") for b in budgets]
    xs = range(len(budgets))

    fig, (ttft_ax, hit_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    for policy, name in POLICIES.items():
        ttft = [results.get(f"{b}_p{policy}_ttft_mean_ms") for b in budgets]
        hits = [results.get(f"{b}_p{policy}_hit_rate") for b in budgets]
        if any(v is None for v in ttft):
            continue
        ttft_ax.plot(xs, ttft, marker="o", label=name)
        hit_ax.plot(xs, [100 * h for h in hits], marker="o", label=name)
    ideal_ttft = results["ideal_ttft_mean_ms"]
    ideal_hit = 100 * results["ideal_hit_rate"]
    ttft_ax.axhline(ideal_ttft, color="gray", linestyle="--", label="infinite cache")
    for key, style, name in (("ideal_from_ram_ttft_mean_ms", "-.", "infinite, read from RAM"),
                             ("ideal_from_nvme_ttft_mean_ms", ":", "infinite, read from NVMe")):
        if key in results:
            ttft_ax.axhline(results[key], color="gray", linestyle=style, label=name)
    hit_ax.axhline(ideal_hit, color="gray", linestyle="--", label="infinite cache")
    lru = [results.get(f"{b}_p2_ttft_mean_ms") for b in budgets]
    if all(v is not None for v in lru):
        ttft_ax.plot(xs, [0.7 * v for v in lru], color="red", linestyle=":", linewidth=1,
                     label="target: 0.7 x policy 2")

    ttft_ax.set_title("Modeled mean TTFT (lower is better)")
    ttft_ax.set_ylabel("ms")
    hit_ax.set_title("Blocks loaded from the daemon (hit rate)")
    hit_ax.set_ylabel("% of requested blocks")
    for ax in (ttft_ax, hit_ax):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_xlabel("budget (HBM / RAM / NVMe), tightest first")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    ttft_ax.legend(fontsize=8)
    cfg = config
    fig.suptitle(
        f"kvtier-bench sim: {cfg['requests']} requests, {cfg['follow_up_turns']} follow-up turns; "
        f"{cfg['kv_bytes_per_token'] // 1024} KiB/token, RAM {cfg['ram_gbps']} GB/s, "
        f"NVMe {cfg['nvme_gbps']} GB/s, prefill {cfg['prefill_tokens_per_s']:.0f} tok/s",
        fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
