#!/usr/bin/python3
"""troupe-launch --emit k8s: the manifests parse as YAML and hold the objects and values of the job.

    k8s_manifests_test.py TROUPE_LAUNCH

Runs the real launcher (nothing is started: --emit only writes), parses its output with PyYAML
(Debian's python3-yaml) and checks every object, every pod's command and environment, that the
job token is a Secret reference and never the token itself, and that bad requests exit 2 with one
line. Exits 1 naming the first check that fails.
"""
import os
import subprocess
import sys
import tempfile

import yaml

LAUNCH = sys.argv[1]
TOKEN = "the-launchers-own-token-5f2e"


def launch(args, env_more=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "TROUPE_", "SLURM"))}
    env["TROUPE_JOB_TOKEN"] = TOKEN  # in the launcher's environment: must not reach the output
    env.update(env_more or {})
    return subprocess.run([LAUNCH] + args, env=env, capture_output=True, text=True, timeout=30)


def check(condition, what):
    if not condition:
        sys.exit("k8s_manifests_test: " + what)


def env_of(container):
    """The container's env as name -> entry, checking every name appears once."""
    names = [e["name"] for e in container["env"]]
    check(len(names) == len(set(names)), "a variable twice in " + container["name"] + ": " + str(names))
    return {e["name"]: e for e in container["env"]}


def value(env, name):
    check(name in env, "no " + name)
    check("valueFrom" not in env[name], name + " is not a plain value")
    return env[name]["value"]


with tempfile.TemporaryDirectory() as tmp:
    config = os.path.join(tmp, "cluster.toml")
    config_text = '[scheduler]\nport = 9500\n\n[timeouts]\npeer = "10s"\n'
    with open(config, "w") as f:
        f.write(config_text)
    command = ["/opt/troupe/train_mnist", "--kvstore", "dist_sync", "--batch-size", "64"]
    note = 'a "quoted": value, with # and \\ and ünïcode'
    r = launch(["-n", "3", "-s", "2", "--emit", "k8s", "--image", "registry.example/troupe:1.0",
                "--name", "mnist", "--quorum", "2", "--config", config,
                "--env", "OMP_NUM_THREADS:4", "--env-server", "OMP_NUM_THREADS=8",
                "--env-worker", "NOTE:" + note, "--"] + command)
    check(r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr))
    check(TOKEN not in r.stdout and TOKEN not in r.stderr, "the token is in the output")
    docs = [d for d in yaml.safe_load_all(r.stdout) if d is not None]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    check(kinds == [("ConfigMap", "mnist-config"), ("Service", "mnist-scheduler"),
                    ("Job", "mnist-scheduler"), ("Job", "mnist-server"), ("Job", "mnist-worker")],
          "objects: " + str(kinds))
    config_map, service, jobs = docs[0], docs[1], {d["metadata"]["name"]: d for d in docs[2:]}
    check(config_map["data"] == {"cluster.toml": config_text}, "ConfigMap: " + str(config_map))

    # The Service reaches the scheduler's pod on the configured port.
    scheduler_pod = jobs["mnist-scheduler"]["spec"]["template"]
    labels = scheduler_pod["metadata"]["labels"]
    selector = service["spec"]["selector"]
    check(all(labels.get(k) == v for k, v in selector.items()), "the Service selects " + str(selector))
    for job in ("mnist-server", "mnist-worker"):
        pod_labels = jobs[job]["spec"]["template"]["metadata"]["labels"]
        check(not all(pod_labels.get(k) == v for k, v in selector.items()),
              "the Service also selects " + job)
    check(service["spec"]["ports"] == [{"name": "scheduler", "protocol": "TCP", "port": 9500,
                                        "targetPort": 9500}], "ports: " + str(service["spec"]))

    expected = {
        "scheduler": (1, ["troupe-node", "--role", "scheduler", "--bind", "0.0.0.0"], "4"),
        "server": (2, ["troupe-node", "--role", "server"], "8"),
        "worker": (3, command, "4"),
    }
    for role, (count, argv, threads) in expected.items():
        job = jobs["mnist-" + role]
        spec = job["spec"]
        check(job["apiVersion"] == "batch/v1", role + ": apiVersion")
        check(spec["backoffLimit"] == 0, role + ": backoffLimit")
        if role != "scheduler":
            check(spec["completionMode"] == "Indexed" and spec["completions"] == count and
                  spec["parallelism"] == count, role + ": " + str(spec))
        pod = spec["template"]["spec"]
        check(pod["restartPolicy"] == "Never", role + ": restartPolicy")
        check(len(pod["containers"]) == 1, role + ": containers")
        container = pod["containers"][0]
        check(container["image"] == "registry.example/troupe:1.0", role + ": image")
        check(container["command"] == argv, role + ": command " + str(container["command"]))
        check(container["volumeMounts"] == [{"name": "troupe-config", "mountPath": "/etc/troupe",
                                             "readOnly": True}], role + ": volumeMounts")
        check(pod["volumes"] == [{"name": "troupe-config", "configMap": {"name": "mnist-config"}}],
              role + ": volumes")
        env = env_of(container)
        check(value(env, "DMLC_ROLE") == role, role + ": DMLC_ROLE")
        check(value(env, "DMLC_PS_ROOT_URI") == "mnist-scheduler", role + ": root")
        check(value(env, "DMLC_PS_ROOT_PORT") == "9500", role + ": port")
        check(value(env, "DMLC_NUM_WORKER") == "3", role + ": workers")
        check(value(env, "DMLC_NUM_SERVER") == "2", role + ": servers")
        check(value(env, "TROUPE_QUORUM") == "2", role + ": quorum")
        check(value(env, "TROUPE_CONFIG") == "/etc/troupe/cluster.toml", role + ": config")
        check(value(env, "OMP_NUM_THREADS") == threads, role + ": OMP_NUM_THREADS")
        check(env["TROUPE_JOB_TOKEN"] == {"name": "TROUPE_JOB_TOKEN", "valueFrom": {
            "secretKeyRef": {"name": "mnist-token", "key": "token"}}}, role + ": token")
        if role == "worker":
            check(value(env, "NOTE") == note, "worker: NOTE is " + repr(env["NOTE"]))
        else:
            check("NOTE" not in env, role + ": NOTE")
        if role == "scheduler":
            check(container["ports"] == [{"name": "scheduler", "containerPort": 9500}],
                  "scheduler: ports")
            check("TROUPE_RANK_HINT" not in env and "DMLC_NODE_HOST" not in env,
                  "scheduler: rank hint or node host")
        else:
            check(env["TROUPE_RANK_HINT"]["valueFrom"]["fieldRef"]["fieldPath"] ==
                  "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                  role + ": rank hint")
            check(env["DMLC_NODE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP",
                  role + ": node host")

    # Defaults: port 9091, Secret NAME-token unless named, no ConfigMap without --config.
    r = launch(["-n", "1", "--emit", "k8s", "--image", "img", "--k8s-secret", "shared.token",
                "--", "w"])
    check(r.returncode == 0, "defaults: " + r.stderr)
    docs = [d for d in yaml.safe_load_all(r.stdout) if d is not None]
    check([d["kind"] for d in docs] == ["Service", "Job", "Job", "Job"], "defaults: objects")
    check(docs[0]["spec"]["ports"][0]["port"] == 9091, "defaults: port")
    worker_env = env_of(docs[3]["spec"]["template"]["spec"]["containers"][0])
    check(worker_env["TROUPE_JOB_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "shared.token",
          "--k8s-secret")
    check(value(worker_env, "DMLC_NUM_SERVER") == "1", "defaults: servers")
    check("TROUPE_CONFIG" not in worker_env and "TROUPE_QUORUM" not in worker_env,
          "defaults: config or quorum")

    # Bad requests: exit 2, one line, nothing on stdout, never the token.
    with open(os.path.join(tmp, "with-token.toml"), "w") as f:
        f.write('[job]\ntoken = "file-token-77"\n')
    os.chmod(os.path.join(tmp, "with-token.toml"), 0o600)
    bad = [
        (["--emit", "k8s", "--", "w"], "--emit k8s needs --image IMAGE"),
        (["--emit", "k8s", "--image", "img", "--name", "Bad_Name", "--", "w"],
         '--name "Bad_Name": Kubernetes needs lowercase letters'),
        (["--emit", "k8s", "--image", "img", "--name", "x" * 41, "--", "w"], "at most 40 characters"),
        (["--emit", "k8s", "--image", "two words", "--", "w"], "an image reference without blanks"),
        (["--emit", "k8s", "--image", "img", "-H", "/dev/null", "--", "w"],
         "-H applies to --launcher ssh only"),
        (["--emit", "k8s", "--image", "img", "--launcher", "local", "--", "w"], "drop --launcher"),
        (["--image", "img", "--", "w"], "--image, --name and --k8s-secret apply"),
        (["--emit", "k8s", "--image", "img", "--config", os.path.join(tmp, "with-token.toml"),
          "--", "w"], "names a job token (job.token or job.token_file)"),
    ]
    for args, message in bad:
        r = launch(["-n", "1"] + args)
        check(r.returncode == 2, "%s: exit %d" % (args, r.returncode))
        check(r.stdout == "", "%s: wrote %r" % (args, r.stdout))
        check(r.stderr.startswith("troupe-launch: ") and message in r.stderr and
              r.stderr.count("\n") == 1, "%s: %r" % (args, r.stderr))
        check("file-token-77" not in r.stderr, "the file's token in " + r.stderr)

print("k8s manifests: every check holds")
