#!/usr/bin/env python3
"""Per-hop medians of small requests' round trips from the stamps of a TROUPE_HOP_PROBE build.

    TROUPE_HOP_PROBE_DIR=DIR troupe-launch -n 1 -s 1 -- kvbench --ops pushpull --sizes 4096 ...
    bench/hop_table.py DIR [--json]

Every process of the job wrote DIR/hops.<pid> (actors/logic/hop_probe.hpp): (CLOCK_MONOTONIC ns,
hop) records. With one request in flight at a time, sorting all of them by time gives each round
trip's hops in order, from the caller handing the call over (caller_send) to its wait returning
(caller_woken). Prints, per hop, the median microseconds from the previous hop of the chain over
the round trips that crossed every hop of it in order, and the median round trip; --json prints
one JSON line per hop instead.
"""
import argparse
import glob
import json
import statistics
import struct
import sys

HOPS = [
    "caller_send", "link_in", "link_queued", "link_written", "server_prefix", "server_body",
    "server_to_shard", "shard_in", "shard_out", "server_reply_in", "server_queued",
    "server_written", "client_prefix", "client_body", "client_to_worker", "delivered",
    "caller_woken",
]
NUMBER = {name: i + 1 for i, name in enumerate(HOPS)}
# What each step of the chain is, for the table.
WHAT = {
    "link_in": "caller thread: the worker's rules (or the actor's, woken through the pipe)",
    "link_queued": "link: encode the frame",
    "server_prefix": "send (loopback), server middleman wakes, reads 8 bytes",
    "server_body": "server reads the body",
    "server_to_shard": "server broker: decode, credit, route",
    "shard_in": "broker -> shard actor (scheduler thread wakes)",
    "shard_out": "shard_core handles the pushpull (from the route: on the broker's thread)",
    "server_reply_in": "shard -> server broker (pipe write, middleman wakes)",
    "server_queued": "server broker: encode the reply",
    "client_prefix": "send (loopback), client middleman wakes, reads 8 bytes",
    "client_body": "client reads the body",
    "client_to_worker": "client link: decode, credit",
    "delivered": "worker actor: match, copy into the output, deliver",
    "caller_woken": "completion -> caller thread wakes",
}


def read_stamps(directory):
    stamps = []
    for path in glob.glob(f"{directory}/hops.*"):
        with open(path, "rb") as f:
            data = f.read()
        for ns, hop, _ in struct.iter_unpack("<qII", data):
            if ns == 0:
                break
            stamps.append((ns, hop))
    stamps.sort()
    return stamps


def round_trips(stamps):
    """Each caller_send .. caller_woken span as {hop number: first time}."""
    trips, current = [], None
    for ns, hop in stamps:
        if hop == NUMBER["caller_send"]:
            current = {hop: ns}
        elif current is not None:
            current.setdefault(hop, ns)
            if hop == NUMBER["caller_woken"]:
                trips.append(current)
                current = None
    return trips


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trips = round_trips(read_stamps(args.directory))
    # The chain: the hops most trips crossed, in order (a request answered on the server broker's
    # thread has no shard_in), without the write reports, which may come after the peer's read.
    present = [h for h in HOPS if h not in ("link_written", "server_written") and
               2 * sum(NUMBER[h] in t for t in trips) > len(trips)]
    chain = [NUMBER[h] for h in present]
    complete = [t for t in trips
                if all(h in t for h in chain) and
                all(t[a] <= t[b] for a, b in zip(chain, chain[1:]))]
    if not complete:
        sys.exit(f"hop_table: no complete round trip among {len(trips)} in {args.directory}")
    rows = []
    for before, after in zip(present, present[1:]):
        us = [(t[NUMBER[after]] - t[NUMBER[before]]) / 1e3 for t in complete]
        rows.append((after, statistics.median(us)))
    total = statistics.median((t[chain[-1]] - t[chain[0]]) / 1e3 for t in complete)
    if args.json:
        for hop, us in rows:
            print(json.dumps({"bench": "hop", "hop": hop, "median_us": round(us, 2),
                              "trips": len(complete)}))
        print(json.dumps({"bench": "hop", "hop": "round_trip", "median_us": round(total, 2),
                          "trips": len(complete)}))
        return
    print(f"{len(complete)} complete round trips of {len(trips)}")
    print(f"{'hop':<18} {'median us':>9}  what")
    for hop, us in rows:
        print(f"{hop:<18} {us:9.2f}  {WHAT.get(hop, '')}")
    print(f"{'sum of medians':<18} {sum(us for _, us in rows):9.2f}")
    print(f"{'round trip':<18} {total:9.2f}  median of caller_send -> caller_woken")


if __name__ == "__main__":
    main()
