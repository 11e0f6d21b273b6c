#!/usr/bin/env python3
"""docs/scaling.md's model of a round: predicted beside measured for every point of a
bench/run_hosts_bench.sh run, a plot of the two, and what the model says for a large job.

    python3 bench/scale_model.py RESULTS.jsonl [--svg docs/scaling.svg]

Every input of a prediction is measured in the same run (the `calibrate` part and the raw
stream of each rate); nothing is fitted to the points it predicts. The model:

  bandwidth   a host's link carries R bytes/s each way at once (R: the raw TCP stream between
              two hosts at that rate, tcp_baseline's 128 MiB median), shared by the streams
              that cross it; after an idle moment the token bucket's burst (2 ms of the rate)
              passes at once;
  CPU         every byte that crosses a link costs the machine c CPU-seconds, each system its
              own (troupe's push and pull, gloo's ring: both ends, summing and the kernel
              included; measured without a rate limit), and all hosts here share CORES cores:
              a phase takes at least (bytes over all links * c) / CORES;
  latency     an operation costs alpha more (the KVStore's 4 KiB round trip between hosts);
  phases      a dist_sync pushpull is a push then a pull (the pull waits for the round to
              close), each max(link bound, CPU bound) + alpha; compute runs before it;
  allreduce   gloo's ring moves 2(N-1)/N of the bytes each way at once; each all_reduce also
              costs what a 4 KiB one costs over the same hosts (measured), and DDP runs one
              per gradient bucket after its compute.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hosts_table import load  # noqa: E402  (run_hosts_bench.sh's JSON lines)

GB = 1e9
MIB = 1 << 20


ALLREDUCE_BYTES = 83886080  # run_hosts_bench.sh's ALLREDUCE_BYTES
BIGARRAY_BOUND = 1000000  # elements: larger keys are split evenly over all servers


def model_keys(name):
    """float32 bytes of each key of a train_mnist model, in key order (weight, bias, ...)."""
    layers = {"mlp": [784, 256, 10], "mlp-wide": [784, 4096, 4096, 10]}[name]
    keys = []
    for a, b in zip(layers, layers[1:]):
        keys += [4 * a * b, 4 * b]
    return keys


def model_bytes(name):
    return sum(model_keys(name))


def ddp_buckets(keys, cap=25 * MIB):
    """PyTorch DDP's gradient buckets: the parameters in reverse order, a bucket closed once it
    holds `cap` bytes (a larger tensor is a bucket of its own)."""
    buckets, current = [], []
    for size in reversed(keys):
        current.append(size)
        if sum(current) >= cap:
            buckets.append(current)
            current = []
    if current:
        buckets.append(current)
    return buckets


def server_loads(keys, servers, bound=BIGARRAY_BOUND):
    """Bytes of one worker's push that each server receives: MXNet's placement (and troupe's,
    actors/logic/key_placement.cpp): a key of at least `bound` elements split evenly over all
    servers, a smaller one whole on server (key * 9973) % S."""
    loads = [0.0] * servers
    for key, size in enumerate(keys):
        if size // 4 >= bound:
            for s in range(servers):
                loads[s] += size / servers
        else:
            loads[(key * 9973) % servers] += size
    return loads


class Machine:
    """The measured constants of one run."""

    def __init__(self, rows):
        calib = [r for r in rows if r["part"] == "calibrate"]

        def one(bench, **match):
            for r in calib:
                if r["bench"] == bench and all(r.get(k) == v for k, v in match.items()):
                    return r
            sys.exit(f"scale_model: the run's calibrate part has no {bench} {match}")

        self.cores = one("machine")["cores"]
        big = 134217728
        raw = one("tcp_baseline", bytes=big)
        # CPU-seconds per byte that crosses a link, each system's own (measured without a limit).
        self.c_raw = raw["machine_cpu_s"] / (big * raw["repeats"])
        self.c_push = one("kvbench", bytes=big, op="push")["machine_cpu_s"] / (big * 10)
        self.c_pull = one("kvbench", bytes=big, op="pull")["machine_cpu_s"] / (big * 10)
        ring = one("gloo_allreduce", bytes=ALLREDUCE_BYTES)
        n = ring["world"]
        self.c_ring = ring["machine_cpu_s"] / (ring["reps"] * 2 * (n - 1) * ALLREDUCE_BYTES)
        self.alpha = one("kvbench", bytes=4096, op="pushpull")["median_ms"] / 1e3
        # One all_reduce's fixed cost over 4 hosts: its 2(N-1) steps, each waiting for a peer.
        self.ring_alpha = one("gloo_allreduce", bytes=4096)["median_ms"] / 1e3
        # The raw stream at each rate (and without one).
        self.rate = {r["rate"]: r["median_gbps"] * GB for r in rows
                     if r["bench"] == "tcp_baseline" and r["bytes"] >= 16 * MIB
                     and r["part"] in ("link", "calibrate")}
        # Compute-only step time (wall, one process alone) per system and model.
        self.compute = {}
        for r in rows:
            if r["part"] == "train" and r.get("layout") == "one process":
                self.compute[(r["system"], r["model"])] = r["batch"] / r["samples_per_s"]

    @staticmethod
    def burst(rate):
        """The bytes a link's token bucket lets through at once after an idle moment: 2 ms of
        the rate, at least 64 KiB (scripts/netns-cluster.sh's limit_rate)."""
        units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
        for unit, scale in units.items():
            if rate.endswith(unit):
                return max(65536, float(rate[: -len(unit)]) * scale / 8 / 500)
        return 0.0

    def phase(self, link_bytes_per_dir, cpu_seconds, rate):
        """One phase: the busiest link's bytes in one direction at R (less the bucket's burst: the
        link was idle before the phase), or the CPU work of all its bytes spread over the cores,
        whichever takes longer; and a round trip."""
        link = max(0.0, link_bytes_per_dir - self.burst(rate)) / self.rate[rate]
        return max(link, cpu_seconds / self.cores) + self.alpha

    # --- KVStore operations: W workers, S servers, each worker moving the bytes of `keys` ---
    @staticmethod
    def busiest_link(keys, workers, servers, beside, bound=BIGARRAY_BOUND):
        """The bytes the busiest link carries one way in a push (a pull mirrors it): a worker's
        upload, or a server's download of every worker's part."""
        loads = server_loads(keys, servers, bound)
        total = sum(keys)
        if not beside:
            return max(total, workers * max(loads))
        # Server i on worker i's host (i < S): that worker's part for it stays on the host.
        busiest = 0.0
        for host in range(max(workers, servers)):
            own = loads[host] if host < servers else 0.0
            upload = total - own if host < workers else 0.0
            download = own * (workers - (1 if host < workers else 0))
            busiest = max(busiest, upload, download)
        return busiest

    def ps_push(self, keys, workers, servers, rate, beside, bound=BIGARRAY_BOUND):
        return self.phase(self.busiest_link(keys, workers, servers, beside, bound),
                          sum(keys) * workers * self.c_push, rate)

    def ps_pull(self, keys, workers, servers, rate, beside, bound=BIGARRAY_BOUND):
        return self.phase(self.busiest_link(keys, workers, servers, beside, bound),
                          sum(keys) * workers * self.c_pull, rate)

    def ps_pushpull(self, keys, workers, servers, rate, beside, bound=BIGARRAY_BOUND):
        return (self.ps_push(keys, workers, servers, rate, beside, bound)
                + self.ps_pull(keys, workers, servers, rate, beside, bound))

    def ring(self, size, n, rate):
        """One all_reduce: its bytes, and its fixed cost (the measured 4 KiB all_reduce over the
        same hosts, else 2(N-1) KVStore round trips)."""
        per_dir = 2 * (n - 1) / n * size
        return self.phase(per_dir, per_dir * n * self.c_ring, rate) - self.alpha + self.ring_alpha

    # --- training steps: W workers each computing a batch, then communicating ---
    def compute_phase(self, system, model, workers):
        one = self.compute.get((system, model))
        if one is None:
            return None
        return one * workers / min(workers, self.cores)

    def troupe_step(self, model, workers, servers, rate, beside, bound=BIGARRAY_BOUND):
        compute = self.compute_phase("troupe-local", model, workers)
        if compute is None:
            return None
        return compute + self.ps_pushpull(model_keys(model), workers, servers, rate, beside, bound)

    def ddp_step(self, model, workers, rate):
        compute = self.compute_phase("pytorch-local", model, workers)
        if compute is None:
            return None
        # DDP all-reduces its gradient buckets (25 MB) as backward fills them, one all_reduce each.
        # Here that overlap is small and left out: most bytes are one tensor (the 4096x4096
        # weight, 84 % of mlp-wide) whose gradient is ready only in the middle of backward, and
        # the cores that would overlap it are busy with the other ranks' compute.
        keys = model_keys(model)
        buckets = ddp_buckets(keys)
        return compute + sum(self.ring(sum(b), workers, rate) for b in buckets)


def predictions(rows, m):
    """(label, predicted seconds, measured seconds) for every point the model covers."""
    points = []
    for r in rows:
        rate = r.get("rate")
        if r["part"] == "link" and r["bench"] == "kvbench" and rate in m.rate:
            size, op = r["bytes"], r["op"]
            fn = {"push": m.ps_push, "pull": m.ps_pull, "pushpull": m.ps_pushpull}[op]
            points.append((f"link {rate} {op} {size // MIB} MiB W=1 S=1",
                           fn([size], 1, 1, rate, False), r["median_ms"] / 1e3))
        elif r["part"] == "allreduce" and rate in m.rate:
            if r["bench"] == "kvbench" and ("slice_bytes" in r or "send_window_bytes" in r):
                continue  # the sweep of data.slice_bytes / send_window_bytes: not a point of the model
            if r["bench"] == "kvbench":
                beside = r["layout"] == "servers beside workers"
                fn = {"push": m.ps_push, "pull": m.ps_pull, "pushpull": m.ps_pushpull}[r["op"]]
                points.append((f"4 hosts {rate} {r['op']} {r['bytes'] // MIB} MiB {r['layout']}",
                               fn([r["bytes"]], 4, 4, rate, beside), r["median_ms"] / 1e3))
            elif r["bench"] == "gloo_allreduce":
                points.append((f"4 hosts {rate} gloo all_reduce {r['bytes'] // MIB} MiB",
                               m.ring(r["bytes"], r["world"], rate), r["median_ms"] / 1e3))
        elif r["part"] == "train" and rate in m.rate and r.get("layout") != "one process":
            measured = r["batch"] * r["workers"] / r["samples_per_s"]
            predicted = None
            if r["system"] == "troupe":
                predicted = m.troupe_step(r["model"], r["workers"], r["servers"], rate,
                                          r["layout"] == "servers beside workers",
                                          r.get("bigarray_bound", BIGARRAY_BOUND))
            elif r["system"] == "pytorch-ddp":
                predicted = m.ddp_step(r["model"], r["workers"], rate)
            elif r["system"] == "mxnet":
                # MXNet's dist_sync moves the same bytes in the same phases as troupe's; its
                # compute is its own (measured by mxnet-local when present).
                compute = m.compute_phase("mxnet-local", r["model"], r["workers"])
                if compute is not None:
                    predicted = compute + m.ps_pushpull(model_keys(r["model"]), r["workers"], r["servers"], rate,
                                                        r["layout"] == "servers beside workers")
            if predicted is not None:
                bound = f", bigarray_bound {r['bigarray_bound']}" if "bigarray_bound" in r else ""
                points.append((f"train {rate} {r['model']} {r['system']} {r.get('layout', '')}{bound} step",
                               predicted, measured))
    return points


def svg_plot(points, path):
    """Predicted against measured, log-log, with the +-25 % band."""
    size, margin = 520, 60
    values = [v for _, p, q in points for v in (p, q) if v > 0]
    low = 10 ** math.floor(math.log10(min(values)))
    high = 10 ** math.ceil(math.log10(max(values)))

    def pos(v):
        return margin + (math.log10(v) - math.log10(low)) / (math.log10(high) - math.log10(low)) * (size - 2 * margin)

    def y(v):
        return size - pos(v)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{size}" height="{size}" fill="white"/>',
           f'<text x="{size / 2}" y="20" text-anchor="middle" font-size="13">'
           'troupe scale model: predicted vs measured (seconds)</text>']
    band = " ".join(f"{pos(v):.1f},{y(v * 1.25):.1f}" for v in (low, high)) + " " + \
        " ".join(f"{pos(v):.1f},{y(v / 1.25):.1f}" for v in (high, low))
    out.append(f'<polygon points="{band}" fill="#e8f0ff"/>')
    out.append(f'<line x1="{pos(low)}" y1="{y(low)}" x2="{pos(high)}" y2="{y(high)}" stroke="#888"/>')
    decade = low
    while decade <= high * 1.0001:
        out.append(f'<text x="{pos(decade)}" y="{size - margin + 16}" text-anchor="middle">{decade:g}</text>')
        out.append(f'<text x="{margin - 6}" y="{y(decade) + 4}" text-anchor="end">{decade:g}</text>')
        decade *= 10
    out.append(f'<text x="{size / 2}" y="{size - 18}" text-anchor="middle">measured</text>')
    out.append(f'<text x="16" y="{size / 2}" transform="rotate(-90 16 {size / 2})" '
               'text-anchor="middle">predicted</text>')
    colours = {"link": "#1f77b4", "4 hosts": "#2ca02c", "train": "#d62728"}
    for label, predicted, measured in points:
        colour = next((c for k, c in colours.items() if label.startswith(k)), "black")
        out.append(f'<circle cx="{pos(measured):.1f}" cy="{y(predicted):.1f}" r="4" fill="{colour}" '
                   f'fill-opacity="0.7"><title>{label}: predicted {predicted:.3f}, measured '
                   f'{measured:.3f}</title></circle>')
    for i, (k, c) in enumerate(colours.items()):
        out.append(f'<circle cx="{margin + 10}" cy="{margin + 10 + 16 * i}" r="4" fill="{c}"/>')
        label = {"link": "two hosts, W=1 S=1", "4 hosts": "4 worker hosts, one key",
                 "train": "training step"}[k]
        out.append(f'<text x="{margin + 20}" y="{margin + 14 + 16 * i}">{label}</text>')
    out.append(f'<text x="{margin + 20}" y="{margin + 14 + 48}">shaded: within 25 %</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def projection(m):
    """A job no machine here can hold: 64 workers, 16 servers, 25 Gbit/s links, 100 M float32
    parameters; the link at 0.95 of its rate (what tbf and the kernel gave here at 1 Gbit/s), a
    host's own cores never the limit (one job per host), alpha as measured here."""
    rate = 25e9 / 8 * 0.95
    size = 100e6 * 4
    n, s = 64, 16
    alpha = m.alpha

    def t(bytes_per_dir):
        return bytes_per_dir / rate + alpha

    rows = []
    apart = max(size, size * n / s)
    rows.append(("troupe today: 16 server hosts, push then pull", 2 * t(apart)))
    beside = max(size * (n - 1) / n, size * (n - 1) / n)
    rows.append(("troupe today: a server on every worker host (S = 64), push then pull", 2 * t(beside)))
    rows.append(("ring allreduce (gloo, NCCL)", t(2 * (n - 1) / n * size) + (2 * (n - 1) - 1) * alpha))
    # BytePS (OSDI 2020): with k extra CPU hosts summing beside n worker hosts, each worker host
    # moves 2(n-1)/(n+k) of the bytes each way at the best partition.
    rows.append((f"BytePS-like: a server on every worker host + {s} CPU hosts, pipelined",
                 t(2 * size * (n - 1) / (n + s))))
    rows.append(("troupe, push and pull pipelined (issue 24): 16 server hosts", t(apart)))
    rows.append(("troupe, push and pull pipelined: a server on every worker host", t(beside)))
    # 2-bit compression (MXNet's): pushes carry 1/16 of the bytes; pulls stay float32.
    rows.append(("+ 2-bit push compression: 16 server hosts, push then pull",
                 t(apart / 16) + t(apart)))
    rows.append(("+ 2-bit push compression: a server on every worker host, pipelined",
                 t(beside)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results")
    parser.add_argument("--svg", help="write the predicted-vs-measured plot here")
    args = parser.parse_args()
    rows = load(args.results)
    m = Machine(rows)
    print(f"# measured constants: CPU-s per GB across a link: raw TCP {m.c_raw * GB:.3f}, "
          f"troupe push {m.c_push * GB:.3f}, pull {m.c_pull * GB:.3f}, gloo ring "
          f"{m.c_ring * GB:.3f}; {m.cores} cores; gloo 4 KiB all_reduce "
          f"{m.ring_alpha * 1e3:.2f} ms; "
          f"alpha {m.alpha * 1e6:.0f} us, raw streams "
          + ", ".join(f"{k} {v / GB:.3f} GB/s" for k, v in sorted(m.rate.items()))
          + ", compute-only steps "
          + ", ".join(f"{s}/{md} {v * 1e3:.1f} ms" for (s, md), v in sorted(m.compute.items())))
    print()
    print("| point | predicted s | measured s | measured / predicted |")
    print("|---|---|---|---|")
    points = predictions(rows, m)
    off = 0
    for label, predicted, measured in points:
        ratio = measured / predicted
        flag = "" if 0.8 <= ratio <= 1.25 else " **off**"
        off += bool(flag)
        print(f"| {label} | {predicted:.4f} | {measured:.4f} | {ratio:.2f}{flag} |")
    print(f"\n{len(points)} points, {off} outside 25 %\n")
    print("| 64 workers, 16 servers, 25 Gbit/s, 100 M float32 parameters | communication per step s |")
    print("|---|---|")
    for label, seconds in projection(m):
        print(f"| {label} | {seconds:.3f} |")
    if args.svg:
        svg_plot(points, args.svg)


if __name__ == "__main__":
    main()
