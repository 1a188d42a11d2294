"""Rollout engines under watch: health checks, restarts, retried requests.

`SupervisedRollout` is a `RolloutGroup` (runtime/workers/groups.py) whose calls survive an engine
dying: an engine whose actor is gone, that does not answer `ping` within `health_timeout_s`,
or whose generation passes `generate_timeout_s` is killed and replaced on the same bundle,
given the current weights, and sent its share of the requests again (their seeds make the
retried samples the same). Each engine may be replaced `max_restarts` times (MAX_RESTARTS);
the next death raises `EngineFailed`. When an engine counts as unhealthy, weight pushes that
fail, and the replacement: docs/design.md, "Rollout engines under watch".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from runtime.core.hosts import split
from runtime.workers.groups import RolloutGroup

MAX_RESTARTS = 3  # per engine and run
HEALTH_TIMEOUT_S = 60.0  # an idle engine answers a ping in milliseconds
GENERATE_TIMEOUT_S = 3600.0  # one rollout's generation; longer is taken for a hang


class EngineFailed(RuntimeError):
    """An engine died more often than max_restarts allows."""


class SupervisedRollout(RolloutGroup):
    def __init__(self, workers: Sequence, make_engine: Callable[[int], object],
                 nodes: Sequence[Sequence[int]], max_restarts: int = MAX_RESTARTS,
                 health_timeout_s: float = HEALTH_TIMEOUT_S,
                 generate_timeout_s: float = GENERATE_TIMEOUT_S,
                 log: Callable[[str], None] = print,
                 restore_weights: Callable[[RolloutGroup], None] | None = None):
        super().__init__(workers)
        self.make_engine = make_engine  # index -> a started engine actor on its bundle
        self.nodes = [tuple(n) for n in nodes]
        self.max_restarts = max_restarts
        self.health_timeout_s = health_timeout_s
        self.generate_timeout_s = generate_timeout_s
        self.log = log
        self.restarts = [0] * len(self.workers)
        # new engine group -> the current weights pushed into it; None: a new engine starts
        # with the weights it loads itself
        self.restore_weights = restore_weights

    # ----------------------------------------------------------------------------- health

    def check_health(self, during: str = "") -> list[int]:
        """Ping every engine; replace those that are dead or do not answer in time.
        Returns the indices replaced."""
        import ray

        refs = [w.ping.remote() for w in self.workers]
        replaced = []
        for index, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=self.health_timeout_s)
            except ray.exceptions.GetTimeoutError:
                self.replace(index, f"no answer to a health check in "
                                    f"{self.health_timeout_s:g} s{during}")
                replaced.append(index)
            except ray.exceptions.RayActorError as err:
                self.replace(index, _died(err) + during)
                replaced.append(index)
        return replaced

    def receive_weights(self, push: Callable[[], int]) -> int:
        """push() made again after the engines that died in it are replaced (each given the
        current weights by restore_weights), up to max_restarts per engine.

        Raises:
            EngineFailed: an engine died more often than max_restarts allows.
        """
        while True:
            try:
                return push()
            except Exception:
                if not self.check_health(" during the weight push"):
                    raise  # every engine is alive: the push's own failure

    def replace(self, index: int, why: str) -> None:
        """Kill engine `index` and start its successor with the current weights, or fail."""
        import ray

        self.restarts[index] += 1
        where = _nodes(self.nodes[index])
        if self.restarts[index] > self.max_restarts:
            raise EngineFailed(
                f"rollout engine {index} on {where}: {why}; it has been restarted "
                f"{self.max_restarts} time(s) already (max_restarts = {self.max_restarts}), "
                "so the run stops here")
        self.log(f"vime: rollout engine {index} on {where}: {why}; restart "
                 f"{self.restarts[index]} of {self.max_restarts}")
        with contextlib.suppress(Exception):  # already gone: nothing to release
            ray.kill(self.workers[index], no_restart=True)
        self.workers[index] = self.make_engine(index)
        if self.restore_weights is not None:
            self.restore_weights(RolloutGroup([self.workers[index]]))

    # ---------------------------------------------------------------------------- calling

    def generate(self, requests, params):
        import ray

        self.check_health()
        shares = split(len(requests), self.size)
        parts: list = [None] * self.size

        def submit(index: int):
            batch = [requests[i] for i in shares[index]]
            return self.workers[index].generate.remote(batch, params), time.monotonic()

        pending = {index: submit(index) for index in range(self.size)}
        while pending:
            refs = {ref: index for index, (ref, _) in pending.items()}
            ready, _ = ray.wait(list(refs), num_returns=1,
                                timeout=min(self.health_timeout_s, self.generate_timeout_s))
            for ref in ready:
                index = refs[ref]
                try:
                    parts[index] = ray.get(ref)
                    del pending[index]
                except ray.exceptions.RayActorError as err:
                    self.replace(index, _died(err) + " during generation")
                    pending[index] = submit(index)
            now = time.monotonic()
            for index, (ref, since) in list(pending.items()):
                if ref not in ready and now - since > self.generate_timeout_s:
                    self.replace(index, f"generation not done after {self.generate_timeout_s:g} s")
                    pending[index] = submit(index)
        return [g for part in parts for g in part]

    def _each(self, method: str, *args) -> list:
        """method on every engine, an engine that died in the call replaced and asked again."""
        import ray

        refs = [getattr(w, method).remote(*args) for w in self.workers]
        out = []
        for index, ref in enumerate(refs):
            while True:
                try:
                    out.append(ray.get(ref))
                    break
                except ray.exceptions.RayActorError as err:
                    self.replace(index, _died(err) + f" during {method}")
                    ref = getattr(self.workers[index], method).remote(*args)
        return out

    def sleep(self, level: int) -> None:
        self._each("sleep", level)

    def wake(self, tags) -> None:
        self._each("wake", list(tags))

    def resident_bytes(self) -> int:
        return sum(self._each("resident_bytes"))

    def rollout_numbers(self) -> dict[str, float]:
        """Return the engines replaced so far, for the rollout's metrics."""
        return {"rollout/engine_restarts": sum(self.restarts)}

    def where(self) -> list[dict]:
        return self._each("where")


def _died(err: Exception) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"its actor died ({type(err).__name__}{': ' + first[:200] if first else ''})"


def _nodes(nodes: tuple[int, ...]) -> str:
    return ("node " if len(nodes) == 1 else "nodes ") + ", ".join(map(str, nodes))


def supervise(rollout: RolloutGroup, config, placement, cpu_threads: int,
              **options) -> SupervisedRollout:
    """The driver's engines (build.ray_groups) under a supervisor that restarts them on
    their bundles with their slices."""
    import ray

    from runtime.workers import build

    def make_engine(index: int):
        engine = build.new_engine_actor(config, placement, index)
        bundles = build.engine_bundles(config, placement, index)
        ray.get(engine.start.remote(config.engine_slice(index, cpu_threads, bundles)))
        return engine

    nodes = [sorted({g["node"] for g in entry["gpus"]}) for entry in config.engines]
    return SupervisedRollout(rollout.workers, make_engine, nodes, **options)
