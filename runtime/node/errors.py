"""A failed job's error as one line for outcome.json and the terminal.

Ray's exceptions carry the whole remote traceback with ANSI colours in their message
(`RayTaskError(RuntimeError): [36mray::TrainWorker.load()[39m ...` and 25 lines after it).
The line says what failed (the actor's method), where (the training rank or engine, from the
job's placement.json, else the Ray worker's pid and node address), the remote exception's
last line, and where the full traceback is (the head's log, where the job prints it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# the first line of a RayTaskError's message (ray/exceptions.py: RayTaskError.__str__)
RAY_TASK = re.compile(r"ray::(?P<function>[\w.]+)\(\)(?: \(pid=(?P<pid>\d+), ip=(?P<ip>[^,)]+))?")


def plain(text: str) -> str:
    return ANSI.sub("", text)


def _last_line(err: BaseException) -> str:
    """What a traceback's last line says: `Type: first line of the message`."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and cause is not err:
        return _last_line(cause)
    lines = [line for line in plain(str(err)).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0].strip()}" if lines else type(err).__name__


def _who(job_dir: Path, pid: int | None) -> str | None:
    try:
        where = json.loads((job_dir / "placement.json").read_text())
    except (OSError, ValueError):
        return None
    for kind, label in (("train", "training rank"), ("rollout", "engine")):
        for index, host in enumerate(where.get(kind) or []):
            if isinstance(host, dict) and host.get("pid") == pid:
                return f"{label} {index} on {host.get('host', '?')}"
    return None


# the lines of an ActorDiedError's message that say which actor (ray/exceptions.py)
DIED_FIELD = re.compile(r"^\s*(?P<key>class_name|pid|ip): (?P<value>\S+)\s*$", re.MULTILINE)


def _dead_actor(text: str, job_dir: Path) -> str | None:
    """'RolloutWorker (engine 1 on host-a, pid 4242)' from an ActorDiedError's message, or
    None when the message names no actor."""
    fields = {m.group("key"): m.group("value") for m in DIED_FIELD.finditer(text)}
    if "class_name" not in fields:
        return None
    pid = int(fields["pid"]) if fields.get("pid", "").isdigit() else None
    where = _who(job_dir, pid)
    details = [part for part in (where, fields.get("ip") and not where and f"node {fields['ip']}",
                                 pid and f"pid {pid}") if part]
    return f"{fields['class_name']} ({', '.join(details)})" if details else fields["class_name"]


def one_line(err: BaseException, job_dir: Path, log: Path) -> str:
    names = {cls.__name__ for cls in type(err).__mro__}
    if "RayTaskError" in names or "RayActorError" in names:
        text = plain(str(err))
        found = RAY_TASK.search(text)
        dead = _dead_actor(text, job_dir)
        if found is None and dead:  # a call to an actor that had died
            first = text.strip().splitlines()[0]
            return f"{dead} died: {first} (full message in {log})"
        function = found.group("function") if found else "a Ray actor"
        pid = int(found.group("pid")) if found and found.group("pid") else None
        ip = found.group("ip") if found else None
        where = _who(job_dir, pid) or ", ".join(
            part for part in (ip and f"node {ip}", pid and f"pid {pid}") if part) or "Ray"
        what = _last_line(err) if "RayTaskError" in names else text.strip().splitlines()[0]
        if dead and "ActorDiedError" in what:  # the call failed because another actor died
            what = f"{dead} died ({what})"
        return f"{function} failed on {where}: {what} (full traceback in {log})"
    lines = [line for line in plain(str(err)).splitlines() if line.strip()]
    text = f"{type(err).__name__}: {lines[0].strip()}" if lines else type(err).__name__
    if len(lines) > 1:
        text += f" (full message in {log})"
    return text
