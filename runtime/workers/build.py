"""The groups built from the plan: Ray actors on the placement group's bundles (the driver),
one rank and one engine in this process (tests), or a torchrun world's ranks.

GPU shares per actor (runtime/core/hosts.py): colocated, a training rank takes 0.4 of its GPU
and an engine 0.2 (slime's numbers), so both fit on one bundle; disaggregated, each takes its
whole GPU. Without GPUs they are Ray's logical ones and the backends use the CPU.
"""

from __future__ import annotations

from runtime.core import hosts
from runtime.core.hosts import ENGINE_GPU_SHARE_COLOCATED, TRAIN_GPU_SHARE_COLOCATED
from runtime.core.slices import JobConfig
from runtime.core.startup import Startup
from runtime.workers.groups import RolloutGroup, TrainGroup
from runtime.workers.host import RolloutWorker, TrainWorker


def spmd_group(config: JobConfig, rank: int, cpu_threads: int = 1) -> TrainGroup | None:
    """The training ranks as the processes of one torchrun world (runtime/core/spmd.py): every
    process calls this; rank 0 gets the group, the others serve rank 0's calls and get None
    when it stops them."""
    import os

    import torch
    import torch.distributed as dist

    from runtime.core import spmd

    if not dist.is_initialized():  # torchrun's environment (MASTER_ADDR, RANK, WORLD_SIZE)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    worker = TrainWorker(config.train_backend)
    worker.init(config.train_slice(rank, os.environ["MASTER_ADDR"],
                                   int(os.environ["MASTER_PORT"]), cpu_threads))
    if rank != 0:
        spmd.follow(worker)
        return None
    hosts.SPMD_WORKER[0] = worker
    return TrainGroup.from_layout([spmd.RankHandle(r) for r in range(len(config.ranks))],
                                  config.parallel, config.train["balance_data"])


def local_groups(config: JobConfig, cpu_threads: int = 1) -> tuple[TrainGroup, RolloutGroup]:
    """One rank and one engine in this process (tests, debugging)."""
    if len(config.ranks) != 1 or len(config.engines) != 1:
        raise ValueError("in-process groups hold one rank and one engine; this plan has "
                         f"{len(config.ranks)} and {len(config.engines)}")
    trainer = TrainWorker(config.train_backend)
    trainer.init(config.train_slice(0, "127.0.0.1", 0, cpu_threads))
    engine = RolloutWorker(config.rollout_backend)
    engine.start(config.engine_slice(0, cpu_threads))
    return TrainGroup([trainer]), RolloutGroup([engine])


def ray_groups(config: JobConfig, placement, cpu_threads: int,
               startup: Startup | None = None) -> tuple[TrainGroup, RolloutGroup]:
    """A Ray actor per rank and per engine, each on the bundle of its plan GPU. Disaggregated,
    the ranks build their models while the engines start; colocated, the ranks first, then
    the engines (an engine sizes its KV cache from the GPU memory it finds free). With
    `startup`, the phases are marked: actors (the processes up), then actor_build and
    engine_start, or actor_build_and_engine_start when they overlap; the first push's end
    is marked by the training group."""
    import ray

    startup = startup or Startup(lambda line: None)
    train_share = TRAIN_GPU_SHARE_COLOCATED if config.colocate else 1.0
    train_cls = ray.remote(TrainWorker)
    trainers = [train_cls.options(**_on(placement, placement.bundle(r["node"], r["gpu"]),
                                        train_share, False))
                .remote(config.train_backend) for r in config.ranks]
    engines = [new_engine_actor(config, placement, i) for i in range(len(config.engines))]
    address, port = ray.get(trainers[0].rendezvous.remote())
    ray.get([e.__ray_ready__.remote() for e in engines])
    startup.mark("actors")
    inits = [t.init.remote(config.train_slice(r, address, port, cpu_threads))
             for r, t in enumerate(trainers)]
    if config.colocate:
        startup.detail("slowest_rank_init", max(ray.get(inits)))
        startup.mark("actor_build")

    starts = [e.start.remote(config.engine_slice(i, cpu_threads,
                                                 engine_bundles(config, placement, i)))
              for i, e in enumerate(engines)]
    if not config.colocate:
        startup.detail("slowest_rank_init", max(ray.get(inits)))
    startup.detail("slowest_engine_start", max(ray.get(starts)))
    startup.mark("engine_start" if config.colocate else "actor_build_and_engine_start")
    return (TrainGroup.from_layout(trainers, config.parallel, config.train["balance_data"],
                                   on_first_push=lambda: startup.mark("first_push")),
            RolloutGroup(engines))


def _on(placement, bundle: int, share: float, children: bool) -> dict:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    # an engine's own workers (vLLM's Ray executor) must land in the group too
    return {"num_cpus": 0, "num_gpus": share,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement.group, placement_group_bundle_index=bundle,
                placement_group_capture_child_tasks=children)}


def engine_bundles(config: JobConfig, placement, index: int) -> tuple[int, ...]:
    return tuple(placement.bundle(g["node"], g["gpu"]) for g in config.engines[index]["gpus"])


def engine_host_gpus(config: JobConfig, index: int) -> float:
    """The GPU share of an engine's host actor: an engine of several GPUs runs its workers as
    Ray actors on its bundles (vLLM's Ray executor), which take the GPUs; its host takes none
    (runtime/backends/vllm_rollout.py, `launch`)."""
    if len(config.engines[index]["gpus"]) > 1:
        return 0.0
    return ENGINE_GPU_SHARE_COLOCATED if config.colocate else 1.0


def new_engine_actor(config: JobConfig, placement, index: int):
    """An (unstarted) engine actor on the bundle of the engine's first GPU; also how the
    supervisor replaces a dead one (runtime/workers/supervisor.py)."""
    import ray

    engine_share = engine_host_gpus(config, index)
    return (ray.remote(RolloutWorker)
            .options(**_on(placement, engine_bundles(config, placement, index)[0], engine_share,
                           True))
            .remote(config.rollout_backend))
