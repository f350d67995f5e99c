"""The slurm/ batch scripts on a real local Slurm: data prep as an array plus merge, DDP training with requeue, export.

One cluster (``scripts/slurm_local.sh``) serves the module; Slurm is installed with apt-get when missing, and
the module is skipped only where that cannot be done. Training uses the tiny random Qwen3 decoder, two srun
tasks on one node (gloo on CPU); the requeue signal is the one ``--signal=SIGUSR1@90`` sends before the limit,
and the export job waits on the training job (afterok) as it would on a cluster.
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from qgmem_train.config import BUNDLED_EMBEDDER
from tests.slurm_cluster import ROOT, LocalSlurm, SlurmUnavailable
from tests.stack_watchdog import Stalled, pids_with_env
from tests.test_data_prep_run import make_config, rows
from tests.tiny_decoder import FIXTURE, fixture_corpus, publish_to_hub_cache, save_tiny_decoder, tiny_module_kwargs

MAX_STEPS = 8
SIGNAL_AFTER_STEP = 4
"""The signal goes out once rank 0 has finished step 5 (after one epoch of 4 steps, so last.ckpt is older than the signal's
checkpoint); ranks sleep up to a second a step, so it lands before the second epoch's last step (step 8)."""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slurm")


@pytest.fixture(scope="module")
def slurm(scratch: Path):
    cluster = LocalSlurm(scratch / "cluster")
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(f"no local Slurm: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def job_env(**extra: str) -> dict[str, str]:
    return {"PYTHON": sys.executable, **extra}


BAD_SUBMISSIONS = {
    "shards not a number": (["slurm/submit_data_prep.sh", "configs/data_prep/demo-cpu.yaml", "two"], {}, "SHARDS must be a positive integer"),
    "missing data-prep config": (["slurm/submit_data_prep.sh", "nope.yaml", "2"], {}, "nope.yaml: no such config file"),
    "array not from 0": (
        ["slurm/data_prep_shard.sbatch"],
        {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_TASK_COUNT": "2"},
        "the array must be 0-1",
    ),
    "--ntasks, not --ntasks-per-node": (["slurm/train.sbatch"], {"SLURM_NNODES": "1", "SLURM_NTASKS": "2"}, "--ntasks-per-node"),
    "GPUs differ from tasks": (
        ["slurm/train.sbatch"], {"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "4"}, "4 GPUs per node but",
    ),
    "--gpus-per-task": (
        ["slurm/train.sbatch"], {"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_TASK": "1"},
        "--gpus-per-task gives each task one GPU",
    ),
    "--gpu-bind": (
        ["slurm/train.sbatch"], {"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "2", "SLURM_GPU_BIND": "single:1"},
        "--gpu-bind=single:1 (SLURM_GPU_BIND) changes",
    ),
    "missing training config": (["slurm/train.sbatch", "nope.yaml"], {"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2"}, "nope.yaml"),
    "submit_train.sh: missing config": (["slurm/submit_train.sh", "--partition=gpu", "nope.yaml"], {}, "nope.yaml: no such config file"),
    "missing resume checkpoint": (
        ["slurm/train.sbatch", "configs/demo-cpu.yaml"], {"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "RESUME": "nope.ckpt"},
        "RESUME=nope.ckpt: no such checkpoint",
    ),
}  # fmt: skip


FAKE_SLURM_COMMAND = """
# Test stand-in for srun/sbatch: records its name, arguments and GPU-binding variables, one JSON line a call.
import json, os, sys
record = {
    "command": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k in ("SLURM_GPU_BIND", "SLURM_GPUS_PER_TASK", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE",
                                                         "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM")},
}
with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
sys.exit(int(os.environ.get("FAKE_SLURM_EXIT", "0")))
"""


def fake_slurm_env(folder: Path, exit_code: int = 0, **extra: str) -> dict[str, str]:
    """An environment without the caller's Slurm variables whose ``srun`` and ``sbatch`` only record their calls."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("srun", "sbatch"):
        (bin_dir / name).write_text(f"#!{sys.executable}{FAKE_SLURM_COMMAND}")
        (bin_dir / name).chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    return {
        **clean, "PATH": f"{bin_dir}:{clean.get('PATH', '')}", "FAKE_SLURM_LOG": str(folder / "calls.jsonl"),
        "FAKE_SLURM_EXIT": str(exit_code), **extra,
    }  # fmt: skip


def fake_slurm_calls(folder: Path) -> list[dict]:
    log = folder / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("case", BAD_SUBMISSIONS)
def test_scripts_refuse_bad_input_with_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    """Checked before anything is queued or started: ``srun`` and ``sbatch`` are stand-ins that must not be called."""
    args, env, message = BAD_SUBMISSIONS[case]
    result = subprocess.run(["bash", *args], env=fake_slurm_env(tmp_path, exit_code=97, **env), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr, fake_slurm_calls(tmp_path))
    assert message in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert fake_slurm_calls(tmp_path) == []


@pytest.mark.parametrize("gpus", ["2", None])
def test_train_srun_leaves_every_task_all_gpus_of_its_node(tmp_path: Path, gpus: str | None) -> None:
    """One srun task per GPU, none bound to a GPU: each task sees the step's GPUs and picks ``cuda:$SLURM_LOCALID``.

    Slurm gives every task of a step all the step's GPUs unless asked to bind (``--gpu-bind``, ``--gpus-per-task``,
    or their ``SLURM_GPU_BIND``/``SLURM_GPUS_PER_TASK`` variables): the launch line must carry none of them.
    """
    slurm = {"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7"}
    if gpus:
        slurm.update(SLURM_GPUS_ON_NODE=gpus, CUDA_VISIBLE_DEVICES="0,1")
    env = fake_slurm_env(tmp_path, RUN_DIR=str(tmp_path / "run"), RESUME="none", PYTHON="python3", **slurm)
    result = subprocess.run(["bash", "slurm/train.sbatch", "configs/demo-cpu.yaml"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (call,) = fake_slurm_calls(tmp_path)
    assert call["command"] == "srun"
    launcher = call["argv"][: call["argv"].index("python3")]
    assert not [a for a in launcher if a.startswith(("--gpu", "--gres", "--tres-bind"))], launcher
    assert call["argv"][call["argv"].index("--trainer.devices") + 1] == "2"
    assert "SLURM_GPU_BIND" not in call["env"] and "SLURM_GPUS_PER_TASK" not in call["env"]
    if gpus:
        assert f"{gpus} GPUs per node, each task sees all of them (CUDA_VISIBLE_DEVICES=0,1)" in result.stdout


@pytest.mark.parametrize(("cpus_per_task", "cpus_on_node", "expected"), [("8", "64", "8"), (None, "64", "32"), (None, None, "1")])
def test_train_srun_gives_each_task_its_share_of_the_nodes_cpus(tmp_path: Path, cpus_per_task: str | None, cpus_on_node: str | None, expected: str) -> None:
    """From Slurm 22.05 srun does not inherit ``--cpus-per-task`` from sbatch: the launch line passes it on, and without
    one the node's CPUs (``SLURM_CPUS_ON_NODE`` of the whole-node allocation) are shared by its tasks, not a fixed 8."""
    slurm = {"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7"}
    if cpus_per_task:
        slurm["SLURM_CPUS_PER_TASK"] = cpus_per_task
    if cpus_on_node:
        slurm["SLURM_CPUS_ON_NODE"] = cpus_on_node
    env = fake_slurm_env(tmp_path, RUN_DIR=str(tmp_path / "run"), RESUME="none", PYTHON="python3", **slurm)
    env.pop("OMP_NUM_THREADS", None)
    result = subprocess.run(["bash", "slurm/train.sbatch", "configs/demo-cpu.yaml"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (call,) = fake_slurm_calls(tmp_path)
    launcher = call["argv"][: call["argv"].index("python3")]
    assert [a for a in launcher if a.startswith("--cpus-per-task")] == [f"--cpus-per-task={expected}"], launcher
    assert f"{expected} CPUs a task" in result.stdout


def test_train_sbatch_takes_whole_nodes_and_dumps_stacks_on_a_fault() -> None:
    """No fixed cores or memory a task: the node's memory (--mem=0) and CPUs (--exclusive); stacks on a fatal signal."""
    script = (ROOT / "slurm" / "train.sbatch").read_text()
    directives = [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "--mem=0" in directives and "--exclusive" in directives
    assert not [d for d in directives if d.startswith("--cpus-per-task")], directives
    assert "export PYTHONFAULTHANDLER=${PYTHONFAULTHANDLER:-1}" in script


def test_submit_train_makes_the_log_folder_before_sbatch_opens_it(tmp_path: Path) -> None:
    """sbatch opens ``--output`` before the job's script runs: the wrapper makes the folder and points the log there."""
    logs = tmp_path / "job-logs"
    env = fake_slurm_env(tmp_path, LOG_DIR=str(logs))
    result = subprocess.run(
        ["bash", "slurm/submit_train.sh", "--partition=gpu", "configs/demo-cpu.yaml", "--trainer.max_steps", "5"], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert logs.is_dir()
    (call,) = fake_slurm_calls(tmp_path)
    assert call["command"] == "sbatch"
    assert call["argv"][:3] == ["--parsable", f"--output={logs}/%x-%j.out", "--partition=gpu"]
    assert call["argv"][3].endswith("slurm/train.sbatch") and call["argv"][4:] == ["configs/demo-cpu.yaml", "--trainer.max_steps", "5"]


@pytest.mark.parametrize(("config", "fetched"), [("configs/demo-cpu.yaml", False), ("configs/qwen3-8b.yaml", True)])
def test_train_fetches_hub_models_once_then_runs_the_ranks_offline(tmp_path: Path, config: str, fetched: bool) -> None:
    """Hub ids are fetched by one single-task step before the ranks start (not by each of 16 ranks); the ranks then run
    with HF_HUB_OFFLINE=1, as they do for bundled or local-path models, and with single-threaded tokenizers."""
    slurm = {"SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7"}
    env = fake_slurm_env(tmp_path, RUN_DIR=str(tmp_path / "run"), RESUME="none", PYTHON=sys.executable, **slurm)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM"):
        env.pop(name, None)
    result = subprocess.run(["bash", "slurm/train.sbatch", config], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    *fetch, train = fake_slurm_calls(tmp_path)
    if fetched:
        (step,) = fetch
        assert step["argv"][:2] == ["--nodes=1", "--ntasks=1"] and step["argv"][-3:] == ["qgmem_train", "fetch", config], step
        assert "HF_HUB_OFFLINE" not in step["env"], "the fetch step reaches the hub"
    else:
        assert fetch == [], "bundled models need no fetch step"
    assert "fit" in train["argv"] and train["env"].get("TOKENIZERS_PARALLELISM") == "false"
    assert {k: v for k, v in train["env"].items() if k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")} == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_stopping_the_cluster_ends_the_jobs_it_still_runs(tmp_path: Path) -> None:
    """A test that times out leaves its job running; stopping the cluster must end the job's processes too, not only the
    daemons (a job's step keeps running without slurmd)."""
    cluster = LocalSlurm(tmp_path / "cluster")
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(f"no local Slurm: {exc}")
    marker = tmp_path / "pid"
    try:
        job = cluster.run("sbatch", "--parsable", f"--output={tmp_path}/%j.out", "--wrap", f"sleep 600 & echo $! > {marker}; wait").strip()
        cluster.wait_for(lambda: marker.exists() and marker.read_text().strip() != "", job, timeout=120)
        pid = int(marker.read_text())
        assert Path(f"/proc/{pid}").exists()
    finally:
        cluster.stop()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = Path(f"/proc/{pid}").exists()
    if alive:
        os.kill(pid, 9)
    assert not alive, "the job's process outlived the cluster"


def python_tasks(job: str) -> list[int]:
    """The job's processes that run this interpreter (its srun tasks, not the batch script or srun itself)."""
    tasks = []
    for pid in pids_with_env("SLURM_JOB_ID", job):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == sys.executable.encode():
                tasks.append(pid)
        except OSError:  # ended meanwhile
            pass
    return tasks


def test_a_stalled_job_fails_its_wait_with_the_stacks_of_its_tasks(tmp_path: Path) -> None:
    """The watchdog of the training test, on a job whose two tasks block: their Python stacks are dumped, then the wait fails."""
    cluster = LocalSlurm(tmp_path / "cluster")
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(f"no local Slurm: {exc}")
    stuck = "import time\ndef job_task_stuck_here():\n    time.sleep(600)\njob_task_stuck_here()"
    output = tmp_path / "job.out"
    try:
        job = cluster.run(
            "sbatch", "--parsable", "--ntasks=2", "--cpus-per-task=1", f"--output={output}", "--wrap", f"srun {sys.executable} -c '{stuck}'"
        ).strip()
        cluster.wait_for(lambda: len(python_tasks(job)) == 2, job, timeout=120)
        watchdog = cluster.watchdog(job, [output], stall_s=2.0)
        with pytest.raises(Stalled, match=f"job {job} made no progress for 2 s"):
            cluster.wait(job, timeout=120, watchdog=watchdog)
    finally:
        cluster.stop()
    dump = (tmp_path / "cluster" / f"stacks-{job}.txt").read_text()
    assert dump.count("job_task_stuck_here (<string>:3)") == 2, dump


@pytest.mark.slow
def test_data_prep_array_and_merge_equal_one_process(slurm: LocalSlurm, scratch: Path) -> None:
    one = make_config(scratch, "one")
    sharded = make_config(scratch, "sharded")
    reference = subprocess.Popen([sys.executable, "-m", "data_prep", "--config", str(one)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
    logs = scratch / "logs"
    try:
        ids = slurm.run("bash", "slurm/submit_data_prep.sh", str(sharded), "2", "--cpus-per-task=1", env=job_env(LOG_DIR=str(logs)))
        array, merge = ids.split()
        merged = slurm.wait(merge, timeout=1200)
        shards = slurm.jobs(array)
        _, stderr = reference.communicate(timeout=1200)
    finally:
        if reference.poll() is None:
            reference.kill()
    assert [r["JobState"] for r in shards] == ["COMPLETED", "COMPLETED"], [(r["JobId"], r["JobState"]) for r in shards]
    assert merged["JobState"] == "COMPLETED", (logs / f"qgmem-data-prep-merge-{merge}.out").read_text()[-3000:]
    assert merged["StartTime"] >= max(r["EndTime"] for r in shards), "the merge must wait for every shard (afterok)"
    for task in (0, 1):
        assert f"data prep shard {task}/2" in (logs / f"qgmem-data-prep-{array}_{task}.out").read_text()
    assert reference.returncode == 0, stderr[-3000:]
    assert rows(scratch / "sharded") == rows(scratch / "one")


def training_config(scratch: Path, llm_dir: Path, run: Path, paced: bool = True) -> Path:
    """A fit YAML over the tiny decoder: 2 ranks x batch 1 = 4 steps per epoch, 2 loader workers, CSV metrics every step, ranks
    paced apart (``paced``; the pacing sleeps on its own random stream, so a run without it trains the same weights)."""
    model = {k: v for k, v in tiny_module_kwargs(llm_dir, 0, generation={"val_generate": False}).items() if k not in ("feature_dim", "llm")}
    raw = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "strategy": "ddp",
            "precision": "32-true",
            "max_steps": MAX_STEPS,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": [
                {
                    "class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": str(run), "name": "logs", "flush_logs_every_n_steps": 1},
                }
            ],
            "callbacks": [
                {"class_path": "tests.slurm_cluster.PaceSteps", "init_args": {"marker_dir": str(run / "steps"), "max_sleep": 1.0}}
            ] if paced else [],
        },
        "checkpoint": {"monitor": None, "filename": "step{step}"},
        "model": model,
        "data": {"path": str(FIXTURE), "batch_size": 1, "num_workers": 2},
        "pipeline": {"models": {"llm": str(llm_dir), "embedder": BUNDLED_EMBEDDER, "reranker": "none", "dtype": "float32", "device": "cpu"}},
    }
    path = scratch / f"train-{run.name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def global_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


def logged_steps(version: Path) -> list[int]:
    with (version / "metrics.csv").open() as f:
        return sorted({int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")})


def trainable_state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_training_is_requeued_by_sigusr1_resumes_to_max_steps_then_exports(slurm: LocalSlurm, scratch: Path) -> None:
    """SIGUSR1 to every process of the step (loader workers too) while the ranks run apart; the requeued job ends where an
    uninterrupted one does."""
    llm_dir = save_tiny_decoder(scratch / "tiny", fixture_corpus())
    run, straight, logs = scratch / "run", scratch / "straight", scratch / "logs"
    config = training_config(scratch, llm_dir, run)
    logs.mkdir(exist_ok=True)
    submit = ("sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1", f"--output={logs}/%x-%j.out")
    job = slurm.run(*submit, "slurm/train.sbatch", str(config), env=job_env(RUN_DIR=str(run))).strip()
    export = slurm.run(
        "sbatch", "--parsable", f"--dependency=afterok:{job}", "--cpus-per-task=1", f"--output={logs}/%x-%j.out",
        "slurm/export.sbatch", str(config), env=job_env(RUN_DIR=str(run), OUT=str(scratch / "export"), LLM_ID=publish_to_hub_cache(llm_dir)),
    ).strip()  # fmt: skip
    log = logs / f"qgmem-train-{job}.out"
    rank0 = run / "steps" / "rank0"
    watchdog = slurm.watchdog(job, [run, log])  # a stall dumps the stacks of the ranks and their loader workers
    slurm.wait_for(lambda: rank0.exists() and int(rank0.read_text() or 0) > SIGNAL_AFTER_STEP, job, timeout=900, watchdog=watchdog)
    time.sleep(random.uniform(0, 0.4))
    slurm.run("scancel", "--signal=USR1", job)
    final = slurm.wait(job, timeout=900, watchdog=watchdog)
    text = log.read_text()
    assert final["JobState"] == "COMPLETED", text[-4000:]
    assert final["Restarts"] == "1"
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in text
    assert "distributed_backend=gloo" in text
    assert text.count(f"Requeued SLURM job: {job}") == 1, "one requeue, from rank 0 of the training processes only"
    hpc = run / "hpc_ckpt_1.ckpt"
    saved_at = global_step(hpc)
    assert SIGNAL_AFTER_STEP < saved_at < MAX_STEPS, "saved at a step boundary inside the second epoch"
    assert f"restart 1, run dir {run}, resume from {hpc}" in text
    assert global_step(run / "ckpt" / "last.ckpt") == MAX_STEPS
    first, second = logged_steps(run / "logs" / "version_0"), logged_steps(run / "logs" / "version_1")
    assert max(first) < saved_at <= min(second) and max(second) < MAX_STEPS, (first, second)
    assert not list(run.glob("hpc_ckpt_2.ckpt")), "only one requeue was asked for"
    assert os.path.getmtime(hpc) < os.path.getmtime(run / "ckpt" / "last.ckpt")

    straight_config = training_config(scratch, llm_dir, straight, paced=False)  # the uninterrupted run needs no pacing
    reference = slurm.run(*submit, "slurm/train.sbatch", str(straight_config), env=job_env(RUN_DIR=str(straight))).strip()
    reference_log = logs / f"qgmem-train-{reference}.out"
    reference_state = slurm.wait(reference, timeout=900, watchdog=slurm.watchdog(reference, [straight, reference_log]))
    assert reference_state["JobState"] == "COMPLETED", reference_log.read_text()[-3000:]
    resumed, uninterrupted = trainable_state(run / "ckpt" / "last.ckpt"), trainable_state(straight / "ckpt" / "last.ckpt")
    assert resumed.keys() == uninterrupted.keys()
    for name in resumed:
        torch.testing.assert_close(resumed[name], uninterrupted[name], msg=lambda m, name=name: f"{name}: {m}")

    exported = slurm.wait(export, timeout=600)
    export_log = (logs / f"qgmem-export-{export}.out").read_text()
    assert exported["JobState"] == "COMPLETED", export_log[-3000:]
    assert f"export {run / 'ckpt' / 'last.ckpt'}" in export_log
    assert {"graph_adapter.safetensors", "config.json", "README.md"} <= {p.name for p in (scratch / "export").iterdir()}


def test_fetch_lists_the_hub_models_of_a_config_and_its_overrides(tmp_path: Path) -> None:
    """What the fetch step fetches: Hub ids of the config as overridden; bundled and existing local models are left out."""
    from qgmem_train.llm.fetch import hub_models, model_settings

    overrides = ["--pipeline.models.llm=Qwen/Qwen3-0.6B", "--pipeline.models.llm_revision", "main", "--pipeline.models.embedder", str(tmp_path)]
    assert hub_models(model_settings("configs/qwen3-8b.yaml", [])) == [("Qwen/Qwen3-8B", None), ("BAAI/bge-base-en-v1.5", None)]
    assert hub_models(model_settings("configs/qwen3-8b.yaml", overrides)) == [("Qwen/Qwen3-0.6B", "main")]
    assert hub_models(model_settings("configs/demo-cpu.yaml", [])) == []


def test_fetch_refuses_at_once_in_one_line_when_the_hub_is_unreachable_and_nothing_is_cached(tmp_path: Path) -> None:
    """A compute node without network: one line and exit 2 from the probe, not the download's retries; a cached model
    needs no Hub (the probe is skipped)."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT)}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    fetch = [sys.executable, "-m", "qgmem_train", "fetch", "configs/demo-cpu.yaml"]
    result = subprocess.run([*fetch, "--pipeline.models.llm", "Qwen/Qwen3-8B"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: Qwen/Qwen3-8B: not in the Hugging Face cache") and "http://127.0.0.1:9" in line and "HF_HUB_OFFLINE=1" in line
    cached = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; from tests.tiny_decoder import *; print(publish_to_hub_cache(save_tiny_decoder(Path(sys.argv[1]), fixture_corpus())))",
         str(tmp_path / "tiny")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    ).stdout.strip()  # fmt: skip
    result = subprocess.run([*fetch, "--pipeline.models.llm", cached], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"{cached}: ")
