"""tpu_scripts/: the dry-run gcloud commands for a v3-128 RankGen XL run, and the input checks."""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TPU_PY = REPO / "tpu_scripts" / "tpu.py"
SLICE = ["--name", "rg-xl", "--zone", "europe-west4-a", "--project", "my-proj"]
XL = ["train", "--gin_file=tpu/rankgen_xl_v3_128.gin", "--workdir=gs://my-bucket/rankgen/xl",
      '--gin.TrainerConfig.init_checkpoint="gs://my-bucket/ckpt/t5_xl"']


@pytest.fixture(autouse=True)
def _no_real_gcloud(tmp_path_factory, monkeypatch):
    """A gcloud that fails first on PATH: a test that ran a command for real would show it."""
    bin_dir = tmp_path_factory.getbasetemp() / "fake_bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        fake = bin_dir / "gcloud"
        fake.write_text("#!/bin/sh\necho 'real gcloud called from a test' >&2\nexit 99\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def tpu(subcommand: str, *args: str, script: Path = TPU_PY) -> subprocess.CompletedProcess:
    """Run tpu.py with --dry_run (before any `--`, so that gcloud itself never runs)."""
    return subprocess.run([sys.executable, str(script), subcommand, "--dry_run", *args], capture_output=True,
                          text=True, timeout=30)


def commands(out: str) -> list[list[str]]:
    """The `+ ` lines of a dry run, split back into argv lists."""
    return [shlex.split(line[2:]) for line in out.splitlines() if line.startswith("+ ")]


def remote(cmd: list[str]) -> str:
    """The shell command a gcloud ssh line runs on the workers."""
    return next(a for a in cmd if a.startswith("--command=")).split("=", 1)[1]


def check_slice_flags(cmd: list[str]) -> None:
    assert cmd[0] == "gcloud" and any(a == "rg-xl" or a.startswith("rg-xl:") for a in cmd)
    assert "--zone=europe-west4-a" in cmd and "--project=my-proj" in cmd


def tpu_pins() -> list[str]:
    lines = (REPO / "requirements-tpu.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


@pytest.fixture(scope="module")
def tpu_module():
    spec = importlib.util.spec_from_file_location("tpu_scripts_tpu", TPU_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("accelerator_type,chips,hosts", [
    ("v3-8", 4, 1), ("v3-32", 16, 4), ("v3-128", 64, 16), ("v3-2048", 1024, 256),
    ("v4-8", 4, 1), ("v4-16", 8, 2), ("v4-128", 64, 16), ("v4-4096", 2048, 512),
    ("v5litepod-1", 1, 1), ("v5litepod-8", 8, 1), ("v5litepod-16", 16, 4), ("v5litepod-256", 256, 64),
    ("v5p-8", 4, 1), ("v5p-128", 64, 16),
])
def test_hosts_per_slice(tpu_module, accelerator_type, chips, hosts):
    tpu_slice = tpu_module.parse_slice(accelerator_type)
    assert (tpu_slice.chips, tpu_slice.hosts) == (chips, hosts)


def test_runtime_per_generation(tpu_module):
    runtimes = {t: tpu_module.parse_slice(t).runtime for t in ("v3-8", "v4-8", "v5litepod-4", "v5p-8")}
    assert runtimes == {"v3-8": "tpu-ubuntu2204-base", "v4-8": "tpu-ubuntu2204-base",
                        "v5litepod-4": "v2-alpha-tpuv5-lite", "v5p-8": "v2-alpha-tpuv5"}


def test_create_v3_128_spot():
    result = tpu("create", *SLICE, "--accelerator_type", "v3-128", "--spot")
    assert result.returncode == 0, result.stderr
    assert "# v3-128: 64 chips, 16 hosts (workers 0-15)" in result.stdout
    [cmd] = commands(result.stdout)
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "rg-xl"]
    check_slice_flags(cmd)
    assert {"--accelerator-type=v3-128", "--version=tpu-ubuntu2204-base", "--spot"} <= set(cmd)
    assert not any(a.startswith("--worker") for a in cmd)


def test_create_queued():
    result = tpu("create", *SLICE, "--accelerator_type", "v3-128", "--queued", "--spot")
    assert result.returncode == 0, result.stderr
    [cmd] = commands(result.stdout)
    assert cmd[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "rg-xl"]
    check_slice_flags(cmd)
    assert {"--node-id=rg-xl", "--accelerator-type=v3-128", "--runtime-version=tpu-ubuntu2204-base",
            "--spot"} <= set(cmd)
    bad = tpu("create", *SLICE, "--accelerator_type", "v3-128", "--queued", "--preemptible")
    assert bad.returncode == 2 and "--spot" in bad.stderr


def test_setup_copies_head_and_installs_the_tpu_pins():
    result = tpu("setup", *SLICE, "--accelerator_type", "v3-128")
    assert result.returncode == 0, result.stderr
    archive, scp, ssh = commands(result.stdout)
    assert archive[0] == "git" and "archive" in archive and archive[-1] == "HEAD"
    tarball = next(a for a in archive if a.startswith("--output=")).split("=", 1)[1]
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and tarball in scp
    assert ssh[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
    for cmd in (scp, ssh):
        check_slice_flags(cmd)
        assert "--worker=all" in cmd
    script = remote(ssh)
    pins = tpu_pins()
    assert pins == ["jax[tpu]==0.10.2", "libtpu==0.0.42.1", "google-cloud-storage==3.17.1"]
    install = next(step for step in script.split(" && ") if "-r requirements.txt" in step)
    assert shlex.split(install)[-len(pins):] == pins
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in install
    assert "python3.11 -m venv ~/rankgen_venv" in script
    assert "--no-deps -e ." in script


def test_setup_reads_the_pins_from_requirements_tpu(tmp_path):
    (tmp_path / "tpu_scripts").mkdir()
    shutil.copy(TPU_PY, tmp_path / "tpu_scripts" / "tpu.py")
    (tmp_path / "requirements.txt").write_text("jax==9.9.9\n")
    (tmp_path / "requirements-tpu.txt").write_text("# a comment\njax[tpu]==9.9.9\nlibtpu==1.2.3  # why\n")
    result = tpu("setup", *SLICE, "--repo", "https://example.com/rankgen_jax.git", "--ref", "v1",
                 script=tmp_path / "tpu_scripts" / "tpu.py")
    assert result.returncode == 0, result.stderr
    [ssh] = commands(result.stdout)
    assert "'jax[tpu]==9.9.9' libtpu==1.2.3" in remote(ssh)
    assert "git clone -q https://example.com/rankgen_jax.git ~/rankgen_jax" in remote(ssh)
    (tmp_path / "requirements.txt").write_text("jax==9.9.8\n")
    bad = tpu("setup", *SLICE, "--repo", "x", "--ref", "v1", script=tmp_path / "tpu_scripts" / "tpu.py")
    assert bad.returncode == 2 and "does not match jax==9.9.8" in bad.stderr


def test_launch_v3_128_xl():
    result = tpu("launch", *SLICE, "--accelerator_type", "v3-128", "--", *XL)
    assert result.returncode == 0, result.stderr
    assert "16 hosts" in result.stdout
    [cmd] = commands(result.stdout)
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rg-xl"]
    check_slice_flags(cmd)
    assert "--worker=all" in cmd
    script = remote(cmd)
    assert "export JAX_PLATFORMS=tpu RANKGEN_MULTI_HOST=1" in script  # v3-128: 16 hosts join jax.distributed
    assert "setsid nohup rankgen-jax " + shlex.join(XL) + " > ~/logs/xl.worker$W.log 2>&1 < /dev/null &" in script
    assert "W=${TPU_WORKER_ID:-" in script and "agent-worker-number" in script


def test_launch_wrapper_matches_tpu_py():
    direct = tpu("launch", *SLICE, "--accelerator_type", "v3-128", "--run_name", "xl1", "--", *XL)
    env = dict(os.environ, PYTHON=sys.executable)
    wrapped = subprocess.run(["bash", str(REPO / "tpu_scripts" / "launch.sh"), "--dry_run", *SLICE,
                              "--accelerator_type", "v3-128", "--run_name", "xl1", "--", *XL],
                             capture_output=True, text=True, env=env, timeout=30)
    assert wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout == direct.stdout and "~/logs/xl1.worker$W.log" in wrapped.stdout


def test_logs_stop_delete_status():
    [tail] = commands(tpu("logs", *SLICE, "--worker", "3", "--run_name", "xl").stdout)
    assert "--worker=3" in tail and remote(tail) == "tail -n 50 ~/logs/xl.worker*.log"
    fetch = commands(tpu("logs", *SLICE, "--worker", "all", "--fetch", "out", "--accelerator_type", "v3-128").stdout)
    assert [c for c in fetch if "scp" in c][-1][-1] == "--worker=15" and len(fetch) == 17
    stop, vm_stop = commands(tpu("stop", *SLICE, "--stop_vm").stdout)
    assert "--worker=all" in stop and 'pkill -TERM -f "[r]ankgen_venv/bin/rankgen-jax"' in remote(stop)
    assert vm_stop[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "stop", "rg-xl"]
    [delete] = commands(tpu("delete", *SLICE).stdout)
    assert delete[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "rg-xl"] and "--quiet" in delete
    [queued] = commands(tpu("delete", *SLICE, "--queued").stdout)
    assert queued[3:5] == ["queued-resources", "delete"] and {"--force", "--quiet"} <= set(queued)
    for cmd in (tail, stop, vm_stop, delete, queued):
        check_slice_flags(cmd)
    [describe] = commands(tpu("status", *SLICE).stdout)
    assert describe[3:6] == ["tpu-vm", "describe", "rg-xl"]


@pytest.mark.parametrize("args,message", [
    (["create", *SLICE, "--accelerator_type", "v3-100"], "unknown accelerator type 'v3-100'"),
    (["create", *SLICE, "--accelerator_type", "v6e-8"], "unknown accelerator type 'v6e-8'"),
    (["create", *SLICE], "needs --accelerator_type"),
    (["create", "--name", "rg-xl", "--accelerator_type", "v3-8"], "required: --zone"),
    (["launch", *SLICE, "--accelerator_type", "v3-128", "--", "train", "--workdir=runs/xl"],
     "v3-128 has 16 hosts: --workdir must be a gs:// path"),
    (["launch", *SLICE, "--accelerator_type", "v3-32", "--", "train", "--gin_file=x.gin"], "got None"),
    (["launch", *SLICE, "--accelerator_type", "v3-8"], "give the rankgen-jax arguments after --"),
    (["launch", *SLICE, "--accelerator_type", "v3-8", "--", "train", "--dry_run"], "put --dry_run before --"),
])
def test_bad_input_is_one_clear_error(args, message):
    result = tpu(*args)
    assert result.returncode == 2 and message in result.stderr
    assert "+ " not in result.stdout  # nothing would have run


def test_single_host_accepts_a_local_workdir():
    result = tpu("launch", *SLICE, "--accelerator_type", "v3-8", "--", "train", "--workdir", "runs/x")
    assert result.returncode == 0, result.stderr
    assert re.search(r"> ~/logs/x\.worker\$W\.log", result.stdout)
