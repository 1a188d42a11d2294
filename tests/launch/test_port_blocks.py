"""A job run here takes a Ray port block no other job on this machine holds: local job ids
hash into 120 blocks, so two jobs at once met in one block about once in 120 pairs, and the
second's `ray start --head` found the first's GCS on its port ("Session name ... does not
match persisted value"), then failed as a Ray that died under the driver."""

from __future__ import annotations

import contextlib
import socket

from vime.launch import ports, submit


def _hold(port: int) -> socket.socket | None:
    sock = socket.socket()
    try:
        sock.bind(("", port))
        sock.listen()
    except OSError:  # held already by a job of this machine: busy all the same
        sock.close()
        return None
    return sock


def test_a_local_job_id_draws_a_port_block_nobody_listens_on():
    free_block = next(b for b in range(ports.BLOCKS) if not ports.block_in_use(
        ports.FIRST_BLOCK + b * ports.BLOCK))
    held = []
    try:
        for block in range(ports.BLOCKS):
            if block != free_block:
                held.append(_hold(ports.FIRST_BLOCK + block * ports.BLOCK))
        for _ in range(5):
            job_id = submit.new_local_id("local")
            assert ports.plan(job_id, 6379, 8265, False).base == \
                ports.FIRST_BLOCK + free_block * ports.BLOCK, job_id
    finally:
        for sock in held:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
