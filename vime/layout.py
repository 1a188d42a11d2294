"""The parallel layout of the actor: one frozen type the compiler and the runtime both import.

`Layout` holds Megatron's sizes (tp, pp, cp, ep, etp over world_size ranks), derives dp and
edp, a rank's coordinates and the rank groups, and reads and writes plan.json's form of it.
The groups are enumerated as megatron-core's RankGenerator does (megatron/core/
parallel_state.py, shared/reference/megatron.md §1.3), without torch; the oracle tests
(tests/oracle/test_megatron_groups.py) compare them with megatron-core's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, repeat
from math import lcm, prod

DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")
# the sizes as plan.json's train section lists them
SIZES = ("tp", "pp", "cp", "ep", "etp", "dp", "edp")
# a rank's coordinates as plan.json's train.ranks list them
COORDINATES = ("tp", "cp", "dp", "pp", "ep", "etp", "edp")


def _decompose(index: int, sizes: list[int]) -> list[int]:
    coords = []
    for size in sizes:
        coords.append(index % size)
        index //= size
    return coords


def orthogonal_groups(sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """All groups that vary the masked axes, the unmasked axes fixed per group."""
    strides = [prod(sizes[:i]) for i in range(len(sizes))]
    masked = [i for i, m in enumerate(mask) if m]
    unmasked = [i for i, m in enumerate(mask) if not m]
    # every group has the same members relative to its first rank: compute them once, so a
    # plan of the largest cluster the schema admits stays linear in its ranks
    # (benchmarks/plan_startup.py, benchmarks/RESULTS.md)
    offsets = [sum(c * strides[i] for c, i in zip(_decompose(r, [sizes[i] for i in masked]),
                                                  masked, strict=True))
               for r in range(prod(sizes[i] for i in masked))]
    groups = []
    for g in range(prod(sizes) // len(offsets)):
        fixed = _decompose(g, [sizes[i] for i in unmasked])
        base = sum(c * strides[i] for c, i in zip(fixed, unmasked, strict=True))
        groups.append([base + offset for offset in offsets])
    return groups


def axis_column(stride: int, size: int, world: int) -> list[int]:
    """Coordinate (r // stride) % size of every rank r < world, without a Python step per rank:
    stride copies of each coordinate, that period repeated (262,144 ranks: benchmarks/plan_startup.py)."""
    if size == 1:
        return [0] * world
    period = (list(range(size)) if stride == 1 else
              list(chain.from_iterable(map(repeat, range(size), repeat(stride)))))
    return period * (world // (stride * size))


def axis_members(sizes: list[int], axis: int) -> list[int]:
    """The groups that vary only `axis`, as `orthogonal_groups` lists them, one after the other
    in one flat list (each group has sizes[axis] members), without a Python step per rank.

    The group of first rank f is range(f, f + size × stride, stride); the first ranks are
    those whose coordinate on `axis` is 0, in rank order: the first `stride` ranks of every
    block of stride × size ranks."""
    stride, size, world = prod(sizes[:axis]), sizes[axis], prod(sizes)
    if stride == 1 or size == 1:  # each group a run of consecutive ranks, or a rank of its own
        return list(range(world))
    block = stride * size
    firsts = list(chain.from_iterable(map(range, range(0, world, block),
                                          range(stride, world + 1, block))))
    return list(chain.from_iterable(map(range, firsts, map(int.__add__, firsts, repeat(block)),
                                        repeat(stride))))


def chunked(flat: list[int], size: int) -> list[list[int]]:
    return list(map(list, zip(*[iter(flat)] * size, strict=True)))


@dataclass(frozen=True)
class Grid:
    """One RankGenerator: axis sizes in order-string order."""

    sizes: dict[str, int]

    def groups(self, *axes: str) -> list[list[int]]:
        names = list(self.sizes)
        if len(axes) == 1:
            return chunked(self.members(axes[0]), self.sizes[axes[0]])
        return orthogonal_groups([self.sizes[n] for n in names], [n in axes for n in names])

    def members(self, axis: str) -> list[int]:
        """The groups of one axis, flat (`axis_members`)."""
        return axis_members(list(self.sizes.values()), list(self.sizes).index(axis))

    def columns(self) -> dict[str, list[int]]:
        """Each axis's coordinate of every rank, rank after rank (`coordinates`, by columns)."""
        world, stride, out = prod(self.sizes.values()), 1, {}
        for name, size in self.sizes.items():
            out[name] = axis_column(stride, size, world)
            stride *= size
        return out

    def coordinates(self, rank: int) -> dict[str, int]:
        return dict(zip(self.sizes, _decompose(rank, list(self.sizes.values())), strict=True))


@dataclass(frozen=True)
class Layout:
    """The actor's parallel sizes over world_size ranks (Megatron's default order
    "tp-cp-ep-dp-pp"): a dense grid (tp, cp, dp, pp) and an expert grid (etp, ep, edp, pp)
    over the same ranks."""

    world_size: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1

    @classmethod
    def smallest(cls, tp: int = 1, pp: int = 1, ep: int = 1, etp: int = 1) -> Layout:
        """The layout of the fewest ranks that holds these sizes, one replica of the weights:
        megatron-core needs tp and ep × etp to divide a pipeline stage's ranks (cp replicates
        the weights, so it stays 1)."""
        return cls(pp * lcm(tp, ep * etp), tp=tp, pp=pp, ep=ep, etp=etp)

    @classmethod
    def from_plan(cls, train: Mapping) -> Layout:
        """The layout of plan.json's train section (or any mapping of the SIZES): its world
        is num_gpus where given, else dp × tp × cp × pp.

        Raises:
            KeyError: a size is missing.
        """
        tp, cp, pp = int(train["tp"]), int(train["cp"]), int(train["pp"])
        world = train.get("num_gpus") or int(train["dp"]) * tp * cp * pp
        return cls(int(world), tp=tp, cp=cp, pp=pp, ep=int(train["ep"]), etp=int(train["etp"]))

    def to_plan(self) -> dict[str, int]:
        """The sizes as plan.json's train section lists them (SIZES)."""
        return {name: getattr(self, name) for name in SIZES}

    def __getitem__(self, name: str) -> int:
        """A size by its plan.json name (runtime/backends/megatron_train.py reads them so)."""
        if name not in SIZES:
            raise KeyError(name)
        return getattr(self, name)

    @property
    def replica(self) -> int:
        """The ranks of one dense model replica: tp × cp × pp."""
        return self.tp * self.cp * self.pp

    @property
    def expert_grid(self) -> int:
        """The ranks of one expert grid: etp × ep × pp."""
        return self.etp * self.ep * self.pp

    @property
    def dp(self) -> int:
        """Data parallel, excluding cp: world_size ÷ (tp × cp × pp)."""
        return self.world_size // self.replica

    @property
    def edp(self) -> int:
        """Expert data parallel: world_size ÷ (etp × ep × pp)."""
        return self.world_size // self.expert_grid

    def problems(self) -> list[str]:
        """What initialize_model_parallel would raise for these sizes (parallel_state.py)."""
        out = []
        dense = self.replica
        if self.world_size % dense:
            out.append(f"world_size ({self.world_size}) is not divisible by {dense}")
        expert = self.expert_grid
        if self.world_size % expert:
            out.append(
                f"world_size ({self.world_size}) is not divisible by "
                f"expert_tensor_model_pipeline_parallel size ({expert})"
            )
        return out

    @property
    def dense(self) -> Grid:
        return Grid({"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp})

    @property
    def expert(self) -> Grid:
        return Grid({"tp": self.etp, "ep": self.ep, "dp": self.edp, "pp": self.pp})

    def groups(self) -> dict[str, list[list[int]]]:
        """The seven groups plan.json lists, keyed as the spec names them."""
        return {name: chunked(flat, size) for name, (flat, size) in self.members().items()}

    def members(self) -> dict[str, tuple[list[int], int]]:
        """`groups` flat: each kind's groups one after the other, and the size of a group."""
        if self.problems():
            raise ValueError("; ".join(self.problems()))
        dense, expert = self.dense, self.expert
        kinds = {"tp": (dense, "tp"), "cp": (dense, "cp"), "dp": (dense, "dp"),
                 "pp": (dense, "pp"), "ep": (expert, "ep"), "etp": (expert, "tp"),
                 "edp": (expert, "dp")}
        return {name: (grid.members(axis), grid.sizes[axis])
                for name, (grid, axis) in kinds.items()}

    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank `rank`'s place on each axis (COORDINATES)."""
        tp, cp, dp, pp = _decompose(rank, [self.tp, self.cp, self.dp, self.pp])
        etp, ep, edp, _ = _decompose(rank, [self.etp, self.ep, self.edp, self.pp])
        return {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": etp, "edp": edp}

    def columns(self) -> dict[str, list[int]]:
        """`coordinates` of every rank, by columns: each coordinate of rank 0, 1, 2, ..."""
        dense, expert = self.dense.columns(), self.expert.columns()
        return {"tp": dense["tp"], "cp": dense["cp"], "dp": dense["dp"], "pp": dense["pp"],
                "ep": expert["ep"], "etp": expert["tp"], "edp": expert["dp"]}
