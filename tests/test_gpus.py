"""``ablate run --gpus`` on a machine without CUDA (device counts mocked): parsing, refusals in
one line, how workers are dealt to GPUs and how many share one, the memory probe (run on the
CPU), workers started with their CUDA_VISIBLE_DEVICES; and benchmarks/gpu.py's machinery on
the CPU (its child processes, barrier, table); benchmarks/reference.py's refusals and data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ablate.commands import gpus, workers
from ablate.commands.gpus import CONTEXT_MB, Footprint, GpuPlan, plan_gpus
from ablate.errors import AblateError
from ablate.study.load import load_study

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu as bench  # noqa: E402  (benchmarks/gpu.py)
import reference  # noqa: E402  (benchmarks/reference.py)
import stacked  # noqa: E402  (benchmarks/stacked.py)

FAST_REPORT = {"report": {"calibration": 0, "bootstrap": 200}}


@pytest.fixture
def cuda_devices(monkeypatch):
    """``cuda_devices(n)``: this process sees n GPUs (none of them real)."""

    def have(n: int) -> None:
        monkeypatch.setattr(gpus, "cuda_device_count", lambda: n)

    monkeypatch.delenv(gpus.VISIBLE, raising=False)
    return have


def test_parse_gpus():
    assert gpus.parse_gpus("all") is None and gpus.parse_gpus(" ALL ") is None
    assert gpus.parse_gpus("2") == 2
    for bad in ("0", "-1", "two", ""):
        with pytest.raises(AblateError, match="expected 'all' or a number of GPUs ≥ 1"):
            gpus.parse_gpus(bad)


def test_device_names_follow_the_parents_visible_devices(monkeypatch):
    monkeypatch.delenv(gpus.VISIBLE, raising=False)
    assert gpus.device_names(3) == ("0", "1", "2")
    monkeypatch.setenv(gpus.VISIBLE, "4, 6,GPU-abc")  # the child must name what the parent sees
    assert gpus.device_names(2) == ("4", "6") and gpus.device_names(3) == ("4", "6", "GPU-abc")


def test_workers_are_dealt_to_gpus_in_turn_with_a_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plan = GpuPlan(("0", "1"), workers=5)
    assert [plan.env(i)[gpus.VISIBLE] for i in range(5)] == ["0", "1", "0", "1", "0"]
    assert plan.per_gpu == 3 and plan.env(0)["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's setting stands
    assert "OMP_NUM_THREADS" not in plan.env(0)
    assert (
        plan.describe()
        == "gpus: 5 workers, up to 3 trial(s) at once on each of 2 GPUs (CUDA_VISIBLE_DEVICES=0,1)"
    )


def test_trials_that_fit_in_free_memory():
    # 0.85 × (9,400 + 600) MiB free / (400 + 600) MiB a trial → 8
    assert Footprint(peak_mb=400, free_mb=9_400, total_mb=10_240).fitting() == 8
    assert Footprint(peak_mb=80_000, free_mb=9_400, total_mb=10_240).fitting() == 1  # never 0
    plan = GpuPlan(("0",), 8, Footprint(400, 9_400, 10_240))
    assert plan.describe().endswith(
        f"on 1 GPU (CUDA_VISIBLE_DEVICES=0); measured: a trial peaks at 400 MiB + {CONTEXT_MB} MiB "
        f"of CUDA context, 9,400 of 10,240 MiB free"
    )


def test_plans_and_refusals(write_study, cuda_devices, monkeypatch):
    study = load_study(write_study())  # 2 variants × 2 seeds
    cuda_devices(0)
    with pytest.raises(AblateError, match=r"--gpus all: no CUDA device is visible here \(torch .*unset\)"):
        plan_gpus(study, "all", None, 1)
    cuda_devices(2)
    with pytest.raises(AblateError, match=r"--gpus 3: only 2 CUDA device\(s\) visible here"):
        plan_gpus(study, "3", None, 1)
    with pytest.raises(AblateError, match="--per-gpu needs --gpus all|N"):
        plan_gpus(study, None, 2, 1)
    with pytest.raises(AblateError, match="give one of --workers and --per-gpu"):
        plan_gpus(study, "all", 2, 3)
    assert plan_gpus(study, "all", 2, 1) == GpuPlan(("0", "1"), 4)
    assert plan_gpus(study, "all", 2, 4) == GpuPlan(("0", "1"), 4)
    assert plan_gpus(study, "1", None, 3) == GpuPlan(("0",), 3)  # --workers dealt as asked
    for device in ("cpu", "cuda:1"):
        with pytest.raises(AblateError, match=f"--gpus needs train.device auto or cuda .*'{device}'"):
            plan_gpus(load_study(write_study({"train": {"device": device}})), "all", None, 1)


def test_measured_plan_is_capped_by_cores_and_trials(write_study, cuda_devices, monkeypatch):
    study = load_study(write_study())  # 4 trials
    cuda_devices(2)
    probed = []
    monkeypatch.setattr(
        gpus, "probe", lambda s, device: probed.append(device) or Footprint(100, 70_000, 81_000)
    )
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    plan = plan_gpus(study, "all", None, 1)
    assert probed == ["0"] and plan.footprint is not None
    assert plan.workers == 4 and plan.per_gpu == 2  # 4 trials over 2 GPUs, though ~85 would fit
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    bigger = load_study(write_study({"seeds": list(range(10))}))
    assert plan_gpus(bigger, "all", None, 1).per_gpu == 1  # one core per GPU


def test_probe_measures_a_trial_on_the_cpu(write_study, capsys):
    study = load_study(write_study())
    assert gpus.measure_peak_mb(study, torch.device("cpu")) > 0
    gpus.main([str(study.path), "train.batch_size=32"])
    measured = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert measured["peak_mb"] > 0 and measured["free_mb"] == 0  # no GPU: nothing free to pack


@pytest.mark.heavy
def test_probe_runs_in_a_child_process(write_study):
    footprint = gpus.probe(load_study(write_study()), "0")
    assert footprint.peak_mb > 0 and footprint.fitting() == 1


def test_probe_failure_is_one_line(write_study):
    broken = load_study(write_study())
    broken.path.write_text("not: [a study")  # the child cannot read it
    with pytest.raises(
        AblateError, match=r"--gpus: the memory probe failed \(error: .*study.yaml.*\); give --per-gpu K"
    ):
        gpus.probe(broken, "0")


def test_run_refuses_gpus_in_one_line(write_study, cli, cuda_devices):
    study = write_study()
    cuda_devices(0)
    for args, expected in (
        (("--gpus", "all"), "error: --gpus all: no CUDA device is visible here"),
        (("--gpus", "two"), "error: --gpus two: expected 'all' or a number of GPUs ≥ 1"),
        (("--per-gpu", "2"), "error: --per-gpu needs --gpus all|N"),
    ):
        code, _, err = cli("run", study, *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith(expected), err
        assert "Traceback" not in err
    cuda_devices(1)
    code, _, err = cli("run", study, "--gpus", "2")
    assert code == 2 and err.strip() == "error: --gpus 2: only 1 CUDA device(s) visible here"


@pytest.mark.heavy
def test_run_starts_each_worker_with_its_gpu(write_study, cli, cuda_devices, monkeypatch, tmp_path):
    """Two (pretend) GPUs, one trial each at a time: the workers get CUDA_VISIBLE_DEVICES 0 and 1
    (and, here without CUDA, train on the CPU) and the study completes."""
    cuda_devices(2)
    seen = []
    real_popen = subprocess.Popen

    def spy(cmd, *args, env=None, **kwargs):
        if "worker" in cmd:
            seen.append(env[gpus.VISIBLE])
        return real_popen(cmd, *args, env=env, **kwargs)

    monkeypatch.setattr(workers.subprocess, "Popen", spy)
    study = write_study({"train": {"epochs": 1}, **FAST_REPORT})
    code, _, err = cli("run", study, "--gpus", "all", "--per-gpu", "1", "--reports", tmp_path / "reports")
    assert code == 0, err
    assert sorted(seen) == ["0", "1"]
    assert "gpus: 2 workers, up to 1 trial(s) at once on each of 2 GPUs (CUDA_VISIBLE_DEVICES=0,1)" in err
    code, out, _ = cli("status", study)
    assert "4/4 trials done" in out


# -- benchmarks/gpu.py ---------------------------------------------------------------------------


def test_gpu_benchmark_says_so_without_cuda(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--steps", "1"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"benchmarks/gpu.py: no CUDA device here (torch {torch.__version__}); nothing measured"]


def test_gpu_benchmark_configs_are_the_studies():
    for config in bench.CONFIGS.values():
        assert config.variant in load_study(config.study, check_files=False).variants


def test_gpu_benchmark_steps_and_table(write_study):
    study = load_study(write_study())
    row = bench.train_steps(study, "mlp", steps=2, warmup=1, device=torch.device("cpu"))
    assert row["step_s"] > 0 and row["tokens_per_s"] > 0 and row["steps_per_epoch"] == 2
    assert row["epochs"] == 2 and row["precision"] == "fp32"
    trials = [dict(row, step_s=0.1), dict(row, step_s=0.3)]
    two = bench.summarise("sasrec", 2, trials)
    one = bench.summarise("sasrec", 1, [dict(row, step_s=0.1)])
    assert two["step_s"] == pytest.approx(0.2) and two["epoch_s"] == pytest.approx(0.4)
    assert one["seeds_per_hour"] == pytest.approx(3600 / (0.2 * 2))
    assert [r["speedup"] for r in bench.with_speedups([one, two])] == [1.0, pytest.approx(1.0)]
    text = bench.table([one, two], steps=2, warmup=1)
    assert text.startswith(bench.SECTION)
    assert "| SASRec, ML-1M SASRec format, BCE 1 neg | fp32 | processes | 2 |" in text


@pytest.mark.heavy
def test_gpu_benchmark_runs_k_processes_together_on_the_cpu(write_study, capsys):
    """The whole machinery (k child processes, the ready/go barrier, the JSON they print) on the
    CPU, ``--packed``: the k seeds as one pack in one process, and ``--override``: set in every
    trial, said in every row."""
    path = write_study({"name": "bench"}, name="bench.yaml")
    args = ["--device", "cpu", "--study", str(path), "--k", "1", "2", "--steps", "2", "--warmup", "1"]
    assert bench.main([*args, "--packed", "--override", "train.lr=0.01"]) == 0
    out = capsys.readouterr().out
    for k in (1, 2):
        assert f"| bench | fp32 | processes; train.lr=0.01 | {k} |" in out
    assert re.search(r"\| bench \| fp32 \| one pack, (streams|turns); train.lr=0.01 \| 2 \|", out)
    assert "| 1.00× |" in out


def test_gpu_benchmark_packed_steps_every_member(write_study):
    study = load_study(write_study())
    row = bench.packed_steps(study, "mlp", k=2, steps=2, warmup=1, device=torch.device("cpu"))
    assert row["step_s"] > 0 and row["tokens_per_s"] > 0 and row["steps_per_epoch"] == 2
    assert row["stepped"] in ("streams", "turns")  # stacked on a GPU only


def test_stacked_members_have_their_gradients_alone_and_the_probe_times_them(write_study, capsys):
    """benchmarks/stacked.py: k members stacked under vmap(grad) get, each, the gradient it has
    alone (float64, dropout on, each member's own keys), and the probe times the stacked step
    beside a trial alone."""
    # jagged: false: fbgemm's jagged ops are C++ autograd functions, which vmap cannot enter.
    path = write_study({"name": "stack", "task": {"jagged": False}}, name="stack.yaml")
    args = ["--device", "cpu", "--study", str(path), "--k", "1", "3", "--steps", "1", "--reps", "1"]
    assert stacked.main([*args, "--threads", "1", "--exact", "3", "--no-write"]) == 0
    out = capsys.readouterr().out
    exact = out.split("dropout keys a step; largest relative difference")[0].split("members): ")[-1]
    worst = float(out.split("the member's own, ")[1].split(" ")[0])
    other = float(out.split("another member's keys: ")[1].split(")")[0])
    assert int(exact) > 0 and worst < 1e-12  # dropout drawn, each member's own draws kept
    assert other > 1e-6  # another member's keys give another gradient
    assert "| one trial alone (`Trainer.step`) | 1 |" in out
    assert "| stacked, `vmap(grad)` + one Adam | 3 |" in out
    # The product's step: warm-up + 1 step, stacked where the members' batches have one shape.
    row = r"\| product's stacked step \(`Stacker.step`; stacked (\d), in turns (\d)\) \| 3 \|"
    counts = re.search(row, out)
    assert counts and int(counts[1]) + int(counts[2]) == 2
    # One validation of 3 members: member 0's forwards stacked, the two others' shared, none their own.
    shared = re.search(r"\| 3 \| [\d.]+ \| [\d.]+ \| [\d.]+× \| (\d+) / (\d+) / (\d+) \|", out)
    assert shared and int(shared[1]) > 0 and int(shared[2]) == 2 * int(shared[1]) and shared[3] == "0"


# -- benchmarks/reference.py (the reference code bases live outside the repository) -------------


def test_reference_benchmark_says_so_when_the_path_is_absent_or_foreign(tmp_path, capsys):
    assert reference.main([str(tmp_path / "nowhere")]) == 2
    assert reference.main([str(tmp_path)]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        f"benchmarks/reference.py: {tmp_path / 'nowhere'} does not exist: give the path"
    )
    assert lines[1].startswith(f"benchmarks/reference.py: {tmp_path} holds no model.py")


def test_reference_benchmark_recognises_each_code_base(tmp_path):
    sasrec = tmp_path / "SASRec.pytorch" / "python"
    sasrec.mkdir(parents=True)
    (sasrec / "model.py").touch()
    (sasrec / "utils.py").touch()
    assert reference.locate(sasrec.parent) == (reference.SASREC_PYTORCH, sasrec)
    assert reference.locate(sasrec) == (reference.SASREC_PYTORCH, sasrec)
    for name, marker in reference.MARKERS.items():
        root = tmp_path / name
        (root / marker).parent.mkdir(parents=True)
        (root / marker).touch()
        assert reference.locate(root) == (name, root)


def test_reference_benchmark_reads_the_authors_settings_and_writes_their_table(tmp_path):
    gin = tmp_path / "model.gin"
    gin.write_text(
        "# comment\ntrain_fn.max_sequence_length = 200\ntrain_fn.temperature = 0.05\n"
        'train_fn.main_module = "HSTU"\ntrain_fn.item_l2_norm = True\nhstu_encoder.dqk = 50\n'
    )
    assert reference.train_fn_settings(gin) == {
        "max_sequence_length": 200,
        "temperature": 0.05,
        "main_module": "HSTU",
        "item_l2_norm": True,
    }
    ratings = tmp_path / "ratings.dat"
    ratings.write_text("2::10::5::300\n1::7::3::200\n1::8::4::100\n1::9::4::200\n")
    table = reference.sequence_table(ratings, tmp_path).read_text().splitlines()
    assert table == [
        "user_id,sequence_item_ids,sequence_ratings,sequence_timestamps",
        '1,"8,7,9","4,3,4","100,200,200"',  # ties in time in file order
        "2,10,5,300",
    ]


class FirstStep(BaseException):
    """Stops a trial right after its first training step (not an Exception: nothing catches it)."""


def test_the_probe_takes_the_step_a_trial_takes(write_study, monkeypatch):
    """The GPU probe's step is the trial's (ablate.training.trainer.Trainer): the same weights after it, with
    the study's optimiser, betas, weight decay, parameter groups, clipping and micro-batches — all
    away from torch's defaults here, so a probe building its own Adam would differ."""
    from ablate.training import trainer as train

    study = load_study(
        write_study(
            {
                "model": {"dropout": 0.0},
                "train": {
                    "optimizer": "adamw",
                    "betas": [0.8, 0.9],
                    "weight_decay": 0.1,
                    "lr": 0.05,
                    "grad_clip": 0.01,
                    "micro_batches": 2,
                    "param_groups": [{"params": "^items\\.", "lr": 0.2}],
                },
            }
        )
    )
    data = study.task.load()
    probed = gpus.probe_step(study, "base", data, torch.device("cpu"))

    stepped = {}
    real_step = train.Trainer.step

    def first_step(self, batch):
        real_step(self, batch)
        stepped.update({k: v.clone() for k, v in self.model.state_dict().items()})
        raise FirstStep

    monkeypatch.setattr(train.Trainer, "step", first_step)
    with pytest.raises(FirstStep):
        train.train_trial(study, study.variants["base"], 0, data, torch.device("cpu"))
    initial = train.Trainer.start(
        study, study.variants["base"], 0, data, torch.device("cpu")
    ).model.state_dict()
    assert stepped.keys() == probed.model.state_dict().keys()
    for name, value in probed.model.state_dict().items():
        assert torch.equal(value, stepped[name]), name
    assert any(not torch.equal(initial[n], stepped[n]) for n in initial)  # a step was taken
    group_lrs = sorted(g["lr"] for g in probed.optimizer.param_groups)
    assert group_lrs == [0.05, 0.2] and probed.optimizer.param_groups[0]["betas"] == (0.8, 0.9)
