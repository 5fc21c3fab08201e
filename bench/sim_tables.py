#!/usr/bin/env python3
"""Prints docs/policy.md's simulator tables from `kvtier-bench sim --workload all --json`.

usage: python3 bench/sim_tables.py bench/results/sim.json
"""
import json
import sys

WORKLOADS = ["trace", "long-chats", "one-shot", "doc-qa", "agents"]
POLICIES = [("p2", "2 LRU tiering"), ("s3fifo", "S3-FIFO"), ("slru", "SLRU"), ("arc", "ARC"),
            ("tinylfu", "TinyLFU + LRU"), ("wtinylfu", "W-TinyLFU"), ("workload", "workload-aware"),
            ("p3", "3 session-aware"), ("p4", "4 predictive")]
BASELINES = {"p2", "s3fifo", "slru", "arc", "tinylfu", "wtinylfu", "workload"}
BUDGETS = ["b1", "b2", "b3"]


def prefix(workload):
    return "" if workload == "trace" else workload + "_"


def budget_label(text):
    # "10.0 GiB/64.0 GiB/1.0 TiB" -> "10 GiB / 64 GiB / 1 TiB"
    parts = []
    for part in text.split("/"):
        number, unit = part.split()
        number = float(number)
        parts.append(f"{number:g} {unit}")
    return " / ".join(parts)


def main(path):
    data = json.load(open(path))
    r, c = data["results"], data["config"]
    for w in WORKLOADS:
        p = prefix(w)
        print(f"**{w}** ({c[p + 'requests']} requests, {c[p + 'sessions']} conversations, "
              f"{c[p + 'follow_up_turns']} follow-ups, {c[p + 'engines']} engines):\n")
        print("| budget | policy | mean | wait | p50 | p90 | p99 | hit % (hbm/ram/nvme) "
              "| NVMe MiB/turn | vs 2 | gap | vs best baseline |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for b in BUDGETS:
            lru = r[f"{p}{b}_p2_ttft_mean_ms"]
            best = min(r[f"{p}{b}_{key}_ttft_mean_ms"] for key, _ in POLICIES
                       if key in BASELINES and f"{p}{b}_{key}_ttft_mean_ms" in r)
            for i, (key, label) in enumerate(POLICIES):
                k = f"{p}{b}_{key}_"
                if k + "ttft_mean_ms" not in r:
                    continue
                hit = f"{100 * r[k + 'hit_rate']:.1f} ({100 * r[k + 'hit_rate_hbm']:.1f}/" \
                      f"{100 * r[k + 'hit_rate_ram']:.1f}/{100 * r[k + 'hit_rate_nvme']:.1f})"
                ratio = r[k + "ttft_mean_ms"] / lru
                gap = r.get(k + "gap_closed", 0.0)
                vs, gp = f"{ratio:.2f}", f"{gap:.2f}"
                vb = f"{r[k + 'ttft_mean_ms'] / best:.3f}"
                if key == "p4":
                    vs, gp, vb = f"**{vs}**", f"**{gp}**", f"**{vb}**"
                if key in BASELINES and r[k + "ttft_mean_ms"] == best:
                    label += " (best baseline)"
                budget = budget_label(c[b]) if i == 0 else ""
                print(f"| {budget} | {label} | {r[k + 'ttft_mean_ms']:.0f} | "
                      f"{r[k + 'wait_mean_ms']:.0f} | {r[k + 'ttft_p50_ms']:.0f} | "
                      f"{r[k + 'ttft_p90_ms']:.0f} | {r[k + 'ttft_p99_ms']:.0f} | {hit} | "
                      f"{r[k + 'nvme_written_bytes_per_turn'] / 2**20:.0f} | {vs} | {gp} | {vb} |")
            opt = r[f"{p}{b}_p8_ttft_mean_ms"]
            print(f"|  | 0 optimum | {opt:.0f} | {r[f'{p}{b}_p8_wait_mean_ms']:.0f} | "
                  f"{r[f'{p}{b}_p8_ttft_p50_ms']:.0f} | {r[f'{p}{b}_p8_ttft_p90_ms']:.0f} | "
                  f"{r[f'{p}{b}_p8_ttft_p99_ms']:.0f} | {100 * r[f'{p}{b}_p8_hit_rate']:.1f} | "
                  f"{r[f'{p}{b}_p8_nvme_written_bytes_per_turn'] / 2**20:.0f} | "
                  f"{opt / lru:.2f} | 1.00 | {opt / best:.3f} |")
        print(f"| bounds | every block kept, read from HBM / RAM / NVMe | "
              f"{r[p + 'ideal_ttft_mean_ms']:.0f} / {r[p + 'ideal_from_ram_ttft_mean_ms']:.0f} / "
              f"{r[p + 'ideal_from_nvme_ttft_mean_ms']:.0f} | | | | | "
              f"{100 * r[p + 'ideal_hit_rate']:.1f} | | | | |\n")
    print("agents without retention priorities (the same requests, priorities ignored): mean "
          "TTFT, and how much faster it is with them:\n")
    print("| budget | 1 HBM-only LRU | 2 LRU tiering | 3 session-aware | 4 predictive |")
    print("|---|---|---|---|---|")
    for b in BUDGETS:
        cells = []
        for key in ["p1", "p2", "p3", "p4"]:
            k = f"agents_{b}_{key}_"
            cells.append(f"{r[k + 'no_priorities_ttft_mean_ms']:.0f} → {r[k + 'ttft_mean_ms']:.0f} "
                         f"({r[k + 'priority_gain']:.3f}×)")
        print(f"| {budget_label(c[b])} | " + " | ".join(cells) + " |")
    met = [t for t in data["targets"] if t["met"]]
    base = [t for t in data["targets"] if "baseline" in t["metric"]]
    gap = [t for t in data["targets"]
           if "priority_gain" not in t["metric"] and "baseline" not in t["metric"]]
    pri = [t for t in data["targets"] if "priority_gain" in t["metric"]]
    print(f"\ntargets met: {sum(t['met'] for t in base)} of {len(base)} against the best "
          f"baseline, {sum(t['met'] for t in gap)} of {len(gap)} on gap and LRU, "
          f"{sum(t['met'] for t in pri)} of {len(pri)} on priorities ({len(met)} in all)")
    average = r.get("p4_vs_best_baseline_ttft_mean_ratio_average")
    if average is not None:
        print(f"4 predictive ÷ the best baseline of each cell: {average:.3f} on average, "
              f"{r['p4_vs_best_baseline_ttft_mean_ratio_max']:.3f} at worst")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/sim.json")
