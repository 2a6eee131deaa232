"""The DDP training-step benchmark (bench/ddp_step.py, python -m fourd.bench.ddp): its command
line (serial), and a short real run on 2 ranks (a tiny model, 3 steps) whose parameters on
backend fourd and on gloo agree."""

import json
import math

import pytest

from fourd.bench import ddp
from mpirun import run_mpi


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--steps", "0"], "--steps"),
        (["--width", "0"], "--width"),
        (["--warmup", "-1"], "--warmup"),
        (["--settle", "-1"], "--settle"),
        (["--lr", "0"], "--lr"),
        (["--threads", "0"], "--threads"),
        (["--bucket-cap-mb", "-1"], "--bucket-cap-mb"),
        (["--rtol", "-1"], "--rtol"),
        (["--json", "/nonexistent-folder/x.json"], "does not exist"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_bad_arguments(argv, fragment):
    with pytest.raises(ddp.UsageError) as e:
        ddp.parse(argv)
    assert fragment in str(e.value), str(e.value)


def test_defaults_make_a_model_where_communication_matters():
    """33.6 M float32 parameters (134 MB of gradients a step), DDP's own bucket size; every
    model times its share of every block, after at most 150 settling steps."""
    cfg = ddp.parse([])
    assert cfg.layers * (cfg.width * cfg.width + cfg.width) == 33_570_816
    assert cfg.bucket_cap_mb is None and cfg.compute
    assert cfg.timed_steps == cfg.blocks * cfg.steps == 50 and cfg.settle == 150


def test_ddp_step_on_two_ranks(tmp_path):
    """A tiny model, 3 steps on each backend: the parameters agree (on two ranks a + b is the
    same sum whichever backend adds, so exactly), and the JSON holds the command, the step
    times of every model and their ratio."""
    jp = tmp_path / "ddp.json"
    argv = ["bench/ddp_step.py", "--layers", "2", "--width", "32", "--batch", "4"]
    argv += ["--warmup", "0", "--settle", "0", "--steps", "3", "--blocks", "1"]
    argv += ["--json", str(jp)]
    r = run_mpi(2, argv, timeout=300, env={"FOURD_CALIBRATE": "0"})
    out = r.stdout
    assert "# parameters after 3 steps, fourd vs gloo: max |diff| 0," in out, out[-3000:]
    assert "agree within rtol 0.0001, atol 1e-06" in out, out[-3000:]
    assert "# gloo / fourd: " in out and f"# wrote {jp}" in out, out[-3000:]
    doc = json.loads(jp.read_text())
    assert doc["schema"] == "fourd.bench.ddp" and doc["ok"] is True
    assert "bench/ddp_step.py --layers 2" in doc["command"] and doc["world_size"] == 2
    assert set(doc["backends"]) == {"fourd", "gloo", "compute"}
    for s in doc["backends"].values():
        assert s["steps"] == 3 and len(s["step_ms"]) == 3
        assert 0 < s["min_ms"] <= s["median_ms"] <= s["max_ms"], s
    assert doc["ratio_gloo_over_fourd"] > 0
    assert doc["model"]["parameters"] == 2 * (32 * 32 + 32)
    p = doc["parameters"]
    assert p["agree"] and p["max_abs_diff"] == 0.0 and p["compared_after_steps"] == 3, p
    assert all(math.isfinite(v) for v in doc["final_loss"].values())
    assert doc["fourd_tuning"]["steps"] == 0, doc["fourd_tuning"]


@pytest.mark.parametrize("tune", ["0", "1", "inline", "int8"])
def test_the_timed_steps_wait_for_fourds_tuning(tmp_path, tune):
    """Untimed steps of both DDP models until fourd's tuning of each bucket size runs one
    algorithm: with tuning off that is as soon as DDP has rebuilt its buckets (2 steps); by
    default too, since a size's second call runs its whole exploration, where it keeps the
    model's choice (a switch runs provisionally until its re-check, at least 5 calls later,
    beyond 3 steps, and the run says it has not settled); tuned inline, a bucket of a few KiB
    explores over hundreds of calls, one a step, so 3 steps leave it exploring, and the run
    says so. Either way both models
    took the same steps and agree."""
    jp = tmp_path / "ddp.json"
    argv = ["bench/ddp_step.py", "--layers", "2", "--width", "32", "--batch", "4"]
    argv += ["--warmup", "0", "--settle", "3", "--steps", "2", "--blocks", "1", "--no-compute"]
    argv += ["--json", str(jp)]
    env = {"FOURD_CALIBRATE": "0", "FOURD_TUNE": tune}
    if tune == "int8":  # a codec on the rail of 2 virtual nodes: those calls are not tuned
        env = {"FOURD_CALIBRATE": "0", "FOURD_COMPRESSION": "int8", "FOURD_RANKS_PER_NODE": "1"}
        argv += ["--rtol", "0.05", "--atol", "1e-3"]  # lossy: the parameters differ a little
    r = run_mpi(2, argv, timeout=300, env=env)
    doc = json.loads(jp.read_text())
    t = doc["fourd_tuning"]
    states = set(t["states"].values())
    if tune == "inline":
        assert not t["settled"] and t["steps"] == 3 and states == {"exploring"}, t
        assert "fourd's tuning NOT settled" in r.stdout, r.stdout[-2000:]
    elif tune == "int8":
        assert t["settled"] and t["steps"] == 2 and states == {"compressed"}, t
        assert all(v["codec"] == "int8:block=256" for v in t["tuning"].values()), t
    elif "provisional" in states:  # a switch, re-checked only some 10 s of steps later
        assert tune == "1" and not t["settled"] and t["steps"] == 3, t
        assert "fourd's tuning NOT settled" in r.stdout, r.stdout[-2000:]
    else:
        want = {"off"} if tune == "0" else {"settled"}
        assert t["settled"] and t["steps"] == 2 and states <= want, t
        assert "2 more (DDP models) until fourd's tuning settled" in r.stdout, r.stdout[-2000:]
    assert list(t["states"]) == [str(2 * (32 * 32 + 32) * 4)], t
    assert doc["parameters"]["compared_after_steps"] == t["steps"] + 2, doc["parameters"]
    assert doc["steps_per_model"] == t["steps"] + 2 and doc["ok"], doc["parameters"]
