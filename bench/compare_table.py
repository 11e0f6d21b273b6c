#!/usr/bin/env python3
"""The table of bench/compare.sh: its JSON lines (each with "row") in, markdown out: per size the
median pushpull of each system and baseline, and the ratios a reader wants (how much faster than
MXNet, how close to the socket and to memcpy); then the many-keys rows.

    python3 bench/compare_table.py compare.jsonl
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hosts_table import load  # noqa: E402  (JSON lines, one object each)


def pushpull_us(rows, row, size, keys=1):
    for r in rows:
        if r.get("row") == row and r.get("op") == "pushpull" and r.get("bytes") == size \
                and r.get("keys") == keys:
            return float(r["median_us"])
    return None


def raw_tcp_us(rows, size):
    for r in rows:
        if r.get("row") != "raw-tcp" or r.get("bytes") != size:
            continue
        if r.get("bench") == "tcp_pingpong":
            return float(r["median_rtt_us"])
        if r.get("bench") == "tcp_baseline" and float(r["median_gbps"]) > 0:
            return 2 * size / (float(r["median_gbps"]) * 1e9) * 1e6
    return None


def memcpy_us(rows, size):
    for r in rows:
        if r.get("row") == "memcpy" and r.get("size") == size:
            payload_gbps = float(r["gb_per_s"]) / 2  # gb_per_s counts bytes read and written
            return 2 * size / (payload_gbps * 1e9) * 1e6
    return None


def gloo_us(rows, size):
    for r in rows:
        if r.get("row") == "gloo" and r.get("bytes") == size:
            return float(r["median_ms"]) * 1e3
    return None


def size_text(size):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def cell(value):
    return "-" if value is None else f"{value:,.1f}"


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator == 0:
        return "-"
    return f"{numerator / denominator:.2f}x"


def main():
    rows = load(sys.argv[1])
    sizes = sorted({r["bytes"] for r in rows if r.get("row") == "troupe-tcp"})
    print("| size | troupe shm µs | troupe tcp µs | MXNet 1.9.1 µs | raw TCP µs | memcpy floor µs "
          "| gloo all_reduce, 2 ranks, µs | troupe shm vs MXNet | troupe tcp / raw TCP "
          "| troupe shm / memcpy floor |")
    print("|" + " --- |" * 10)
    for size in sizes:
        shm, tcp = pushpull_us(rows, "troupe-shm", size), pushpull_us(rows, "troupe-tcp", size)
        mxnet, raw = pushpull_us(rows, "mxnet", size), raw_tcp_us(rows, size)
        floor, gloo = memcpy_us(rows, size), gloo_us(rows, size)
        print(f"| {size_text(size)} | {cell(shm)} | {cell(tcp)} | {cell(mxnet)} | {cell(raw)} "
              f"| {cell(floor)} | {cell(gloo)} | {ratio(mxnet, shm)} faster | {ratio(raw, tcp)} "
              f"| {ratio(floor, shm)} |")
    many = sorted({(r["bytes"], r["keys"]) for r in rows
                   if r.get("row") == "troupe-shm" and r.get("keys", 1) > 1})
    if many:
        print()
        print("| keys of 4 KiB | troupe, 1 key µs | troupe, that many keys µs "
              "| bandwidth of many keys / of one | MXNet, that many keys µs | troupe vs MXNet |")
        print("|" + " --- |" * 6)
        for size, keys in many:
            one, spread = pushpull_us(rows, "troupe-shm", size), pushpull_us(rows, "troupe-shm",
                                                                              size, keys)
            mxnet = pushpull_us(rows, "mxnet", size, keys)
            print(f"| {keys:,} ({size_text(size)}) | {cell(one)} | {cell(spread)} "
                  f"| {ratio(one, spread)} | {cell(mxnet)} | {ratio(mxnet, spread)} faster |")


if __name__ == "__main__":
    main()
