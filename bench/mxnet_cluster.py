"""A whole Apache MXNet 1.9.1 dist job on 127.0.0.1, for the MXNet baselines (bench/mxnet_mnist.py,
bench/mxnet_kvbench.py): the same script started as scheduler, servers and workers, each with
MXNet's DMLC_* environment. A scheduler or server serves inside `import mxnet` and exits when the
workers are done; only workers run the script's body.
"""

import os
import socket
import subprocess
import sys
import time

# The role flags of a dist job's process and the variables MXNet reads them from.
ROLE_ENV = [("role", "DMLC_ROLE"), ("root_uri", "DMLC_PS_ROOT_URI"),
            ("root_port", "DMLC_PS_ROOT_PORT"), ("num_workers", "DMLC_NUM_WORKER"),
            ("num_servers", "DMLC_NUM_SERVER"), ("node_host", "DMLC_NODE_HOST"),
            ("interface", "DMLC_INTERFACE")]


def add_arguments(parser):
    """The flags of one process of a dist job, and of --launch-local."""
    roles = parser.add_argument_group("a process of a dist job (each sets its DMLC_* variable)")
    roles.add_argument("--role", choices=["worker", "server", "scheduler"])
    roles.add_argument("--root-uri", help="the scheduler's address")
    roles.add_argument("--root-port", help="the scheduler's port")
    roles.add_argument("--num-workers")
    roles.add_argument("--num-servers")
    roles.add_argument("--node-host", help="this process's address, which it binds")
    roles.add_argument("--interface", help="this process's network interface")
    launch = parser.add_argument_group("a whole dist job on 127.0.0.1")
    launch.add_argument("--launch-local", action="store_true",
                        help="start a scheduler, -s servers and -n workers on loopback")
    launch.add_argument("-n", type=int, default=2, help="workers (--launch-local)")
    launch.add_argument("-s", type=int, default=1, help="servers (--launch-local)")
    launch.add_argument("--launch-timeout", type=float, default=600,
                        help="seconds before --launch-local gives up on the job")


def apply_role(args):
    """Sets the DMLC_* variables the role flags name, before mxnet is imported."""
    for field, var in ROLE_ENV:
        if getattr(args, field) is not None:
            os.environ[var] = str(getattr(args, field))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(script, args):
    """Starts `script` with this process's flags, less the launcher's own, as scheduler, args.s
    servers and args.n workers on loopback; returns the exit code, the first failing process's,
    or 124 after args.launch_timeout."""
    port = str(free_port())
    passed, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg in ("-n", "-s", "--launch-timeout"):
            skip = True
        elif arg != "--launch-local" and not arg.startswith(("-n=", "-s=", "--launch-timeout=")):
            passed.append(arg)
    name = os.path.basename(script)
    procs = []
    for role, count in (("scheduler", 1), ("server", args.s), ("worker", args.n)):
        for _ in range(count):
            env = dict(os.environ, DMLC_ROLE=role, DMLC_PS_ROOT_URI="127.0.0.1",
                       DMLC_PS_ROOT_PORT=port, DMLC_NUM_SERVER=str(args.s),
                       DMLC_NUM_WORKER=str(args.n), DMLC_NODE_HOST="127.0.0.1",
                       DMLC_INTERFACE="lo")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(script)] + passed,
                                          env=env))
    deadline = time.monotonic() + args.launch_timeout
    code = 0
    try:
        pending = list(procs)
        while pending and time.monotonic() < deadline:
            for p in list(pending):
                rc = p.poll()
                if rc is None:
                    continue
                pending.remove(p)
                if rc != 0 and code == 0:
                    code = rc
                    deadline = 0  # one process failed: stop the others
            time.sleep(0.1)
        if pending and code == 0:
            print(f"{name}: the job did not end within {args.launch_timeout} s", file=sys.stderr)
            code = 124
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return code
