#!/usr/bin/env python3
"""The tables of bench/run_hosts_bench.sh: its JSON lines in, each figure beside its baseline of
the same run out (markdown, as BENCHMARKS.md keeps them).

    python3 bench/hosts_table.py results.jsonl
"""
import json
import sys
from collections import defaultdict

MIB = 1 << 20


def load(path):
    rows = []
    with open(path) as lines:
        for line in lines:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def link_table(rows):
    raw = {(r["rate"], r["bytes"]): r["median_gbps"] for r in rows
           if r["part"] == "link" and r["bench"] == "tcp_baseline"}
    kv = defaultdict(dict)
    for r in rows:
        if r["part"] == "link" and r["bench"] == "kvbench":
            kv[(r["rate"], r["bytes"])][r["op"]] = r
    if not kv:
        return
    print("## link: two hosts, W=1 S=1 (server on one host, worker on the other)\n")
    print("| rate | MiB | raw TCP GB/s | push GB/s | pull GB/s | pushpull GB/s | pushpull / raw |")
    print("|---|---|---|---|---|---|---|")
    for (rate, size), ops in sorted(kv.items()):
        base = raw.get((rate, size))
        pp = ops.get("pushpull", {}).get("gbps")
        ratio = f"{pp / base:.2f}" if base and pp else "—"
        print(f"| {rate} | {size // MIB} | {base} | {ops.get('push', {}).get('gbps')} | "
              f"{ops.get('pull', {}).get('gbps')} | {pp} | {ratio} |")
    print()


def settings(r):
    """The data.* settings a row changed from the defaults, or "defaults"."""
    changed = [f"{k} {r[k]}" for k in ("slice_bytes", "send_window_bytes") if k in r]
    return ", ".join(changed) or "defaults"


def allreduce_table(rows):
    ours = [r for r in rows if r["part"] == "allreduce" and r["bench"] == "kvbench"]
    gloo = {r["rate"]: r for r in rows if r["part"] == "allreduce" and r["bench"] == "gloo_allreduce"}
    if not ours and not gloo:
        return
    print("## allreduce: 4 worker hosts, one key, milliseconds per operation (median)\n")
    print("| rate | layout | settings | MiB | push | pull | pushpull | gloo all_reduce | "
          "pushpull speed-up over all_reduce | machine CPU-s | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    by = defaultdict(dict)
    for r in ours:
        by[(r["rate"], r.get("layout", "?"), settings(r), r["bytes"])][r["op"]] = r
    for (rate, layout, changed, size), ops in sorted(by.items()):
        g = gloo.get(rate, {}).get("median_ms")
        pp = ops.get("pushpull", {})
        ratio = f"{g / pp['median_ms']:.2f}" if g and pp else "—"
        ms = {op: ops.get(op, {}).get("median_ms") for op in ("push", "pull")}
        print(f"| {rate} | {layout} | {changed} | {size // MIB} | {ms['push']} | {ms['pull']} | "
              f"{pp.get('median_ms')} | {g} | {ratio} | {pp.get('machine_cpu_s')} | "
              f"{pp.get('load1')} |")
    print()


def train_table(rows):
    jobs = [r for r in rows if r["part"] == "train"]
    if not jobs:
        return
    print("## train: 4 worker hosts, samples/s of the whole job and accuracy after the same steps\n")
    print("| rate | model | system | layout | steps | samples/s | test accuracy | / DDP | "
          "wall s | machine CPU-s | job CPU-s | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ddp = {(r["rate"], r["model"]): r["samples_per_s"] for r in jobs if r["system"] == "pytorch-ddp"}
    for r in sorted(jobs, key=lambda r: (r["rate"], r["model"], r["system"], r.get("layout", ""),
                                         r.get("bigarray_bound", 0))):
        base = ddp.get((r["rate"], r["model"]))
        ratio = f"{r['samples_per_s'] / base:.2f}" if base else "—"
        layout = r.get("layout", "") + (f", bigarray_bound {r['bigarray_bound']}"
                                         if "bigarray_bound" in r else "")
        print(f"| {r['rate']} | {r['model']} | {r['system']} | {layout} | "
              f"{r.get('steps')} | {r['samples_per_s']:.0f} | {r.get('test_acc')} | {ratio} | "
              f"{r.get('wall_s', '—')} | {r.get('machine_cpu_s', '—')} | "
              f"{r.get('job_cpu_s', '—')} | {r.get('load1', '—')} |")
    print()


def cpu_ms(r):
    """CPU-milliseconds one step of the row cost its own processes: the step time times the cores
    the run got (its processes' CPU-seconds over its wall time), fixed costs spread over its steps.
    On 2 shared cores this, not the step time, is what compares runs that got different shares."""
    if r.get("job_cpu_s") is None or not r.get("wall_s"):
        return None
    return r["step_ms"] * r["job_cpu_s"] / r["wall_s"]


def step_table(rows):
    steps = [r for r in rows if r["part"] == "step"]
    if not steps:
        return
    print("## step: mlp-wide, 4 worker hosts, one step of one worker (ms) and its parts alone\n")
    print("| rate | what | layout | step ms | wall s | machine CPU-s | job CPU-s | "
          "cores the run got | CPU-ms per step | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in steps:
        cores = (f"{r['job_cpu_s'] / r['wall_s']:.2f}"
                 if r.get("job_cpu_s") is not None and r.get("wall_s") else "—")
        cpu = cpu_ms(r)
        print(f"| {r['rate']} | {r['what']} | {r['layout']} | {r['step_ms']} | {r.get('wall_s')} | "
              f"{r.get('machine_cpu_s')} | {r.get('job_cpu_s')} | {cores} | "
              f"{f'{cpu:.0f}' if cpu else '—'} | {r.get('load1')} |")
    print()
    print("| rate | layout | job step ms | compute ms (4 hosts at once) | communication ms | "
          "job / max(compute, communication) (target <= 1.15) | job / (compute + communication) "
          "| job CPU-ms / (compute + communication CPU-ms) | compute ms (one host alone) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rate in sorted({r["rate"] for r in steps}):
        at = [r for r in steps if r["rate"] == rate]
        compute = {r["workers"]: r for r in at if r["what"] == "compute"}
        shared = compute.get(4)
        for job in (r for r in at if r["what"] == "job"):
            comm = next((r for r in at
                         if r["what"] == "communication" and r["layout"] == job["layout"]), None)
            if not shared or not comm:
                continue
            s, c, m = job["step_ms"], shared["step_ms"], comm["step_ms"]
            cpus = [cpu_ms(r) for r in (job, shared, comm)]
            cpu_ratio = f"{cpus[0] / (cpus[1] + cpus[2]):.2f}" if all(cpus) else "—"
            alone = compute.get(1, {}).get("step_ms")
            print(f"| {rate} | {job['layout']} | {s} | {c} | {m} | {s / max(c, m):.2f} | "
                  f"{s / (c + m):.2f} | {cpu_ratio} | {alone} |")
    print()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: hosts_table.py RESULTS.jsonl")
    rows = load(sys.argv[1])
    link_table(rows)
    allreduce_table(rows)
    train_table(rows)
    step_table(rows)


if __name__ == "__main__":
    main()
