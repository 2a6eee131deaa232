"""fourd.parallel_state as a drop-in for Megatron-Core's parallel_state (megatron-core 0.19.2).

Serial: megatron-core is installed into the running environment when it is missing (the pip
command below; a failed install fails the test, it never skips); every public function and
class of Megatron's module exists in fourd's with Megatron's parameters; Megatron's rank
arithmetic helpers give Megatron's answers; the arguments fourd's grid cannot honour raise.
Multi-rank: tests/python/mpi/par_megatron.py on 4 ranks (parity with Megatron's own module,
Megatron's mappings and layers on fourd's groups).

megatron-core is not in pyproject.toml's test extra because pip cannot install it from there:
it needs --no-deps (its dependencies would replace the pinned torch) and
--ignore-requires-python (0.19.2 asks for a newer Python than 3.11, which runs it fine).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import shlex
import subprocess
import sys

import pytest

from mpirun import run_mpi_pytest

MEGATRON = "megatron-core==0.19.2"
# What megatron.core imports beyond torch (triton: its MoE kernels, imported unconditionally).
REQUIREMENTS = {"megatron-core": "0.19.2", "triton": "3.9.0", "numpy": None, "packaging": None}
PIP = [sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-requires-python"]


def _missing() -> list[str]:
    out = []
    for name, version in REQUIREMENTS.items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have is None or (version is not None and have != version):
            out.append(f"{name}=={version}" if version else name)
    return out


@pytest.fixture(scope="module", autouse=True)
def megatron_installed():
    """megatron-core 0.19.2 (and triton) in this environment, installed now if missing."""
    missing = _missing()
    if missing:
        cmd = PIP + missing
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or _missing():
            pytest.fail(
                f"could not install {', '.join(missing)} with `{shlex.join(cmd)}` "
                f"(rc={r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            )
        importlib.invalidate_caches()
    assert importlib.metadata.version("torch").startswith("2.13.0"), "pip touched torch"


def _megatron_ps():
    return importlib.import_module("megatron.core.parallel_state")


def _public(module) -> dict:
    """The public functions and classes a module defines itself."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and obj.__module__ == module.__name__
    }


def _params(obj) -> list:
    return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]


def test_every_public_megatron_function_is_in_fourd_with_its_parameters():
    import fourd.parallel_state as ps

    theirs = _public(_megatron_ps())
    assert len(theirs) > 80  # the surface this test stands for
    missing = sorted(set(theirs) - set(vars(ps)))
    assert not missing, f"missing from fourd.parallel_state: {missing}"
    # Megatron's parameters, in Megatron's order, with Megatron's defaults; fourd may add
    # keyword-only ones after them.
    bad = [
        f"{name}: Megatron {_params(obj)}, fourd {_params(getattr(ps, name))}"
        for name, obj in sorted(theirs.items())
        if _params(getattr(ps, name))[: len(_params(obj))] != _params(obj)
    ]
    assert not bad, "parameters that differ from Megatron's:\n" + "\n".join(bad)


def test_rank_helpers_give_megatrons_groups():
    import fourd.parallel_state as ps

    theirs = _megatron_ps()
    for sizes in ([2, 3, 4], [1, 2, 2, 2], [4, 1, 2]):
        world = 1
        for s in sizes:
            world *= s
        for mask in ([True, False, False], [False, True, True], [True, False, True]):
            mask = (mask + [False])[: len(sizes)]
            assert ps.generate_masked_orthogonal_rank_groups(
                world, sizes, mask
            ) == theirs.generate_masked_orthogonal_rank_groups(world, sizes, mask)
    for order in ("tp-cp-ep-dp-pp", "tp-pp-dp", "dp-tp"):
        kw = dict(tp=2, ep=1, dp=2, pp=1, cp=2, order=order, rank_offset=3)
        if order != "tp-cp-ep-dp-pp":
            kw["cp"] = 1
        ours, mega = ps.RankGenerator(**kw), theirs.RankGenerator(**kw)
        assert ours.order == mega.order and ours.ordered_size == mega.ordered_size
        for token in ("tp", "dp", "tp-dp", "pp", "cp", "dp-cp", "tp-pp"):
            assert ours.get_ranks(token) == mega.get_ranks(token), (order, token)
    for pp in ([5], [3, 7, 9]):
        assert ps.default_embedding_ranks(pp) == theirs.default_embedding_ranks(pp)
        assert ps.default_position_embedding_ranks(pp) == theirs.default_position_embedding_ranks(
            pp
        )
    cfgs_a, cfgs_b = {}, {}
    ps.overwrite_nccl_comm_cfgs(cfgs_a, "dp", ("is_high_priority_stream", True))
    theirs.overwrite_nccl_comm_cfgs(cfgs_b, "dp", ("is_high_priority_stream", True))
    assert cfgs_a == cfgs_b


def test_hierarchical_rank_lists_match_megatrons_example():
    from fourd._megatron_compat import hierarchical_rank_lists

    # the example of Megatron's create_hierarchical_groups: 16 ranks, sizes [2, 2, 4]
    levels = hierarchical_rank_lists(list(range(16)), [2, 2, 4])
    assert levels[0] == [[2 * i, 2 * i + 1] for i in range(8)]
    assert levels[1] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert levels[2] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]


@pytest.mark.parametrize(
    "kw",
    [
        {"pipeline_model_parallel_size": 2},
        {"virtual_pipeline_model_parallel_size": 2},
        {"context_parallel_size": 2},
        {"hybrid_context_parallel": True},
        {"expert_model_parallel_size": 2},
        {"gtp_remat_size": 2},
        {"expert_gtp_remat_size": 2},
        {"num_distributed_optimizer_instances": 2},
        {"expert_tensor_parallel_size": 2},
        {"hierarchical_context_parallel_sizes": [2, 1]},
        {"rank_offset": 1},
        {"local_world_size": 2},
        {"sharp_enabled_group": "dp"},
        {"use_sharp": True, "sharp_enabled_group": "dp_replica"},
        {"pipeline_model_parallel_comm_backend": "gloo"},
    ],
    ids=lambda kw: "-".join(kw),
)
def test_what_the_grid_cannot_do_raises_naming_the_argument(kw):
    import fourd
    import fourd.parallel_state as ps

    arg = next(k for k in kw if k != "use_sharp")
    with pytest.raises(fourd.InvalidArgumentError, match=arg):
        ps.initialize_model_parallel(1, **kw)
    assert not ps.is_initialized()


def test_megatron_order_strings_map_onto_the_grid():
    import fourd
    from fourd._megatron_compat import grid_order

    assert grid_order("tp-cp-ep-dp-pp", 4, 2) == "x-y-z-data"
    assert grid_order("tp-pp-dp", 4, 2) == "x-y-z-data"
    assert grid_order("dp-tp", 4, 2) == "data-x-y-z"
    assert grid_order("pp-ep", 1, 1) == "x-y-z-data"  # the missing tokens come last
    assert grid_order("data-z-y-x", 2, 2) == "data-z-y-x"  # fourd's own order, as it is
    with pytest.raises(fourd.InvalidArgumentError, match="does not name dp"):
        grid_order("tp-pp", 2, 2)
    with pytest.raises(fourd.InvalidArgumentError, match="twice"):
        grid_order("tp-tp-dp", 2, 2)


# Until fourd.distributed exists, a stand-in registers a backend named "fourd" (gloo under that
# name): the groups must then be of that backend, as they will be of fourd's own.
_BACKEND_SCRIPT = """
import importlib.util, sys, types
import torch.distributed as dist
if importlib.util.find_spec("fourd.distributed") is None:
    def make(store, rank, size, timeout):
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    dist.Backend.register_backend("fourd", make, devices=["cpu"])
    sys.modules["fourd.distributed"] = types.ModuleType("fourd.distributed")
import fourd.parallel_state as ps
ps.initialize()
for g in (ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()):
    assert dist.get_backend(g) == "fourd", dist.get_backend(g)
    assert dist.get_backend(g.torch_group()) == "fourd"
assert dist.get_backend(ps.get_data_parallel_group_gloo()) == "gloo"
ps.destroy_model_parallel()
print("backend ok")
"""


def test_groups_are_of_fourds_torch_backend_when_it_is_registered():
    env = {**os.environ, "FOURD_CALIBRATE": "0"}
    r = subprocess.run(
        [sys.executable, "-c", _BACKEND_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0 and "backend ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("n", [4])
def test_megatron_mpi(n):
    run_mpi_pytest(n, ["par_megatron.py"], timeout=600)
