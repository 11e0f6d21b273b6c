"""The ranks of a gloo job for the bench/ scripts that run either one process per host or every
rank on this machine (bench/gloo_allreduce.py, bench/pytorch_ddp_mnist.py): their flags, joining
the process group, and starting the ranks."""

import datetime
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp


def add_arguments(parser):
    """--world, --rank, --master-addr, --master-port, --ifname and --timeout."""
    parser.add_argument("--world", type=int, default=2, help="processes")
    parser.add_argument("--rank", type=int, default=None,
                        help="run this one rank (no spawning); needs --master-port")
    parser.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address")
    parser.add_argument("--master-port", type=int, default=0,
                        help="rank 0's rendezvous port (0: a free one; spawn mode only)")
    parser.add_argument("--ifname", default="",
                        help="network interface for gloo (sets GLOO_SOCKET_IFNAME)")
    parser.add_argument("--timeout", type=float, default=120, help="rendezvous timeout, seconds")


def free_port():
    # The port is free when the script asks; gloo's store binds it a moment later. A race with
    # another program on the machine is possible but harmless for a benchmark (it then fails).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(rank, args, addr, port):
    """Joins the gloo group as `rank`; bounded: a rank whose peer never arrives gives up instead of
    waiting (or spinning) for ever."""
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    if args.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    dist.init_process_group("gloo", rank=rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout))


def run(parser, args, target):
    """target(rank, args, addr, port) as the one rank of --rank, or for every rank of --world in
    processes of its own."""
    if args.rank is not None:
        if not 0 <= args.rank < args.world:
            parser.error(f"--rank {args.rank} is not in 0..{args.world - 1}")
        if args.master_port == 0:
            parser.error("--rank needs --master-port (the same on every rank)")
        target(args.rank, args, args.master_addr, args.master_port)
    else:
        port = args.master_port or free_port()
        mp.spawn(target, args=(args, args.master_addr, port), nprocs=args.world, join=True)
