"""Checkpoints: one folder per saved rollout, made visible only once complete.

    <save dir>/rollout_000019/       train/ (what each rank's backend wrote), state.json,
                                     vime_checkpoint.json
    <save dir>/latest                "rollout_000019"
    <save dir>/hf/rollout_000019/    model.safetensors, config.json, tokenizer files

A checkpoint is written into `.partial-rollout_000019-<random>/`, checked (`prepare`), then
renamed into place and `latest` moved (`commit`); a resume checks it again (`verify`). With
checkpoint.async_save, `begin` returns once the ranks hold a host copy of their state and
write it in the background; `finish` waits for the writes and checks them (a `prepare` in two
halves), so `latest` moves only once every file is on disk. What
each file holds and what a checkpoint guarantees: docs/design.md, "Checkpoints";
docs/runtime.md, "What survives a fault".
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runtime.core import hf_folder
from runtime.core.slices import JobConfig
from vime import __version__, run_checkpoint
from vime.launch.local import pid_alive, process_start
from vime.resolve.model import arch_from_config

STATE = run_checkpoint.STATE_FILE
LATEST = run_checkpoint.LATEST_FILE
FORMAT = 1
PARTIAL = ".partial-"
# a corrupt checkpoint passed over by checkpoint.on_corrupt = "previous" is renamed to
# corrupt-<its name>: kept for inspection, out of the way of the next save of its rollout
CORRUPT = "corrupt-"
HF_DIR = "hf"  # HF model folders (checkpoint.save_hf_interval), beside the checkpoints
# free space asked for before a save, as a multiple of the previous save's size (a save is
# written beside the previous checkpoint before that one can be removed by keep_last)
SPACE_MARGIN = 1.1
HASH_CHUNK = 8 << 20
# free bytes under which a failed save is taken as a full disk
LOW_SPACE_BYTES = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read: the message names the folder and the fix."""


@dataclass(frozen=True)
class Pending:
    """A save written and checked, not yet visible: `commit` renames it into place."""

    rollout_id: int
    partial: Path
    final: Path


def record_of(config: JobConfig) -> dict:
    """The vime_checkpoint.json of this job's checkpoints: its model, backend and layout."""
    return run_checkpoint.record(arch_from_config(dict(config.model.arch)), config.train_backend,
                                 config.parallel, __version__)


def hf_due(config: JobConfig, rollout_id: int) -> bool:
    """Whether rollout_id's weights go to an HF folder: every checkpoint.save_hf_interval
    rollouts and after the last (0: never)."""
    every = config.save_hf_interval
    return every > 0 and ((rollout_id + 1) % every == 0 or rollout_id + 1 == config.num_rollout)


def _write_files(folder: Path, files: Mapping[str, bytes] | None) -> None:
    """The loop's own files of a checkpoint (name -> content), beside state.json."""
    for name, content in (files or {}).items():
        (folder / name).write_bytes(content)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            with open(Path(folder) / name, "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(folder))


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on folders; the rename still orders
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


STATE_SUM = "state_sha256"


def state_digest(state: dict) -> str:
    """The sha256 of state.json's content without its own checksum (STATE_SUM): the keys
    sorted, so it does not depend on the file's layout."""
    content = {key: value for key, value in state.items() if key != STATE_SUM}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def manifest(root: Path) -> dict[str, dict]:
    """{path relative to root: {"bytes", "sha256"}} of every file under root, hashed in
    parallel threads (hashlib releases the GIL on large reads)."""
    paths = _files(root)
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(paths)))) as pool:
        digests = list(pool.map(_sha256, paths))
    return {str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": d}
            for p, d in zip(paths, digests, strict=True)}


def _tree_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in _files(root))


def _rename_into_place(partial: Path, final: Path) -> None:
    """A written folder renamed to its final name, in the same parent; a folder already there
    (the same rollout saved again by a resumed run) is moved aside first and then removed."""
    if final.exists():
        old = final.parent / _partial_name(f"old-{final.name}")
        os.rename(final, old)
        os.rename(partial, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(partial, final)
    _fsync_dir(final.parent)


def _partial_name(final_name: str) -> str:
    """.partial-<checkpoint>-<random>-<pid>.<pid's start time>@<host>: who writes it, for the
    clean-up."""
    pid = os.getpid()
    return (f"{PARTIAL}{final_name}-{uuid.uuid4().hex[:8]}-{pid}.{process_start(pid) or 0}"
            f"@{socket.gethostname()}")


def aside_name(folder: Path) -> Path:
    """Where a corrupt checkpoint is moved aside: corrupt-<name>, or corrupt-<name>-2, -3 ...
    when that is taken. Neither `latest`, resume nor keep_last reads these folders."""
    aside, number = folder.parent / f"{CORRUPT}{folder.name}", 2
    while aside.exists():
        aside, number = folder.parent / f"{CORRUPT}{folder.name}-{number}", number + 1
    return aside


def partial_is_stale(folder: Path) -> bool:
    """Whether a .partial-* folder's writer is gone: a writer on this host whose pid is not
    alive, or is now another process (its start time differs). A writer on another host, or
    a folder whose name gives none, is left alone."""
    owner, at, host = folder.name.rpartition("@")
    if not at or host != socket.gethostname():
        return False
    pid, dot, start = owner.rpartition("-")[2].partition(".")
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    if not pid_alive(int(pid)):
        return True
    return bool(dot) and start.isdigit() and int(start) != (process_start(int(pid)) or 0)


def partial_is_own(folder: Path) -> bool:
    """Whether a .partial-* folder was named by this process (see _partial_name)."""
    pid = os.getpid()
    return folder.name.endswith(f"-{pid}.{process_start(pid) or 0}@{socket.gethostname()}")


def disk_full(err: BaseException, free_bytes: int | None) -> bool:
    """Whether a failed write failed for lack of space: ENOSPC anywhere in the exception's
    chain (a Ray actor's error carries the remote one as .cause), the OS's words in its text,
    or almost no space left when it failed (torch's zip writer reports a short write as
    "unexpected pos ..." without the errno)."""
    seen, stack = set(), [err]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(current):
            return True
        stack += [getattr(current, "cause", None), current.__cause__, current.__context__]
    return free_bytes is not None and free_bytes < LOW_SPACE_BYTES


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def no_space(folder: Path) -> CheckpointError:
    return CheckpointError(
        f"No space left on device while saving a checkpoint in {folder}: free space on that "
        "file system, or set checkpoint.keep_last to keep fewer checkpoints, or point "
        "model.save at a larger one; the previous checkpoint is intact")


def _unwritable(folder: Path) -> str | None:
    """None when folder can be made and a folder made in it, else why not (the OS's words and
    the path).

    Raises:
        CheckpointError: no space left there (no_space).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f"{PARTIAL}probe-{uuid.uuid4().hex[:8]}-{os.getpid()}@" \
            f"{socket.gethostname()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise no_space(folder) from None
        return f"{err.strerror or err} ({err.filename or folder})"
    return None


def verify(folder: Path, checksums: bool = True) -> str | None:
    """None when a checkpoint's files match what its state.json lists (sizes, and sha256
    with checksums) and state.json matches its own checksum (always: it is small), else what
    is wrong, naming the file. A state.json without its checksum, or without the file list
    (written before they existed), is not checked for what it lacks."""
    folder = Path(folder)
    try:
        state = json.loads((folder / STATE).read_text())
    except FileNotFoundError:
        return f"{folder / STATE} is missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{folder / STATE} cannot be read: {type(err).__name__}: {err}"
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return (f"{folder / STATE}: checkpoint format "
                f"{state.get('format') if isinstance(state, dict) else None}, this vime reads "
                f"{FORMAT}")
    listed = state.get("files")
    if listed is not None and (not isinstance(listed, dict) or not all(
            isinstance(want, dict) and isinstance(want.get("bytes"), int)
            and isinstance(want.get("sha256"), str) for want in listed.values())):
        return (f"{folder / STATE}: its file list is not {{name: {{\"bytes\", \"sha256\"}}}} "
                "as a save writes it (the file was edited or damaged)")
    if STATE_SUM in state and state[STATE_SUM] != state_digest(state):
        return (f"{folder / STATE} does not match its recorded sha256 (the file changed "
                "after the save)")
    if listed is None:
        return None
    for name, want in sorted(listed.items()):
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if size != want["bytes"]:
            return f"{path} has {size} bytes, its checkpoint recorded {want['bytes']}"
        if not checksums:
            continue
        try:
            digest = _sha256(path)
        except OSError as err:
            return f"{path} cannot be read: {err.strerror or err}"
        if digest != want["sha256"]:
            return f"{path} does not match its recorded sha256 (the file changed after the save)"
    return None


@dataclass(frozen=True)
class Writing:
    """A save whose state the ranks copied and are writing in the background into `partial`:
    `finish` waits for them and checks the files."""

    rollout_id: int
    partial: Path
    final: Path
    state: dict
    record: dict | None


class Checkpoints:
    def __init__(self, save_dir: Path, load_dir: Path | None = None, keep_last: int = 0,
                 log=lambda message: None):
        self.save_dir = Path(save_dir)
        self.load_dir = Path(load_dir) if load_dir else self.save_dir
        self.keep_last = keep_last
        self.log = log

    @staticmethod
    def name(rollout_id: int) -> str:
        return f"rollout_{rollout_id:06d}"

    # ------------------------------------------------------------------------------ read

    def complete(self, folder: Path | None = None) -> list[Path]:
        """Complete checkpoints of a folder, oldest first."""
        return run_checkpoint.complete(Path(folder or self.load_dir))

    def latest(self) -> Path | None:
        """The checkpoint `latest` names, or the newest complete one when `latest` is missing
        or names a folder that is gone (the choice `vime plan` reads too)."""
        return run_checkpoint.latest(self.load_dir)

    def candidates(self) -> list[Path]:
        """The checkpoints a resume may load, the first choice first: the one `latest`
        names, then the older ones, newest first (when `latest` is missing or names a
        folder that is gone: every one, newest first). Complete or not: a rollout_* folder
        is only ever made by the rename of a complete save, so an incomplete one is damage
        and is named, not skipped."""
        try:
            entries = list(self.load_dir.iterdir())
        except OSError:
            return []
        found = sorted((p for p in entries if p.name.startswith("rollout_") and p.is_dir()),
                       reverse=True)
        try:
            named = (self.load_dir / LATEST).read_text().strip()
        except (OSError, UnicodeDecodeError):
            named = ""
        if named and (self.load_dir / named) in found:
            return [p for p in found if p.name <= named]
        return found

    def resume_point(self, on_corrupt: str = "stop") -> Path | None:
        """The newest checkpoint whose files match its record, or None when there is none.
        With on_corrupt "previous", a corrupt one in the save folder is moved aside
        (`aside_name`), so that the next save of its rollout does not replace it; one in
        another load folder is left where it is.

        Raises:
            CheckpointError: the newest checkpoint is corrupt or incomplete and on_corrupt is
                "stop" (the message names it, what is wrong and the previous one); with
                "previous" it is named in the log and the next older one is tried. Also: a
                corrupt checkpoint of the save folder cannot be moved aside.
        """
        found = self.candidates()
        for index, folder in enumerate(found):
            problem = verify(folder)
            if problem is None:
                if STATE_SUM not in self.read_state(folder):
                    self.log(f"vime: checkpoint {folder}: its state.json has no checksum "
                             "(written by an older vime), so its own content is not checked")
                return folder
            older = found[index + 1] if index + 1 < len(found) else None
            if on_corrupt != "previous":
                then = (f"set checkpoint.on_corrupt = \"previous\" to resume from {older.name} "
                        "(the corrupt one is then moved aside, kept)" if older
                        else "no older checkpoint is left")
                raise CheckpointError(
                    f"checkpoint {folder} is corrupt or incomplete: {problem}. Move it aside "
                    f"to keep it for inspection, or {then}")
            kept = self._move_aside(folder)
            self.log(f"vime: checkpoint {folder} is corrupt or incomplete ({problem}); "
                     f"checkpoint.on_corrupt = \"previous\": {kept}; trying "
                     f"{older.name if older else 'none (starting fresh)'}")
        return None

    def _move_aside(self, folder: Path) -> str:
        """A corrupt checkpoint of the save folder renamed to aside_name; what was done, in
        the words of the log.

        Raises:
            CheckpointError: it cannot be renamed (the next save would replace it).
        """
        if os.path.abspath(folder.parent) != os.path.abspath(self.save_dir):
            return f"left where it is (checkpoints are saved to {self.save_dir})"
        aside = aside_name(folder)
        try:
            os.rename(folder, aside)
        except OSError as err:
            raise CheckpointError(
                f"checkpoint {folder} is corrupt and cannot be moved aside to {aside} "
                f"({err.strerror or err}): the next save of its rollout would replace it. "
                "Move it yourself, then resubmit") from None
        _fsync_dir(self.save_dir)
        return (f"moved aside to {aside}, kept for inspection (the next save of its rollout "
                "goes beside it)")

    @staticmethod
    def read_state(folder: Path) -> dict:
        """Raises:
            CheckpointError: state.json is missing, unreadable or of another format."""
        path = folder / STATE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing: the checkpoint is incomplete") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{path} cannot be read: {type(err).__name__}: {err}") \
                from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise CheckpointError(f"{folder}: checkpoint format "
                                  f"{state.get('format') if isinstance(state, dict) else None}, "
                                  f"this vime reads {FORMAT}")
        return state

    # ----------------------------------------------------------------------------- write

    def check_writable(self) -> None:
        """Raises CheckpointError when the save folder cannot be made or written (a
        read-only model.save, a file in its place): said at the start, not at the first
        save."""
        problem = _unwritable(self.save_dir)
        if problem:
            raise CheckpointError(f"cannot write checkpoints in {self.save_dir}: {problem}; "
                                  "make it a writable folder or point model.save elsewhere")

    def check_hf_writable(self) -> None:
        """Raises CheckpointError when the HF folders' folder (<save dir>/hf) cannot be made
        or written: said at the start, not at the first export."""
        problem = _unwritable(self.hf_dir)
        if problem:
            raise CheckpointError(
                f"cannot write HF folders in {self.hf_dir}: {problem}; make it a writable "
                "folder, point model.save elsewhere, or set checkpoint.save_hf_interval = 0")

    def expected_bytes(self) -> int:
        """The size of the newest checkpoint in the save folder (0 when there is none)."""
        newest = next(iter(sorted(self.complete(self.save_dir), reverse=True)), None)
        if newest is None:
            return 0
        try:
            listed = json.loads((newest / STATE).read_text()).get("files")
            return sum(int(f["bytes"]) for f in listed.values())
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return _tree_bytes(newest)  # no file list, or a damaged one

    def check_space(self, needed: int | None = None) -> None:
        """Raises CheckpointError when the save folder's file system has less free space
        than the next save needs (the previous save's size, SPACE_MARGIN more)."""
        needed = self.expected_bytes() if needed is None else needed
        if not needed:
            return
        try:
            free = shutil.disk_usage(self.save_dir).free
        except OSError:
            return
        if free < needed * SPACE_MARGIN:
            raise CheckpointError(
                f"not enough free space for the next checkpoint in {self.save_dir}: "
                f"{free / 2**20:.1f} MiB free, the previous checkpoint took "
                f"{needed / 2**20:.1f} MiB. Free space on that file system, set "
                "checkpoint.keep_last to keep fewer checkpoints, or point model.save at a "
                "larger one")

    def _remove_stale_partials(self) -> None:
        for stale in self.save_dir.glob(f"{PARTIAL}*"):
            if partial_is_stale(stale):
                shutil.rmtree(stale, ignore_errors=True)

    def prepare(self, rollout_id: int, train, state: dict, record: dict | None = None,
                files: Mapping[str, bytes] | None = None) -> Pending:
        """train.save(folder) writes the backends' part (every rank, into the same folder);
        `files` (name -> content) beside it; then the file list with checksums, state.json
        and the record (record_of), fsync, and the list checked against the disk. Nothing is
        visible until `commit`.

        Raises:
            CheckpointError: no space (said so), or the files written do not match.
        """
        final, partial = self._new_partial(rollout_id)
        with self._removed_on_failure(partial):
            partial.mkdir()
            train.save(partial / "train")
            _write_files(partial, files)
            self._seal(partial, rollout_id, state, record)
        return Pending(rollout_id, partial, final)

    def begin(self, rollout_id: int, train, state: dict, record: dict | None = None,
              files: Mapping[str, bytes] | None = None) -> Writing:
        """The first half of `prepare` for checkpoint.async_save: train.begin_save(folder)
        returns once every rank holds a host copy of its state, and the ranks write it in the
        background; `finish` completes the save.

        Raises:
            CheckpointError: no space (said so).
        """
        final, partial = self._new_partial(rollout_id)
        with self._removed_on_failure(partial):
            partial.mkdir()
            _write_files(partial, files)
            train.begin_save(partial / "train")
        # a copy as of now: the loop's state (the sampler's position) moves on meanwhile
        return Writing(rollout_id, partial, final, json.loads(json.dumps(state)), record)

    def finish(self, writing: Writing, train) -> tuple[Pending, float]:
        """The second half: train.finish_save() waits for every rank's write; then the file
        list, state.json and the record as `prepare` writes them. Returns the save, ready to
        commit, and the slowest rank's seconds of writing in the background.

        Raises:
            CheckpointError: no space (said so), or the files written do not match; the
                folder is removed, the previous checkpoint stays `latest`.
        """
        with self._removed_on_failure(writing.partial):
            seconds = train.finish_save()
            self._seal(writing.partial, writing.rollout_id, writing.state, writing.record)
        return Pending(writing.rollout_id, writing.partial, writing.final), seconds

    def abandon(self, writing: Writing, train) -> None:
        """A background save that is not to be kept: its writes waited for, then its folder
        removed (what the writes raised is raised after that)."""
        try:
            train.finish_save()
        finally:
            shutil.rmtree(writing.partial, ignore_errors=True)

    def _new_partial(self, rollout_id: int) -> tuple[Path, Path]:
        """(final folder, .partial-* folder to write it in), after the free space is checked.

        Raises:
            CheckpointError: less free space than the previous save took.
        """
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self._remove_stale_partials()
        self.check_space()
        final = self.save_dir / self.name(rollout_id)
        return final, self.save_dir / _partial_name(final.name)

    @contextlib.contextmanager
    def _removed_on_failure(self, partial: Path):
        """The folder removed when the block raises; a full disk said so (no_space)."""
        try:
            yield
        except BaseException as err:
            full = isinstance(err, Exception) and disk_full(err, _free_bytes(self.save_dir))
            shutil.rmtree(partial, ignore_errors=True)
            if full:
                raise no_space(self.save_dir) from err
            raise

    @staticmethod
    def _seal(partial: Path, rollout_id: int, state: dict, record: dict | None) -> None:
        """The file list with checksums, state.json and the record written beside what the
        ranks wrote, everything fsynced, and the list checked against the disk.

        Raises:
            CheckpointError: the files do not read back as written.
        """
        # as read back (integer keys become strings), so the digest is the reader's
        content = json.loads(json.dumps({"format": FORMAT, "rollout": rollout_id, **state,
                                         "files": manifest(partial)}))
        content[STATE_SUM] = state_digest(content)
        (partial / STATE).write_text(json.dumps(content, indent=1) + "\n")
        if record is not None:
            (partial / run_checkpoint.RECORD_FILE).write_text(
                json.dumps(record, indent=1) + "\n")
        _fsync_tree(partial)
        problem = verify(partial, checksums=False)  # the sums were read from the disk
        if problem:
            raise CheckpointError(f"the checkpoint of rollout {rollout_id} did not read "
                                  f"back as written: {problem}")

    def commit(self, pending: Pending) -> Path:
        """The prepared save renamed into place, then `latest` moved to it; then
        checkpoint.keep_last applied."""
        final, partial = pending.final, pending.partial
        if partial.exists() or not final.exists():  # else renamed by a commit stopped after it
            _rename_into_place(partial, final)
        pointer = self._pointer()
        pointer.write_text(final.name + "\n")
        with open(pointer, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(pointer, self.save_dir / LATEST)
        _fsync_dir(self.save_dir)
        self._apply_keep_last(final)
        return final

    def _pointer(self) -> Path:
        """The temporary file `latest` is replaced from: one per process, so that a commit
        stopped half way leaves nothing another commit does not replace."""
        return self.save_dir / f".{LATEST}.{os.getpid()}"

    def discard(self, pending: Pending) -> None:
        shutil.rmtree(pending.partial, ignore_errors=True)

    def end(self, pending: Pending | None, finish: bool) -> None:
        """At a stop (SIGTERM, Ctrl-C, an error) of the run: a save still pending is
        committed when `finish` (its rollout's metrics line is written), else removed; then
        this process's own `.partial-*` folders (a save or HF folder it was writing) and
        `latest` pointer are removed, so that none is left until the next save."""
        if pending is not None:
            if finish:
                self.commit(pending)
            else:
                self.discard(pending)
        for folder in (self.save_dir, self.hf_dir):
            for partial in folder.glob(f"{PARTIAL}*"):
                if partial_is_own(partial):
                    shutil.rmtree(partial, ignore_errors=True)
        self._pointer().unlink(missing_ok=True)

    def save(self, rollout_id: int, train, state: dict, record: dict | None = None) -> Path:
        """prepare, then commit."""
        return self.commit(self.prepare(rollout_id, train, state, record))

    # ------------------------------------------------------------------------- HF folders

    @property
    def hf_dir(self) -> Path:
        return self.save_dir / HF_DIR

    def hf_folders(self) -> list[Path]:
        """The complete HF folders of the save folder, oldest first."""
        try:
            entries = list(self.hf_dir.iterdir())
        except OSError:
            return []
        return sorted(p for p in entries if p.name.startswith("rollout_") and p.is_dir())

    def save_hf(self, rollout_id: int, train, hf_checkpoint: str | None,
                tokenizer=None) -> Path:
        """The actor's weights as an HF model folder, <save dir>/hf/rollout_XXXXXX/:
        train.save_hf writes model.safetensors and config.json into a `.partial-*` folder;
        the tokenizer files and config.json of hf_checkpoint are copied beside them (the
        run's tokenizer saved instead when that folder holds none); then fsync and a rename.
        Free space is checked first against the previous HF folder; checkpoint.keep_last
        bounds these folders as it bounds checkpoints. A folder of the same rollout (a
        resumed run) is replaced.

        Raises:
            CheckpointError: no space (said so), or the folder cannot be written.
        """
        self.hf_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.hf_dir.glob(f"{PARTIAL}*"):
            if partial_is_stale(stale):
                shutil.rmtree(stale, ignore_errors=True)
        previous = self.hf_folders()
        self.check_space(_tree_bytes(previous[-1]) if previous else 0)
        final = self.hf_dir / self.name(rollout_id)
        partial = self.hf_dir / _partial_name(final.name)
        try:
            partial.mkdir()
            train.save_hf(partial)
            if hf_checkpoint and (Path(hf_checkpoint) / hf_folder.CONFIG_FILE).is_file():
                shutil.copyfile(Path(hf_checkpoint) / hf_folder.CONFIG_FILE,
                                partial / hf_folder.CONFIG_FILE)
            # Path("") is the working folder: without hf_checkpoint nothing is copied
            if hf_checkpoint:
                hf_folder.copy_tokenizer(Path(hf_checkpoint), partial)
            if not (hf_checkpoint and hf_folder.has_tokenizer(Path(hf_checkpoint))) \
                    and hasattr(tokenizer, "save_pretrained"):
                tokenizer.save_pretrained(str(partial))
            if not (partial / hf_folder.WEIGHTS_FILE).is_file():
                raise CheckpointError(f"the HF folder of rollout {rollout_id} has no "
                                      f"{hf_folder.WEIGHTS_FILE}: the training backend wrote "
                                      "none")
            _fsync_tree(partial)
        except BaseException as err:
            full = isinstance(err, Exception) and disk_full(err, _free_bytes(self.hf_dir))
            shutil.rmtree(partial, ignore_errors=True)
            if full:
                raise no_space(self.hf_dir) from err
            if isinstance(err, OSError):
                raise CheckpointError(f"cannot write the HF folder {final}: "
                                      f"{err.strerror or err} ({err.filename or partial})") \
                    from err
            raise
        _rename_into_place(partial, final)
        self._keep_last_of(self.hf_folders(), final, self.hf_dir)
        return final

    def _apply_keep_last(self, newest: Path) -> None:
        self._keep_last_of(self.complete(self.save_dir), newest, self.save_dir)

    def _keep_last_of(self, kept: list[Path], newest: Path, folder: Path) -> None:
        """The newest keep_last folders up to `newest` stay. Folders of later rollouts (a run
        resumed from an older checkpoint, or loaded from another folder, meets those of the
        run it replaces) are neither counted nor removed: resume reads up to `latest`, and
        what they hold is the user's to keep or delete."""
        if self.keep_last < 1:
            return
        ours = [path for path in kept if path.name <= newest.name]
        for old in ours[:-self.keep_last]:
            if old != newest:
                gone = folder / _partial_name(f"old-{old.name}")
                try:
                    os.rename(old, gone)  # invisible first: a reader never meets half of it
                except OSError:
                    continue
                shutil.rmtree(gone, ignore_errors=True)
