"""Sweeps on a local Ray cluster: byte-identical to one process; killed workers and a killed
driver resume to the identical file; actors land on (logical) GPUs one each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")


from tl_reward import HookedRewardModel  # noqa: E402
from tl_reward.scale import SweepJob, run_sweeps  # noqa: E402
from tl_reward.sweep.store import parts_dir  # noqa: E402
from tl_reward.sweep.vocab_sweep import score_vocabulary  # noqa: E402
from tl_reward.testing.tiny import save_tiny_reward_model  # noqa: E402

PROMPTS = {"best": "What is best?", "worst": "What is worst?"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rms")
    return {a: save_tiny_reward_model(root / a, a, seed=3) for a in ("llama", "qwen2")}


def reference(model_dir: Path, out: Path, **kw) -> bytes:
    """The single-process sweep with the workers' thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = HookedRewardModel.from_pretrained(str(model_dir), device="cpu")
        score_vocabulary(model, PROMPTS, output=out, progress=False, **kw)
    finally:
        torch.set_num_threads(threads)
    return out.read_bytes()


def test_ray_equals_single_process_one_model_per_gpu(pool, saved, tmp_path: Path) -> None:
    jobs = [SweepJob(str(saved[a]), tmp_path / f"{a}.parquet", PROMPTS, batch_size=24)
            for a in ("llama", "qwen2")]
    refs = [reference(saved[a], tmp_path / f"ref_{a}.parquet", batch_size=24)
            for a in ("llama", "qwen2")]
    infos = ray.get([a.info.remote() for a in pool.actors])  # two logical GPUs, one actor each
    assert len(infos) == 2 and sorted(len(i["gpu_ids"]) for i in infos) == [1, 1]
    assert infos[0]["gpu_ids"] != infos[1]["gpu_ids"] and infos[0]["pid"] != infos[1]["pid"]
    assert all(i["device"] == ("cuda" if torch.cuda.is_available() else "cpu") for i in infos)
    run_sweeps(jobs, pool, unit_chunks=2, progress=False)
    assert [j.output.read_bytes() for j in jobs] == refs
    assert refs[0] != refs[1]  # different models: the comparison can fail


def test_killed_worker_resumes_to_identical_file(pool, saved, tmp_path: Path) -> None:
    ref = reference(saved["llama"], tmp_path / "ref.parquet", batch_size=16, shard=(0, 2))
    job = SweepJob(str(saved["llama"]), tmp_path / "out.parquet", PROMPTS, batch_size=16,
                   shard=(0, 2))
    marker = tmp_path / "crashes"
    marker.mkdir()
    # each of the session's actors exits (os._exit) halfway through its second unit from
    # now; Ray restarts it and retries
    before = {ray.get(a.info.remote())["pid"] for a in pool.actors}
    pool.arm_crash(2, str(marker))
    written: list[int] = []
    run_sweeps([job], pool, unit_chunks=2, progress=False,
               callback=lambda j, c: written.append(c))
    assert len(list(marker.iterdir())) == 2  # both workers really died mid-unit
    assert {int(f.name.split("-")[1]) for f in marker.iterdir()} == before
    assert not before & {ray.get(a.info.remote())["pid"] for a in pool.actors}  # restarted
    assert job.output.read_bytes() == ref
    assert sorted(written) == list(range(len(written)))  # every chunk written exactly once


DRIVER = """
import os, signal, sys
import ray
from tl_reward.scale import RayExecutor, SweepJob, run_sweeps
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
job = SweepJob(sys.argv[2], sys.argv[3], {"best": "What is best?", "worst": "What is worst?"},
               batch_size=16)
count = []
def die(job, chunk):
    count.append(chunk)
    if len(count) == 4:
        os.kill(os.getpid(), signal.SIGKILL)
run_sweeps([job], RayExecutor(num_workers=1, num_cpus=0.5, threads=1), unit_chunks=2,
           progress=False, callback=die)
"""


def test_killed_driver_resumes_to_identical_file(cluster, pool, saved, tmp_path: Path) -> None:
    ref = reference(saved["qwen2"], tmp_path / "ref.parquet", batch_size=16)
    out = tmp_path / "out.parquet"
    proc = subprocess.run([sys.executable, "-c", DRIVER, cluster, str(saved["qwen2"]), str(out)],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not out.exists()
    assert len(list(parts_dir(out).glob("chunk-*.parquet"))) == 4  # finished chunks kept
    assert not list(parts_dir(out).glob("*.tmp"))
    job = SweepJob(str(saved["qwen2"]), out, PROMPTS, batch_size=16)
    run_sweeps([job], pool, progress=False)  # resumed here, on the running actors
    assert out.read_bytes() == ref


def test_cli_sweep_on_ray(cluster, saved, tmp_path: Path, capsys) -> None:
    from tl_reward.cli import main

    threads = torch.get_num_threads()  # --threads sets this process's threads too
    args = ["sweep", "--model", str(saved["llama"]), "--output", str(tmp_path / "cli.parquet"),
            "--prompt", "What is best?", "--prompt", "What is worst?", "--label", "best",
            "--label", "worst", "--batch-size", "16", "--id-range", "0:200", "--top", "2",
            "--ray", "--workers", "1", "--cpus-per-worker", "0.5", "--threads", "1"]
    try:
        assert main(args) == 0
    finally:
        torch.set_num_threads(threads)
    assert "(Ray)" in capsys.readouterr().out
    ref = reference(saved["llama"], tmp_path / "ref.parquet", batch_size=16, id_range=(0, 200))
    assert (tmp_path / "cli.parquet").read_bytes() == ref
    assert main(args) == 1
    assert "pass --resume" in capsys.readouterr().err
    torch.set_num_threads(threads)
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--ray" in capsys.readouterr().out
