"""Oracle: vime's Megatron layout check and rank groups against megatron-core's own code.

Skipped unless megatron-core is importable (tests/oracle/setup.sh builds a venv where it is;
docs/oracles.md has the numbers of the last run).

What runs for real (megatron-core 0.19.2, unmodified): `parallel_state.initialize_model_parallel`
with its own divisibility checks and error messages, the two `RankGenerator`s it builds,
`generate_masked_orthogonal_rank_groups`, `create_group`, the rank getters
(`get_tensor_model_parallel_rank`, ..., `get_expert_data_parallel_rank`) and
`destroy_model_parallel`; the tests also build `RankGenerator`s directly.

What is stubbed, and only while `initialize_model_parallel` runs (unittest.mock.patch of
attributes of `torch.distributed`, restored afterwards):
- `is_initialized()` returns True (there is no process group);
- `get_world_size(group=None)` returns the simulated world size, or `group.size()` for a group;
- `get_rank(group=None)` returns the simulated rank of this process, or `group.rank()`;
- `new_group(ranks, ..., backend, group_desc)` creates no communicator: it returns a `FakeGroup`
  that records `ranks`, `backend` and `group_desc`, whose `rank()` is the simulated rank's index
  in `ranks` (-1 outside, as torch does) and whose `size()` is `len(ranks)`.
Every process of a real job calls `new_group` for every group in the same order, so the
recorded calls are the groups megatron builds, listed in its own order. No option that needs
a barrier or CUDA is used (SHARP, partial distributed optimizer, hierarchical or hybrid CP,
NCCL communicator configs), so nothing else of torch.distributed or torch.cuda is reached.
The order string is "tp-cp-ep-dp-pp", megatron's default and what Megatron-LM's training
passes; gtp_remat_size and expert_gtp_remat_size stay 1 (vime does not emit them).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from unittest import mock

import pytest

with warnings.catch_warnings():
    # "Transformer Engine and Apex are not installed. Falling back to ..." and the like
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import package_info
    from megatron.core import parallel_state as ps
    from megatron.core.parallel_state import RankGenerator, generate_masked_orthogonal_rank_groups

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tiers import tiered

from vime import pipeline
from vime.parse import Source
from vime.plan.groups import Layout, orthogonal_groups

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.toml"))
ORDER = "tp-cp-ep-dp-pp"
MAX_WORLD = 1024
EXAMPLES = 2000

# vime's group name -> the group_desc initialize_model_parallel gives those groups
DESCS = {
    "tp": "TENSOR_MODEL_PARALLEL_GROUP",
    "cp": "CONTEXT_PARALLEL_GROUP",
    "dp": "DATA_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
    "ep": "EXPERT_MODEL_PARALLEL_GROUP",
    "etp": "EXPERT_TENSOR_PARALLEL_GROUP",
    "edp": "EXPERT_DATA_PARALLEL_GROUP",
}
# vime's group name -> (grid, RankGenerator token), as listed in megatron.md §1.4
TOKENS = {
    "tp": ("dense", "tp"), "cp": ("dense", "cp"), "dp": ("dense", "dp"), "pp": ("dense", "pp"),
    "ep": ("expert", "ep"), "etp": ("expert", "tp"), "edp": ("expert", "dp"),
}
# vime's coordinate name -> megatron's getter of the calling rank's index in that group
GETTERS = {
    "tp": ps.get_tensor_model_parallel_rank,
    "cp": ps.get_context_parallel_rank,
    "dp": ps.get_data_parallel_rank,
    "pp": ps.get_pipeline_model_parallel_rank,
    "ep": ps.get_expert_model_parallel_rank,
    "etp": ps.get_expert_tensor_parallel_rank,
    "edp": ps.get_expert_data_parallel_rank,
}


class FakeGroup:
    """What the stubbed torch.distributed.new_group returns: the ranks, no communicator."""

    def __init__(self, ranks, backend, desc, me):
        self.ranks, self.backend, self.desc, self.me = list(ranks), backend, desc, me

    def rank(self) -> int:
        return self.ranks.index(self.me) if self.me in self.ranks else -1

    def size(self) -> int:
        return len(self.ranks)


@dataclass
class Megatron:
    """What one (stubbed) initialize_model_parallel call did, seen from one rank."""

    error: Exception | None
    groups: dict[str, list[list[int]]] = field(default_factory=dict)
    coords: dict[str, int] = field(default_factory=dict)


def megatron_init(world: int, tp: int, cp: int, pp: int, ep: int, etp: int,
                  rank: int = 0) -> Megatron:
    """Run megatron-core's initialize_model_parallel as `rank` of a `world`-rank job."""
    made: list[FakeGroup] = []

    def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
                  use_local_synchronization=False, group_desc=None):
        group = FakeGroup(ranks, backend, group_desc, rank)
        made.append(group)
        return group

    def get_rank(group=None):
        return rank if group is None else group.rank()

    def get_world_size(group=None):
        return world if group is None else group.size()

    with mock.patch.multiple(dist, is_initialized=lambda: True, get_rank=get_rank,
                             get_world_size=get_world_size, new_group=new_group), \
            mock.patch.object(ps, "_global_process_group_list", None):
        try:
            ps.initialize_model_parallel(
                tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                context_parallel_size=cp, expert_model_parallel_size=ep,
                expert_tensor_parallel_size=etp, order=ORDER)
        except (RuntimeError, AssertionError) as err:
            return Megatron(err)
        else:
            coords = {name: getter() for name, getter in GETTERS.items()}
        finally:
            ps.destroy_model_parallel()
    groups = {name: [g.ranks for g in made if g.desc == desc] for name, desc in DESCS.items()}
    return Megatron(None, groups, coords)


def rank_generators(world: int, tp: int, cp: int, pp: int, ep: int, etp: int):
    """The two RankGenerators initialize_model_parallel builds (megatron.md §1.2 items 6, 7)."""
    return {
        "dense": RankGenerator(tp=tp, ep=1, dp=world // (tp * cp * pp), pp=pp, cp=cp, order=ORDER),
        "expert": RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1,
                                order=ORDER),
    }


def generator_groups(world: int, tp: int, cp: int, pp: int, ep: int, etp: int):
    gens = rank_generators(world, tp, cp, pp, ep, etp)
    return {name: gens[grid].get_ranks(token) for name, (grid, token) in TOKENS.items()}


def assert_coordinates_match_membership(layout: Layout, groups: dict[str, list[list[int]]]):
    """Every rank is in exactly one group of each kind, at the index vime's coordinates say."""
    for name, kind in groups.items():
        seen = sorted(r for group in kind for r in group)
        assert seen == list(range(layout.world_size)), name
        for group in kind:
            for index, r in enumerate(group):
                assert layout.coordinates(r)[name] == index, (name, r, group)


# --- Hypothesis: layouts of up to 1,024 GPUs -------------------------------------------------

def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# world sizes with many divisors (every n <= 1,024 with at least 12), so that structured
# layouts have room; 1,024 itself among them
RICH = [n for n in range(1, MAX_WORLD + 1) if len(divisors(n)) >= 12]
STATS = {"examples": 0, "accepted": 0, "rejected_dense": 0, "rejected_expert": 0,
         "max_world_accepted": 0}


@st.composite
def layouts(draw):
    """(world, tp, cp, pp, ep, etp, rank): half structured so that megatron accepts them (each
    size a divisor of what is left), half free (each size a divisor of the world or any integer
    up to twice it, mostly rejected)."""
    world = draw(st.one_of(st.integers(1, 64), st.sampled_from(RICH),
                           st.integers(1, MAX_WORLD), st.just(MAX_WORLD)))
    if draw(st.booleans()):
        tp = draw(st.sampled_from(divisors(world)))
        cp = draw(st.sampled_from(divisors(world // tp)))
        pp = draw(st.sampled_from(divisors(world // (tp * cp))))
        etp = draw(st.sampled_from(divisors(world // pp)))
        ep = draw(st.sampled_from(divisors(world // (pp * etp))))
    else:
        size = st.one_of(st.sampled_from(divisors(world)), st.integers(1, 2 * world))
        tp, cp, pp, ep, etp = (draw(size) for _ in range(5))
    rank = draw(st.integers(0, world - 1))
    return world, tp, cp, pp, ep, etp, rank


# layouts that run in both tiers: megatron.md §1.5's vectors, the extremes, and every case the
# full tier ever failed
FIXED = [
    (8, 2, 1, 2, 4, 1, 5),           # megatron.md §1.5 vectors
    (16, 2, 2, 2, 4, 1, 9),
    (8, 4, 1, 1, 2, 2, 3),
    (1024, 8, 2, 4, 16, 2, 1023),    # the largest world, every axis > 1
    (1024, 1, 1, 1, 1, 1, 512),      # 1,024 singleton tp/cp/pp/ep/etp groups
    (1024, 3, 1, 1, 1, 1, 0),        # rejected: dense
    (1024, 8, 1, 4, 3, 1, 0),        # rejected: expert only
    (24, 4, 1, 1, 8, 1, 23),         # EP spanning TP ranks, 3 EP groups
]


def check_one_layout(case):
    world, tp, cp, pp, ep, etp, rank = case
    layout = Layout(world, tp, cp, pp, ep, etp)
    problems = layout.problems()
    megatron = megatron_init(world, tp, cp, pp, ep, etp, rank)
    STATS["examples"] += 1

    # (a) accept/reject, and vime's first problem is megatron's error message
    assert (megatron.error is None) == (not problems), (case, problems, megatron.error)
    if megatron.error is not None:
        assert isinstance(megatron.error, RuntimeError)
        assert str(megatron.error) == problems[0]
        dense = world % (tp * cp * pp) != 0
        STATS["rejected_dense" if dense else "rejected_expert"] += 1
        return
    STATS["accepted"] += 1
    STATS["max_world_accepted"] = max(STATS["max_world_accepted"], world)

    # (b) every group, order included, equals megatron's (from initialize_model_parallel and
    # from the RankGenerators directly), and the rank's coordinates equal megatron's getters
    groups = layout.groups()
    assert list(groups) == list(DESCS)
    assert groups == megatron.groups, case
    assert groups == generator_groups(world, tp, cp, pp, ep, etp), case
    assert layout.coordinates(rank) == megatron.coords, (case, rank)
    assert_coordinates_match_membership(layout, groups)


def layout_checker(examples: int):
    """check_one_layout over the fixed layouts and `examples` drawn ones (derandomized: the
    same ones every run)."""
    test = given(layouts())(check_one_layout)
    for case in reversed(FIXED):
        test = example(case)(test)
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(
        test)


@tiered(fast=150, full=EXAMPLES)
def test_layouts_match_initialize_model_parallel(examples):
    for key in STATS:
        STATS[key] = 0
    layout_checker(examples)()
    print(f"\nmegatron-core {package_info.__version__}: {STATS}")
    assert STATS["examples"] >= examples
    assert STATS["accepted"] >= examples // 4
    assert STATS["rejected_dense"] >= examples // 10
    assert STATS["rejected_expert"] >= max(2, examples // 100)
    assert STATS["max_world_accepted"] == MAX_WORLD


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6).flatmap(
    lambda sizes: st.tuples(st.just(sizes),
                            st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))))
def test_orthogonal_groups_match_megatron(case):
    sizes, mask = case
    assert orthogonal_groups(sizes, mask) == generate_masked_orthogonal_rank_groups(
        prod(sizes), sizes, mask)


# --- The seed specs through vime's whole pipeline ----------------------------------------------

@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_spec_plan_groups_match_megatron(path):
    result = pipeline.run(Source(path.name, path.read_text()), [], path.parent)
    assert result.ok and result.plan is not None, [str(d) for d in result.diagnostics]
    par, world = result.spec.train.parallel, result.spec.train.num_gpus
    sizes = (world, par.tp, par.cp, par.pp, par.ep, par.etp)

    assert result.plan.groups == generator_groups(*sizes)
    assert len(result.plan.ranks) == world
    for actor in result.plan.ranks:
        megatron = megatron_init(*sizes, rank=actor.rank)
        assert megatron.error is None
        assert result.plan.groups == megatron.groups
        assert actor.coords == megatron.coords, actor.rank


def test_megatron_core_version():
    """The facts in shared/reference/megatron.md and these tests are for 0.19.x."""
    assert package_info.__version__.startswith("0.19.")
