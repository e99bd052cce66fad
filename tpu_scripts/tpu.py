#!/usr/bin/env python3
"""Create, set up, launch on, stop and delete Cloud TPU VM slices for rankgen_jax through gcloud."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Where things live on every worker; `~` is expanded by the worker's shell.
REMOTE_CODE = "~/rankgen_jax"
REMOTE_VENV = "~/rankgen_venv"
REMOTE_LOGS = "~/logs"
REMOTE_TARBALL = "~/rankgen_jax.tar.gz"
# torch in requirements.txt is pinned without a local label; from this index pip
# takes the CPU wheel (2.x.y+cpu) instead of PyPI's CUDA build and its nvidia-* wheels.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The bracket keeps pgrep/pkill from matching the ssh shell whose command line holds this pattern.
TRAINER_PATTERN = "[r]ankgen_venv/bin/rankgen-jax"
# TPU VMs publish the worker index in the metadata server (jax reads it there too);
# TPU_WORKER_ID is set on GKE and by some images, so it wins when present.
WORKER_ID = ("${TPU_WORKER_ID:-$(curl -sf -H Metadata-Flavor:Google "
             "http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number"
             " || hostname)}")


@dataclass(frozen=True)
class Generation:
    """One TPU generation: how its accelerator-type number maps to chips and hosts."""

    runtime: str  # default --version / --runtime-version image
    counts_cores: bool  # v3/v4/v5p-N count TensorCores (2 per chip); v5litepod-N counts chips
    single_host_chips: int  # the most chips one VM holds (a slice this small is one host)
    chips_per_host: int  # chips per VM on multi-host slices
    sizes: tuple[int, ...]  # accelerator-type numbers accepted


# Default runtime images: the "PyTorch and JAX" table of https://cloud.google.com/tpu/docs/runtimes.
# Google adds and retires images, so update them here or pass --runtime_version.
GENERATIONS = {
    "v3": Generation("tpu-ubuntu2204-base", True, 4, 4, (8, 32, 64, 128, 256, 512, 1024, 2048)),
    "v4": Generation("tpu-ubuntu2204-base", True, 4, 4, tuple(range(8, 4097, 8))),
    # v5e: 1-, 4- and 8-chip single-host VMs; multi-host slices are built from 4-chip VMs.
    "v5litepod": Generation("v2-alpha-tpuv5-lite", False, 8, 4, (1, 4, 8, 16, 32, 64, 128, 256)),
    "v5p": Generation("v2-alpha-tpuv5", True, 4, 4, tuple(range(8, 12289, 8))),
}


@dataclass(frozen=True)
class Slice:
    """A validated accelerator type with its chip and host counts."""

    accelerator_type: str
    chips: int
    hosts: int
    runtime: str

    def summary(self) -> str:
        hosts = "1 host (worker 0)" if self.hosts == 1 else f"{self.hosts} hosts (workers 0-{self.hosts - 1})"
        return f"{self.accelerator_type}: {self.chips} chips, {hosts}, runtime {self.runtime}"


class UsageError(Exception):
    """Bad input, reported as one line."""


def parse_slice(accelerator_type: str) -> Slice:
    """Validate an accelerator type like v3-128 and count its chips and hosts."""
    match = re.fullmatch(r"(v3|v4|v5litepod|v5p)-(\d+)", accelerator_type)
    gen = GENERATIONS.get(match.group(1)) if match else None
    size = int(match.group(2)) if match else 0
    if gen is None or size not in gen.sizes:
        raise UsageError(
            f"unknown accelerator type {accelerator_type!r}; known: v3-8/32/64/128/256/512/1024/2048, "
            "v4-8..v4-4096 (multiples of 8), v5litepod-1/4/8/16/32/64/128/256 (v5e), v5p-8..v5p-12288 (multiples of 8)"
        )
    chips = size // 2 if gen.counts_cores else size
    hosts = 1 if chips <= gen.single_host_chips else chips // gen.chips_per_host
    return Slice(accelerator_type, chips, hosts, gen.runtime)


def tpu_pins(repo: Path = REPO) -> list[str]:
    """The requirement lines of requirements-tpu.txt, the one place the TPU pins live."""
    path = repo / "requirements-tpu.txt"
    if not path.is_file():
        raise UsageError(f"{path} not found")
    pins = [line.split("#")[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
    pins = [p for p in pins if p]
    jax_tpu = next((p for p in pins if p.startswith("jax[tpu]==")), None)
    if jax_tpu is None:
        raise UsageError(f"{path} has no jax[tpu]==VERSION pin")
    # jax[tpu] must match the jax pin of requirements.txt or pip cannot resolve them together.
    cpu = (repo / "requirements.txt").read_text(encoding="utf-8") if (repo / "requirements.txt").is_file() else ""
    jax_cpu = re.search(r"^jax==(\S+)", cpu, re.MULTILINE)
    if jax_cpu and jax_cpu.group(1) != jax_tpu.split("==")[1]:
        raise UsageError(f"{path}: {jax_tpu} does not match jax=={jax_cpu.group(1)} in requirements.txt")
    return pins


def run(cmd: list[str], dry_run: bool) -> None:
    """Print a command (dry run) or echo and run it; every gcloud call and every local change goes through here."""
    line = "+ " + shlex.join(cmd)
    if dry_run:
        print(line, flush=True)
        return
    print(line, file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def note(text: str) -> None:
    """A `# ` comment line in the command listing."""
    print(f"# {text}", flush=True)


def location(args) -> list[str]:
    """The --zone / --project flags every gcloud call takes."""
    flags = [f"--zone={args.zone}"]
    return flags + ([f"--project={args.project}"] if args.project else [])


def ssh(args, command: str, worker: str = "all") -> list[str]:
    """gcloud ssh running one shell command on the given workers (concurrently for all)."""
    return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.name, *location(args), f"--worker={worker}",
            f"--command={command}"]


def require_slice(args) -> Slice:
    """The slice of --accelerator_type, which this subcommand cannot do without."""
    if not args.accelerator_type:
        raise UsageError(f"{args.command} needs --accelerator_type (e.g. v3-128)")
    return parse_slice(args.accelerator_type)


def cmd_create(args) -> None:
    """Create the slice, or queue it."""
    tpu = require_slice(args)
    note(tpu.summary())
    runtime = args.runtime_version or tpu.runtime
    if args.queued:
        if args.preemptible:
            raise UsageError("queued resources have no --preemptible; use --spot")
        cmd = ["gcloud", "compute", "tpus", "queued-resources", "create", args.name, f"--node-id={args.name}",
               *location(args), f"--accelerator-type={tpu.accelerator_type}", f"--runtime-version={runtime}"]
    else:
        cmd = ["gcloud", "compute", "tpus", "tpu-vm", "create", args.name, *location(args),
               f"--accelerator-type={tpu.accelerator_type}", f"--version={runtime}"]
    cmd += ["--spot"] if args.spot else []
    cmd += ["--preemptible"] if args.preemptible else []
    run(cmd, args.dry_run)


def install_script(python: str, pins: list[str]) -> str:
    """Worker shell: Python 3.11 venv, the CPU pins plus the TPU pins, then the package itself."""
    pip = f"{REMOTE_VENV}/bin/pip install -q --disable-pip-version-check"
    steps = []
    if python == "python3.11":
        # The TPU images are Ubuntu 22.04 (Python 3.10); our pins need 3.11. The lock timeout
        # waits out unattended-upgrades, which holds apt on freshly booted VMs.
        apt = "sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq"
        steps.append(f"{apt} update && {apt} install -y python3.11 python3.11-venv")
    steps += [
        f"{python} -m venv {REMOTE_VENV}",
        f"cd {REMOTE_CODE}",
        f"{pip} --upgrade pip",
        f"{pip} --extra-index-url {TORCH_CPU_INDEX} -r requirements.txt {shlex.join(pins)}",
        f"{pip} --no-deps -r requirements-nodeps.txt",
        f"{pip} --no-deps -e .",
    ]
    return " && ".join(steps)


def cmd_setup(args) -> None:
    """Put the code on every worker and install the pinned requirements in a venv."""
    if args.accelerator_type:
        note(parse_slice(args.accelerator_type).summary())
    pins = tpu_pins()
    note("TPU pins from requirements-tpu.txt: " + " ".join(pins))
    if args.repo:
        ref = args.ref or _git("rev-parse", "HEAD")
        fetch = (f"rm -rf {REMOTE_CODE} && git clone -q {shlex.quote(args.repo)} {REMOTE_CODE}"
                 f" && git -C {REMOTE_CODE} checkout -q {shlex.quote(ref)}")
    else:
        if _git("status", "--porcelain", default=""):
            print("warning: git archive ships HEAD; uncommitted and untracked changes stay behind", file=sys.stderr)
        tarball = os.path.join(tempfile.gettempdir(), f"rankgen_jax-{args.name}.tar.gz")
        run(["git", "-C", str(REPO), "archive", "--format=tar.gz", f"--output={tarball}", "HEAD"], args.dry_run)
        run(["gcloud", "compute", "tpus", "tpu-vm", "scp", tarball, f"{args.name}:{REMOTE_TARBALL}", *location(args),
             "--worker=all"], args.dry_run)
        fetch = f"rm -rf {REMOTE_CODE} && mkdir -p {REMOTE_CODE} && tar -xzf {REMOTE_TARBALL} -C {REMOTE_CODE}"
    run(ssh(args, f"{fetch} && {install_script(args.python, pins)}"), args.dry_run)


def _git(*git_args: str, default: str | None = None) -> str:
    """Read-only git query on the local checkout (runs in dry runs too)."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), *git_args], check=True, capture_output=True, text=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        if default is not None:
            return default
        raise UsageError(f"git {' '.join(git_args)} failed in {REPO}; pass --ref") from None


def _workdir(train_args: list[str]) -> str | None:
    """The --workdir value among the rankgen-jax arguments, if any."""
    for i, arg in enumerate(train_args):
        if arg.startswith("--workdir="):
            return arg.split("=", 1)[1]
        if arg == "--workdir" and i + 1 < len(train_args):
            return train_args[i + 1]
    return None


def cmd_launch(args) -> None:
    """Start rankgen-jax in the background on every worker, each with its own log."""
    tpu = require_slice(args)
    note(tpu.summary())
    train_args = args.rankgen_args
    if not train_args:
        raise UsageError("give the rankgen-jax arguments after --, e.g. -- train --gin_file=... --workdir=gs://...")
    if "--dry_run" in train_args:
        # After -- it would reach rankgen-jax while the gcloud commands really ran.
        raise UsageError("put --dry_run before --; everything after -- goes to rankgen-jax")
    workdir = _workdir(train_args)
    if tpu.hosts > 1 and not (workdir or "").startswith("gs://"):
        raise UsageError(f"{tpu.accelerator_type} has {tpu.hosts} hosts: --workdir must be a gs:// path every host "
                         f"can reach (got {workdir!r})")
    run_name = args.run_name or (workdir.rstrip("/").rsplit("/", 1)[-1] if workdir else train_args[0])
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", run_name):
        raise UsageError(f"--run_name {run_name!r}: use letters, digits, '_', '.' or '-'")
    # tpu: fail loudly rather than fall back to CPU. RANKGEN_MULTI_HOST: the trainer joins
    # jax.distributed (ssh shells on TPU VMs do not always carry TPU_WORKER_HOSTNAMES).
    env = ["JAX_PLATFORMS=tpu", *(["RANKGEN_MULTI_HOST=1"] if tpu.hosts > 1 else []), *args.env]
    for pair in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", pair):
            raise UsageError(f"--env {pair!r}: expected NAME=VALUE")
    log = f"{REMOTE_LOGS}/{run_name}.worker$W.log"
    note(f"per-worker logs: {log} (W = worker index)")
    # A running trainer holds the TPU, so a second one would only fail to start.
    busy = (f'if pgrep -f "{TRAINER_PATTERN}" >/dev/null; then '
            'echo "worker $W: rankgen-jax is already running; stop it first" >&2; exit 1; fi')
    # setsid + nohup + </dev/null: the trainer outlives the ssh session, which returns at once.
    command = " && ".join([
        f"W={WORKER_ID}",
        busy,
        f"mkdir -p {REMOTE_LOGS}",
        f"cd {REMOTE_CODE}",
        f". {REMOTE_VENV}/bin/activate",
        f"export {shlex.join(env)}",
        f"(setsid nohup rankgen-jax {shlex.join(train_args)} > {log} 2>&1 < /dev/null &)",
        f'echo "worker $W: started, log {log}"',
    ])
    run(ssh(args, command), args.dry_run)


def cmd_logs(args) -> None:
    """Tail the per-worker logs on the workers, or copy them here."""
    pattern = f"{REMOTE_LOGS}/{args.run_name or '*'}.worker*.log"
    if not args.fetch:
        tail = f"tail -{'F' if args.follow else ''}n {args.lines} {pattern}"
        run(ssh(args, tail, worker=args.worker), args.dry_run)
        return
    if args.worker == "all":
        workers = range(require_slice(args).hosts)
    elif args.worker.isdigit():
        workers = [int(args.worker)]
    else:
        raise UsageError("--fetch takes --worker=N or --worker=all")
    run(["mkdir", "-p", args.fetch], args.dry_run)
    for worker in workers:
        # One scp per worker: the names carry the worker index, so they do not collide in --fetch.
        run(["gcloud", "compute", "tpus", "tpu-vm", "scp", f"{args.name}:{pattern}", args.fetch, *location(args),
             f"--worker={worker}"], args.dry_run)


def cmd_stop(args) -> None:
    """SIGTERM the trainers everywhere, wait for them to exit, optionally stop the VM."""
    # SIGTERM makes the trainer save a checkpoint and exit 0; wait for that before any VM stop.
    wait = (f"pkill -TERM -f \"{TRAINER_PATTERN}\" || true; for i in $(seq {max(args.wait // 5, 1)}); do "
            f"pgrep -f \"{TRAINER_PATTERN}\" >/dev/null || exit 0; sleep 5; done; "
            "echo \"$(hostname): rankgen-jax still running\" >&2; exit 1")
    run(ssh(args, wait), args.dry_run)
    if args.stop_vm:
        run(["gcloud", "compute", "tpus", "tpu-vm", "stop", args.name, *location(args)], args.dry_run)


def cmd_delete(args) -> None:
    """Delete the slice (a queued resource with its node)."""
    if args.queued:
        cmd = ["gcloud", "compute", "tpus", "queued-resources", "delete", args.name, *location(args), "--force"]
    else:
        cmd = ["gcloud", "compute", "tpus", "tpu-vm", "delete", args.name, *location(args)]
    run(cmd + ["--quiet"], args.dry_run)


def cmd_status(args) -> None:
    """Describe the slice, optionally list the rankgen-jax processes."""
    kind = "queued-resources" if args.queued else "tpu-vm"
    run(["gcloud", "compute", "tpus", kind, "describe", args.name, *location(args)], args.dry_run)
    if args.processes:
        run(ssh(args, f'pgrep -af "{TRAINER_PATTERN}" || echo "$(hostname): no rankgen-jax process"'), args.dry_run)


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per step; all share the slice options."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", required=True, help="TPU VM (and queued resource) name")
    common.add_argument("--zone", required=True, help="e.g. europe-west4-a (v3), us-central2-b (v4)")
    common.add_argument("--project", help="GCP project (default: gcloud's configured project)")
    common.add_argument("--accelerator_type", help="v3-8..v3-2048, v4-N, v5litepod-N (v5e), v5p-N")
    common.add_argument("--queued", action="store_true", help="the slice is a queued resource")
    common.add_argument("--dry_run", action="store_true", help="print every command instead of running it")

    parser = argparse.ArgumentParser(prog="tpu.py", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("create", parents=[common], help="create the slice (or queue it with --queued)")
    p.add_argument("--runtime_version", help="TPU VM image (default: per generation, see docs/tpu.md)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--spot", action="store_true", help="Spot VMs (cheaper, can be preempted)")
    kind.add_argument("--preemptible", action="store_true", help="legacy preemptible VMs (not with --queued)")
    p.set_defaults(run=cmd_create)

    p = sub.add_parser("setup", parents=[common], help="copy the code to every worker and install the pins")
    p.add_argument("--repo", help="git URL to clone on each worker instead of copying `git archive HEAD`")
    p.add_argument("--ref", help="with --repo: commit, tag or branch (default: the local HEAD commit)")
    p.add_argument("--python", default="python3.11", help="worker interpreter for the venv (default python3.11, "
                   "installed with apt; any other is used as is)")
    p.set_defaults(run=cmd_setup)

    p = sub.add_parser("launch", parents=[common], help="start rankgen-jax on every worker, one log per worker")
    p.add_argument("--run_name", help="log name (default: the --workdir basename)")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE exported on the workers (repeatable)")
    p.add_argument("rankgen_args", nargs=argparse.REMAINDER, help="after --: rankgen-jax arguments")
    p.set_defaults(run=cmd_launch)

    p = sub.add_parser("logs", parents=[common], help="tail or fetch the per-worker logs")
    p.add_argument("--worker", default="0", help="worker index, list (1,4), range (1-3) or all (default 0)")
    p.add_argument("--run_name", help="log name (default: every run)")
    p.add_argument("--lines", type=int, default=50, help="lines to show (default 50)")
    p.add_argument("--follow", action="store_true", help="keep following (tail -F)")
    p.add_argument("--fetch", metavar="DIR", help="copy the log files into DIR instead of tailing")
    p.set_defaults(run=cmd_logs)

    p = sub.add_parser("stop", parents=[common], help="SIGTERM the trainers (they checkpoint and exit)")
    p.add_argument("--wait", type=int, default=900, help="seconds to wait for the trainers to exit (default 900)")
    p.add_argument("--stop_vm", action="store_true", help="then stop the TPU VM (single-host slices only)")
    p.set_defaults(run=cmd_stop)

    p = sub.add_parser("delete", parents=[common], help="delete the slice (or the queued resource and its node)")
    p.set_defaults(run=cmd_delete)

    p = sub.add_parser("status", parents=[common], help="describe the slice")
    p.add_argument("--processes", action="store_true", help="also list rankgen-jax processes on every worker")
    p.set_defaults(run=cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; bad input exits 2 with a one-line error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "rankgen_args", None) and args.rankgen_args[0] == "--":
        args.rankgen_args = args.rankgen_args[1:]
    try:
        args.run(args)
    except UsageError as e:
        print(f"tpu.py {args.command}: error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"tpu.py {args.command}: command failed with exit code {e.returncode}", file=sys.stderr)
        return e.returncode or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
