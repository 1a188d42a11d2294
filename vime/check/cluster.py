"""V6xx GPU budget and V7xx cluster, Ray and file-system rules."""

from __future__ import annotations

import ipaddress

from vime.check.registry import Finding, rule
from vime.diagnostics import Diagnostic
from vime.resolve import GPU_MEMORY_GIB
from vime.resolve.spec import Spec

# Paths that are private to one machine; a multi-node job cannot share them.
NODE_LOCAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/local", "/scratch/local")


@rule("V601", "colocated-uses-every-gpu", enforced_by="vime")
def colocated_uses_every_gpu(spec: Spec):
    """Colocated runs put the actor and the rollout on the same, all, GPUs.

    With colocate = true (slime's --colocate) Megatron and vLLM alternate on every GPU of
    the allocation; a different train.num_gpus or inference.num_gpus contradicts that and
    slime would build placement groups of the wrong size.
    Fix: remove train.num_gpus and inference.num_gpus (vime derives them), or set
    colocate = false to give each side its own GPUs."""
    if not spec.train.colocate:
        return
    world = spec.derived.world_size
    for key, value in (("train.num_gpus", spec.train.num_gpus),
                       ("inference.num_gpus", spec.inference.num_gpus)):
        if value != world:
            yield Finding(key, f"colocated, but {key} = {value} is not the cluster's "
                          f"{spec.cluster.nodes} × {spec.cluster.gpus_per_node} = {world} GPUs",
                          help=f"remove {key}, or set train.colocate = false",
                          related=("train.colocate",))


@rule("V602", "disaggregated-gpu-budget", enforced_by="vime")
def disaggregated_gpu_budget(spec: Spec):
    """Without colocation the actor and the rollout need separate GPUs that exist.

    The actor takes the first train.num_gpus GPUs in (node, gpu) order and the rollout
    engines inference.num_gpus after them; together they cannot exceed the allocation, and
    GPUs left over are paid for and idle.
    Fix: set train.num_gpus (and inference.num_gpus) to add up to nodes × gpus_per_node."""
    if spec.train.colocate:
        return
    world = spec.derived.world_size
    actor, rollout = spec.train.num_gpus, spec.inference.num_gpus
    if spec.origin("train.num_gpus").kind == "derived" and actor == 0:
        yield Finding("train.colocate", "colocate = false, but train.num_gpus is not set: "
                      "vime cannot tell how many GPUs train",
                      help=f"set train.num_gpus (for example {world // 2}) under [train]")
    elif actor + rollout > world or rollout <= 0:
        yield Finding("train.num_gpus",
                      f"actor {actor} + rollout {rollout} GPUs = {actor + rollout}, "
                      f"but the cluster has {world}",
                      help=f"train.num_gpus + inference.num_gpus = {world}, each at least 1",
                      related=("inference.num_gpus", "cluster.nodes"))
    elif actor + rollout < world:
        yield Finding("inference.num_gpus",
                      f"{world - actor - rollout} of {world} GPUs are used by neither the actor "
                      f"({actor}) nor the rollout ({rollout})", severity="warning",
                      help=f"inference.num_gpus = {world - actor}, or fewer nodes",
                      related=("train.num_gpus",))


@rule("V701", "multi-node-shared-paths", severity="warning", enforced_by="vime")
def multi_node_shared_paths(spec: Spec):
    """On several nodes, model, data and output folders must be on a shared file system.

    Every node reads the checkpoint and the prompts and writes logs and checkpoints under
    output_dir (the seed: "put the model and data on a path every node can reach, such as
    NFS"). A node-local folder such as /tmp exists on each node separately: workers on
    other nodes find nothing, or write checkpoints the head never sees. A relative path is
    made absolute by `vime submit` (vime/launch/paths.py): from the spec's folder, or for
    output_dir from the folder vime runs in; that folder must then be shared too.
    `vime submit` to Slurm looks further, on the machine it runs on: the paths made absolute,
    and the Python that job.sbatch runs on every node (vime's own, its virtual environment's).
    One on a file system of that machine only (tmpfs, a container's overlay, a local disk's
    ext4 or xfs) gets this warning too, naming the mount; it does not apply when the nodes
    mount that folder from the machine (an NFS export of it).
    Fix: absolute paths on a shared file system (NFS, Lustre, GPFS), and vime installed in a
    virtual environment there (or at the same path on every node)."""
    if spec.cluster.nodes <= 1:
        return
    for key, value in (("experiment.output_dir", spec.experiment.output_dir),
                       ("model.hf_checkpoint", spec.model.hf_checkpoint),
                       ("model.torch_dist_checkpoint", spec.model.torch_dist_checkpoint),
                       ("data.prompt_data", spec.data.prompt_data)):
        if value is None:
            continue
        if not value.startswith(("/", "~")):
            base = ("the folder vime runs in" if key == "experiment.output_dir"
                    else "the spec's folder")
            why = (f"is relative: `vime submit` makes it absolute from {base}, which all "
                   f"{spec.cluster.nodes} nodes must mount")
        elif value.startswith(NODE_LOCAL_PREFIXES):
            why = f"looks node-local, but the job has {spec.cluster.nodes} nodes"
        else:
            continue
        yield Finding(key, f"{key} = {value!r} {why}",
                      help="use an absolute path on a file system every node mounts")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@rule("V702", "dashboard-exposed", severity="warning", enforced_by="vime")
def dashboard_exposed(spec: Spec):
    """The Ray dashboard listens on a non-loopback address.

    The seed starts Ray with --dashboard-host=0.0.0.0. Ray's dashboard and job API have no
    authentication: anyone who can reach the port can submit jobs that run as you on the
    cluster. Reach it through an SSH tunnel instead.
    Fix: dashboard_host = "127.0.0.1" and `ssh -L 8265:localhost:8265 <head node>`."""
    host = spec.cluster.ray.dashboard_host
    if not _loopback(host):
        yield Finding("cluster.ray.dashboard_host",
                      f"dashboard_host = {host!r} exposes Ray's unauthenticated job API",
                      help='dashboard_host = "127.0.0.1" and an SSH tunnel to the head node')


@rule("V703", "gpu-memory-known", severity="warning", enforced_by="vime")
def gpu_memory_known(spec: Spec):
    """vime does not know this GPU's memory, so the memory plan (and V8xx) is skipped.

    The card table covers the common training GPUs; names are matched without regard to
    case or form factor ("h100", "NVIDIA-A100-SXM4-80GB"). An A100 comes in two sizes, so
    it must be written A100-80GB or A100-40GB. For any other card give its memory.
    Fix: cluster.gpu_memory_gib = <GiB per GPU>, or a known cluster.gpu."""
    if spec.derived.gpu_memory_gib is None:
        gpu = spec.cluster.gpu
        sizes = sorted(n for n in GPU_MEMORY_GIB if n.startswith(gpu.upper() + "-"))
        yield Finding("cluster.gpu", f"unknown GPU {gpu!r}: its memory is not known, so the "
                      "memory plan is skipped",
                      help=f"write {' or '.join(sizes)}, or set cluster.gpu_memory_gib" if sizes
                      else f"set cluster.gpu_memory_gib, or gpu = one of "
                      f"{', '.join(sorted(GPU_MEMORY_GIB))}")


# sbatch options vime sets from the spec (vime/emit/sbatch.py); extra_args must not set them
# again. Each maps to the spec key that sets it, or None where vime owns the option.
MANAGED_SBATCH: dict[str, str | None] = {
    "--nodes": "cluster.nodes", "-N": "cluster.nodes",
    "--ntasks-per-node": None,
    "--gpus-per-node": "cluster.gpus_per_node", "--gres": "cluster.gpus_per_node",
    "--time": "cluster.slurm.time", "-t": "cluster.slurm.time",
    "--partition": "cluster.slurm.partition", "-p": "cluster.slurm.partition",
    "--account": "cluster.slurm.account", "-A": "cluster.slurm.account",
    "--qos": "cluster.slurm.qos",
    "--constraint": "cluster.slurm.constraint", "-C": "cluster.slurm.constraint",
    "--reservation": "cluster.slurm.reservation",
    "--exclusive": "cluster.slurm.exclusive",
    "--job-name": "experiment.name", "-J": "experiment.name",
    "--output": None, "-o": None, "--error": None, "-e": None,
    "--cpus-per-task": "cluster.slurm.cpus_per_task", "-c": "cluster.slurm.cpus_per_task",
    "--signal": None,
}


@rule("V704", "slurm-extra-args-contradict-spec", enforced_by="vime")
def slurm_extra_args_contradict_spec(spec: Spec):
    """cluster.slurm.extra_args sets an option that vime writes from the spec.

    A second --nodes or --gpus-per-node makes the allocation differ from the plan that was
    checked (sbatch takes the last one), and --output/--error would move the logs out of
    the job folder that `vime logs` reads.
    Fix: use the spec keys (cluster.nodes, gpus_per_node, [cluster.slurm] partition, time,
    account, qos, constraint, reservation, exclusive, cpus_per_task)."""
    for index, arg in enumerate(spec.cluster.slurm.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_SBATCH:
            key = MANAGED_SBATCH[flag]
            yield Finding(f"cluster.slurm.extra_args[{index}]",
                          f"extra_args sets {flag}, which vime writes "
                          + ("from the spec" if key else "itself"),
                          help=f"remove it and set {key} instead" if key else
                          "remove it: no spec key sets it, vime writes it itself (the job's "
                          "logs, tasks and requeue signal)")


# Variables by which the CUDA, ROCm and NVIDIA container runtimes (and Ray, which reads them
# to count a node's GPUs) decide which devices a process sees.
VISIBLE_DEVICES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                   "HIP_VISIBLE_DEVICES")


def visible_count(name: str, value: str) -> int | None:
    """How many devices a visible-devices list leaves; None when vime cannot tell (a shell
    expansion, NVIDIA's "all"). CUDA stops at the first invalid entry ("0,1,-1,3" shows
    two); an empty list, "none" and "void" hide every device."""
    text = value.strip()
    if "$" in text or "`" in text or (name == "NVIDIA_VISIBLE_DEVICES" and text == "all"):
        return None
    if text in ("", "none", "void", "NoDevFiles"):
        return 0
    count = 0
    for entry in text.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def _hiding(environ, need: int):
    """(name, value, count) of each visible-devices variable in environ that shows fewer than
    need devices (values vime cannot count are left out)."""
    for name in VISIBLE_DEVICES:
        if name in environ:
            value = str(environ[name])
            count = visible_count(name, value)
            if count is not None and count < need:
                yield name, value, count


@rule("V707", "visible-devices-show-the-plans-gpus", enforced_by="ray")
def visible_devices_show_the_plans_gpus(spec: Spec):
    """[cluster.env] sets a visible-devices variable that hides GPUs the plan needs.

    [cluster.env] is exported on every node before Ray starts. Ray counts a node's GPUs
    through CUDA_VISIBLE_DEVICES (ROCR_ and HIP_VISIBLE_DEVICES on AMD), and the NVIDIA
    container runtime shows a container only NVIDIA_VISIBLE_DEVICES; a list shorter than
    cluster.gpus_per_node leaves Ray fewer GPUs than the plan places, so the job waits at
    Ray start for GPUs that never appear ("waiting for N GPUs") or the placement groups of
    the actor and the engines are never scheduled. Slurm already sets CUDA_VISIBLE_DEVICES
    to the job's own GPUs; vime needs no help to choose them.
    `vime submit --local` checks the same in its own environment, which its nodes inherit
    (each logical node takes its slice of CUDA_VISIBLE_DEVICES): a list shorter than
    cluster.nodes × cluster.gpus_per_node is this error before anything starts. A Slurm job
    is not checked there: sbatch passes the submit environment on, but Slurm sets
    CUDA_VISIBLE_DEVICES to the GPUs it allocates (--gpus-per-node).
    Not checked: values that use shell expansions, and the torch backends on both sides
    (which may be meant to run on the CPU).
    Fix: remove the variable from [cluster.env] (or unset it before `vime submit --local`),
    or list as many devices as cluster.gpus_per_node (and set gpus_per_node to the GPUs you
    mean to use)."""
    if spec.train.backend == spec.inference.backend == "torch":
        return
    need = spec.cluster.gpus_per_node
    for name, value, count in _hiding(spec.cluster.env, need):
        yield Finding(f"cluster.env.{name}",
                      f"{name} = {value!r} shows {count} of the {need} GPUs per node the "
                      "plan places: Ray would wait for GPUs that it cannot see",
                      help=f"remove {name} from [cluster.env] (Slurm sets the job's GPUs), "
                      f"or cluster.gpus_per_node = {count}" if count else
                      f"remove {name} from [cluster.env]",
                      related=("cluster.gpus_per_node",))


def hidden_in_local_environment(spec: Spec, environ) -> list[Diagnostic]:
    """V707 for `vime submit --local`: the launcher's own visible-devices variables, which
    its logical nodes inherit, against the GPUs the plan places on this machine."""
    if spec.train.backend == spec.inference.backend == "torch":
        return []
    need = spec.cluster.nodes * spec.cluster.gpus_per_node
    found = []
    for name, value, count in _hiding(environ, need):
        found.append(Diagnostic(
            "error", "V707", ("environment", name),
            f"{name}={value!r} in the environment of `vime submit --local` shows {count} "
            f"of the {need} GPUs the plan places on this machine: its Ray would wait for "
            "GPUs that it cannot see",
            help=f"unset {name}, or plan for the GPUs it shows (cluster.nodes × "
            f"cluster.gpus_per_node = {count})" if count else f"unset {name}"))
    return found
