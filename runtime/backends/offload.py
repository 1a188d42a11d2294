"""Device storages moved to host memory and back, for a colocated actor that hands its GPU to
the engines between steps (what torch_memory_saver's pause and resume do for slime).

- One host buffer per kept storage, made at the first offload and reused by every later one;
  pinned where CUDA runs, so a copy goes at the bus's speed (docs/gpu-runs.md: pageable copies
  of a 4-layer Qwen3-30B-A3B slice's ~56 GB took 36-53 s a rollout on an H200).
- The copies run on a stream of their own and are waited for before a storage is freed or
  handed back, so no kernel of the compute stream waits behind them, nor they behind it.
- Dropped storages (the gradient buffers, which the next step zeroes before it adds to them)
  are freed without a copy, and come back with their size and unspecified contents.

MegatronTrainingBackend (megatron_train.py) uses one for its DDP buffers and Adam's state.

HostSnapshot copies a state dict's tensors into host buffers made once and reused, for a
checkpoint written in the background (checkpoint.async_save) while the next steps change the
device tensors.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

# host buffers of at least this many bytes are pinned in place (their own pages: torch's CPU
# allocator maps large blocks on their own); smaller ones come from torch's pinned allocator
REGISTER_FROM_BYTES = 64 << 20


@dataclass
class _Slot:
    storage: torch.UntypedStorage
    nbytes: int
    host: torch.Tensor | None  # uint8 host buffer (None: dropped, freed without a copy)
    weights: bool  # holds parameters (what an export needs back)


def _bytes_view(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


class HostMirror:
    """Host copies of a fixed set of device storages, made once and reused.

    `offload` copies the kept storages to their host buffers and frees every storage (their
    tensors keep their views, at size 0); `onload` gives each its size back and copies the kept
    ones in. `weights_back` / `weights_gone` bring back and free the parameters' storages alone,
    for an export while offloaded (an export does not change them: no copy out afterwards)."""

    def __init__(self, device: torch.device, pin: bool | None = None):
        self.device = device
        self.pin = torch.cuda.is_available() and device.type == "cuda" if pin is None else pin
        self._slots: list[_Slot] = []
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.offloaded = False
        self.buffers_made = 0  # host buffers allocated (once per kept storage)
        self._registered: list[torch.Tensor] = []  # pinned by cudaHostRegister, kept for good

    def _host_buffer(self, nbytes: int) -> torch.Tensor:
        """A host buffer of nbytes, pinned when pinning. A large one is pinned in place with
        cudaHostRegister: torch's pinned allocator rounds a block up to the next power of two
        below its threshold (ATen/core/CachingHostAllocator.h), up to 2x the host memory for
        buffers kept for the whole run. A small one comes from that allocator: registering
        it would share a page with its neighbours, which CUDA refuses to register twice."""
        self.buffers_made += 1
        if self.pin and nbytes < REGISTER_FROM_BYTES:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        if self.pin:
            error = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), nbytes, 0)
            if int(error) != 0:
                raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: error {error}")
            self._registered.append(buffer)
        return buffer

    def track(self, keep: list[torch.UntypedStorage], drop: list[torch.UntypedStorage],
              weights: set[int]) -> None:
        """The storages to move: `keep` copied both ways, `drop` freed without a copy; `weights`
        the data pointers of the parameters' storages. Host buffers of a storage seen before
        are reused; the set is read again at every offload (an optimizer makes its state at its
        first step)."""
        # torch keeps one Python object per storage (`t.untyped_storage() is
        # t.untyped_storage()`), and the slots hold it, so its id stays its own
        known = {id(slot.storage): slot for slot in self._slots}
        slots = []
        for storage, kept in [(s, True) for s in keep] + [(s, False) for s in drop]:
            slot = known.get(id(storage))
            nbytes = storage.nbytes()
            if slot is None or slot.nbytes != nbytes or (slot.host is None) == kept:
                host = self._host_buffer(nbytes) if kept else None
                slot = _Slot(storage, nbytes, host, storage.data_ptr() in weights)
            slots.append(slot)
        held = {id(slot.host) for slot in slots}
        for buffer in [b for b in self._registered if id(b) not in held]:
            torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())
            self._registered.remove(buffer)
        self._slots = slots

    def _copies(self):
        if self._stream is None:
            return contextlib.nullcontext()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self._stream)

    def _wait(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def offload(self) -> None:
        if self.offloaded:
            return
        with self._copies():
            for slot in self._slots:
                if slot.host is not None:
                    slot.host.copy_(_bytes_view(slot.storage, self.device),
                                    non_blocking=self.pin)
        self._wait()
        for slot in self._slots:
            slot.storage.resize_(0)
        self.offloaded = True

    def onload(self) -> None:
        if not self.offloaded:
            return
        self._copy_in(self._slots)
        self.offloaded = False

    def _copy_in(self, slots: list[_Slot]) -> None:
        for slot in slots:
            slot.storage.resize_(slot.nbytes)
        with self._copies():
            for slot in slots:
                if slot.host is not None:
                    _bytes_view(slot.storage, self.device).copy_(slot.host, non_blocking=self.pin)
        self._wait()

    def weights_back(self) -> None:
        self._copy_in([s for s in self._slots if s.weights and s.host is not None])

    def weights_gone(self) -> None:
        for slot in self._slots:
            if slot.weights and slot.host is not None:
                slot.storage.resize_(0)

    @property
    def host_bytes(self) -> int:
        return sum(slot.nbytes for slot in self._slots if slot.host is not None)

    @property
    def dropped_bytes(self) -> int:
        return sum(slot.nbytes for slot in self._slots if slot.host is None)



class HostSnapshot:
    """A host copy of a nest of dicts, lists and tuples holding tensors (a model's and an
    optimizer's state dicts), into buffers made at the first copy and reused by every later
    one of the same shapes: pinned where CUDA runs, so the device's copies go at the bus's
    speed and together. Leaves that are not tensors are deep-copied. The copy it returns is
    valid until the next `copy`."""

    def __init__(self, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._buffers: dict[tuple, torch.Tensor] = {}
        self.buffers_made = 0

    def _buffer(self, key: tuple, tensor: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = self.pin and tensor.device.type == "cuda"
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
            self._buffers[key] = buffer
            self.buffers_made += 1
        return buffer

    def copy(self, tree):
        """The tree with every tensor copied to host memory, the copies finished."""
        out = self._copy(tree, ())
        if self.pin and torch.cuda.is_available():
            torch.cuda.synchronize()
        return out

    def _copy(self, node, key: tuple):
        if torch.is_tensor(node):
            source = node.detach()
            buffer = self._buffer(key, source)
            buffer.copy_(source, non_blocking=buffer.is_pinned())
            return buffer
        if isinstance(node, dict):
            return {k: self._copy(v, (*key, k)) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            items = [self._copy(v, (*key, i)) for i, v in enumerate(node)]
            return items if isinstance(node, list) else type(node)(items) \
                if not hasattr(node, "_fields") else type(node)(*items)
        return copy.deepcopy(node)

    @property
    def host_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())
