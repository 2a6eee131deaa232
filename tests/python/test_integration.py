"""Training integration: fourd.parallel_state, fourd.tensor_parallel, fourd.nn.

Serial tests run in this process on a one-rank grid; the multi-rank suites (par_parallel_state.py,
par_nn.py) and the GPT example are launched under mpiexec with 8 and 4 ranks, each under a
timeout that kills the whole job.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from mpirun import ROOT, run_mpi, run_mpi_pytest

EXAMPLE = ROOT / "examples" / "train_gpt_4d.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_gpt_4d", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- serial: one rank ------------------------------------------------------------------------


@pytest.fixture
def one_rank():
    import fourd.parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    g = ps.initialize(x=1, y=1, z=1, data=1)
    yield g
    ps.destroy_model_parallel()


def test_linear_on_one_rank_is_torch_linear(one_rank):
    import fourd.nn as fnn

    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 4)
    torch.manual_seed(0)
    lin = fnn.Linear(6, 4)  # same RNG draws as torch.nn.Linear: same full weights
    assert torch.equal(lin.full_weight(), ref.weight.detach())
    assert torch.equal(lin.full_bias(), ref.bias.detach())
    x = torch.randn(3, 5, 6)
    torch.testing.assert_close(lin(x), ref(x), rtol=1e-6, atol=1e-6)
    tr = fnn.Linear(6, 4, transpose=True)
    tr.load_state_dict(ref.state_dict())
    torch.testing.assert_close(tr(x), ref(x), rtol=1e-6, atol=1e-6)
    sd = fnn.full_state_dict(torch.nn.Sequential(lin))
    assert sd["0.weight"].shape == (4, 6)


def test_overlap_and_sync_on_one_rank(one_rank):
    import fourd.nn as fnn

    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    mod = torch.nn.Sequential(fnn.Linear(8, 16), torch.nn.GELU(), fnn.Linear(16, 8, transpose=True))
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8)
    ref(x).square().sum().backward()
    with fnn.overlap(
        mod, all_reduce=True, reduce_scatter=True, all_gather=True, grad_reduce=True
    ) as ov:
        for _ in range(2):
            mod.zero_grad(set_to_none=True)
            mod(x).square().sum().backward()
            fnn.sync_gradients(mod)
        assert ov.learned_order == [mod[0], mod[2]]
    for (_n, p), (_, q) in zip(mod.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad.view_as(q.grad), q.grad, rtol=1e-5, atol=1e-6)
    fnn.sync_gradients(mod)  # the plain path on one rank: nothing to reduce, grads unchanged
    torch.testing.assert_close(mod[0].weight.grad.view(16, 8), ref[0].weight.grad)


def test_errors_name_the_argument(one_rank):
    import fourd
    import fourd.nn as fnn
    import fourd.parallel_state as ps
    import fourd.tensor_parallel as tp

    lin = fnn.Linear(6, 4)
    with pytest.raises(fourd.InvalidArgumentError, match="expected a last dimension of 6"):
        lin(torch.ones(2, 5))
    with pytest.raises(fourd.InvalidArgumentError, match="prefetch_depth"):
        fnn.overlap(lin, all_gather=True, prefetch_depth=0)
    with pytest.raises(fourd.InvalidArgumentError, match="axis"):
        fnn.set_grad_axes(lin.bias, "q")
    with pytest.raises(fourd.InvalidArgumentError, match="already"):
        ps.initialize()
    with pytest.raises(fourd.InvalidArgumentError, match="pipeline"):
        ps.initialize_model_parallel(1, 2)
    x = torch.ones(3, requires_grad=True)
    assert tp.scatter_to_tensor_model_parallel_region(x) is x  # one-rank group: no-op
    assert tp.gather_from_sequence_parallel_region(x) is x
    assert ps.get_tensor_model_parallel_world_size() == 1


def test_example_reference_runs_and_learns():
    ex = _example()
    args = ex.parse_args(["--reference", "--steps", "20"])
    losses, _, _ = ex.run_reference(args)
    assert len(losses) == 20 and losses[-1] < losses[0] - 0.3, losses


# ---- multi-rank ------------------------------------------------------------------------------


# 8 ranks: every factorization of (x, y, z, data) the layer sizes allow (the proof);
# 4-rank grids are covered by the example run below. Both suites build a fresh grid per case
# and call each size a few times on it, so they tune inline (one exploration step per call):
# the default explores a size whole in its second call, and with hundreds of grids that took
# parallel_state from 21 s to 45 s and nn from 74 s to 88 s on 8 ranks. par_algorithms tests
# the default schedule.
# Results against the unsharded model, whatever algorithm auto picks: no calibration either
# (11 s a job on 8 ranks, paid again by every job when the machine is too busy to cache it).
INLINE = {"FOURD_TUNE": "inline", "FOURD_CALIBRATE": "0"}


@pytest.mark.parametrize("n", [8])
def test_parallel_state_mpi(n):
    run_mpi_pytest(n, ["par_parallel_state.py"], timeout=420, env=INLINE)


@pytest.mark.parametrize("n", [8])
def test_nn_mpi(n):
    run_mpi_pytest(n, ["par_nn.py"], timeout=600, env=INLINE)


# One launch runs every overlap setting (--sweep) on a grid where each of them has work to do
# (Gz > 1 for ORS/OAG, Gz*Gdata > 1 for the buckets); a 4-rank grid with y > 1 runs with all
# overlaps on at once. par_nn.py covers every factorization layer by layer.
EXAMPLE_RUNS = [(8, (2, 1, 2, 2), "sweep"), (4, (1, 2, 2, 1), "all")]
LOSS_RTOL = 1e-4
STEPS = 10  # each step's loss against the single process's: 60 on 8 ranks with the sweep


@pytest.mark.parametrize("n,shape,mode", EXAMPLE_RUNS, ids=lambda v: str(v))
def test_gpt_example_matches_single_process(n, shape, mode, tmp_path):
    ex = _example()
    ref_losses, _, _ = ex.run_reference(ex.parse_args(["--reference", "--steps", str(STEPS)]))
    out = tmp_path / "run.json"
    x, y, z, d = shape
    sel = ["--sweep"] if mode == "sweep" else ["--overlap", mode]
    run_mpi(
        n,
        [
            str(EXAMPLE),
            "--x",
            str(x),
            "--y",
            str(y),
            "--z",
            str(z),
            "--data",
            str(d),
            "--steps",
            str(STEPS),
            "--quiet",
            "--json",
            str(out),
            *sel,
        ],
        timeout=300,
        env={"FOURD_CALIBRATE": "0"},
    )
    res = json.loads(out.read_text())["results"]
    want = {"none", "oar", "ors", "oag", "dp", "all"} if mode == "sweep" else {mode}
    assert set(res) == want
    for name, r in res.items():
        assert len(r["losses"]) == STEPS
        torch.testing.assert_close(
            torch.tensor(r["losses"]),
            torch.tensor(ref_losses),
            rtol=LOSS_RTOL,
            atol=0.0,
            msg=lambda m, shape=shape, name=name: f"{shape} overlap={name}: {m}",
        )
        if name == "all":
            st = r["stats"]
            assert st.get("buckets_early", 0) > 0, st
            if z > 1:
                assert st.get("prefetched_forward", 0) > 0 and st.get("deferred", 0) > 0, st


def test_example_held_out_set_is_fixed_and_the_decay_ends_at_a_tenth():
    ex = _example()
    a0 = ex.parse_args(["--reference", "--seed", "0", "--steps", "11", "--lr-decay"])
    a1 = ex.parse_args(["--reference", "--seed", "1", "--steps", "11", "--lr-decay"])
    for i in range(3):  # one held-out set whatever the seed, and none of it a training batch
        e0, e1 = ex.eval_batch(i, a0), ex.eval_batch(i, a1)
        assert all(torch.equal(u, v) for u, v in zip(e0, e1))
        assert not torch.equal(e0[0], ex.batch(i, a0)[0])
        assert not torch.equal(e0[0], ex.batch(i, a1)[0])
    assert ex.lr_at(0, a0) == pytest.approx(a0.lr)
    assert ex.lr_at(10, a0) == pytest.approx(0.1 * a0.lr)
    assert a0.lr > ex.lr_at(5, a0) > 0.1 * a0.lr
    plain = ex.parse_args(["--reference", "--steps", "11"])
    assert ex.lr_at(10, plain) == plain.lr


def test_gpt_example_held_out_losses_match_single_process(tmp_path):
    """--eval-every and --lr-decay on the data-parallel grid of the compression recordings:
    the 4D run's training and held-out losses are the unsharded model's."""
    ex = _example()
    opts = ["--steps", "12", "--eval-every", "5", "--lr-decay"]
    ref_losses, _, ref_evals = ex.run_reference(ex.parse_args(["--reference", *opts]))
    assert [e["step"] for e in ref_evals] == [4, 9, 11]
    out = tmp_path / "run.json"
    run_mpi(
        4,
        [str(EXAMPLE), "--x", "2", "--data", "2", *opts, "--quiet", "--loss-log", str(out)],
        timeout=300,
        env={"FOURD_CALIBRATE": "0"},
    )
    log = json.loads(out.read_text())
    torch.testing.assert_close(
        torch.tensor([s["loss"] for s in log["steps"]]),
        torch.tensor(ref_losses),
        rtol=LOSS_RTOL,
        atol=0.0,
    )
    assert [e["step"] for e in log["evals"]] == [4, 9, 11]
    torch.testing.assert_close(
        torch.tensor([e["loss"] for e in log["evals"]]),
        torch.tensor([e["loss"] for e in ref_evals]),
        rtol=LOSS_RTOL,
        atol=0.0,
    )


@pytest.mark.parametrize("bad", [["--eval-every", "-1"], ["--eval-batches", "0"]])
def test_example_refuses_bad_evaluation_options(bad, capsys):
    ex = _example()
    with pytest.raises(SystemExit) as e:
        ex.parse_args(["--reference", *bad])
    assert e.value.code == 2
    assert bad[0] in capsys.readouterr().err
