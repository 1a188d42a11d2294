"""The hosts, groups and builders of runtime/workers/ under one name: host.py (TrainWorker,
RolloutWorker), groups.py (TrainGroup, RolloutGroup), build.py (ray_groups, local_groups,
spmd_group, the engine actors)."""

from runtime.workers.build import (  # noqa: F401
    engine_bundles,
    engine_host_gpus,
    local_groups,
    new_engine_actor,
    ray_groups,
    spmd_group,
)
from runtime.workers.groups import RolloutGroup, TrainGroup  # noqa: F401
from runtime.workers.host import (  # noqa: F401
    RolloutWorker,
    TrainWorker,
    _handle_key,
    actor_on_cuda,
)
