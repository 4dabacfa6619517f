"""Messages between the loader and its worker processes, with zero-copy arrays.

A message is pickled with protocol 5: array data leaves the pickle as
out-of-band buffers. Small messages travel inline in one ``SOCK_SEQPACKET``
packet. Larger ones are written once into an anonymous ``memfd`` whose file
descriptor is passed over the socket; the receiver maps it and rebuilds arrays
as views of that mapping, so no copy is made on the way in and nothing is ever
named in ``/dev/shm``: the memory goes away with the last array using it, even
when a process is killed.
"""
from __future__ import annotations

import io
import mmap
import os
import pickle
import socket
import struct
import sys
from typing import Any, List, Tuple

INLINE_MAX = 64 * 1024
_ALIGN = 64
_HEAD = struct.Struct("<cQI")  # kind, pickle length, number of buffers
_SPAN = struct.Struct("<QQ")  # offset, length
HAVE_MEMFD = hasattr(os, "memfd_create")


class _Pickler(pickle.Pickler):
    """Sends CPU torch tensors as NumPy arrays (zero-copy), rebuilt as tensors on arrival."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad:
            try:
                return torch.from_numpy, (obj.numpy(),)
            except (TypeError, RuntimeError):
                return NotImplemented  # dtypes NumPy lacks (bfloat16): torch's own pickling
        return NotImplemented


def _dumps(obj: Any) -> Tuple[bytes, List[pickle.PickleBuffer]]:
    buffers: List[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
    return out.getvalue(), buffers


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def channel_pair() -> Tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(sock: socket.socket, obj: Any) -> None:
    """Send ``obj`` as one packet (plus a memfd when it is large or holds arrays)."""
    data, buffers = _dumps(obj)
    raws = [b.raw() for b in buffers]
    size = len(data) + sum(len(r) for r in raws)
    if not HAVE_MEMFD or (size <= INLINE_MAX and not raws):
        if raws:  # no memfd on this system: arrays travel in-band
            data, raws = pickle.dumps(obj, protocol=5), []
        sock.sendall(_HEAD.pack(b"I", len(data), 0) + data) if len(data) <= INLINE_MAX else _send_fd_less(sock, data)
        return
    spans, offset = [], _aligned(len(data))
    for raw in raws:
        spans.append((offset, len(raw)))
        offset = _aligned(offset + len(raw))
    fd = os.memfd_create("pyloader", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(offset, 1))
        with mmap.mmap(fd, max(offset, 1)) as mem:
            mem[: len(data)] = data
            for (start, length), raw in zip(spans, raws):
                mem[start:start + length] = raw
        header = _HEAD.pack(b"M", len(data), len(spans)) + b"".join(_SPAN.pack(*s) for s in spans)
        sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
    finally:
        os.close(fd)


def _send_fd_less(sock: socket.socket, data: bytes) -> None:
    """Fallback without memfd: a big pickle in several packets."""
    sock.sendall(_HEAD.pack(b"P", len(data), 0))
    for start in range(0, len(data), INLINE_MAX):
        sock.sendall(data[start:start + INLINE_MAX])


_RECV_SIZE = INLINE_MAX + 4096
_ANC_SIZE = socket.CMSG_SPACE(struct.calcsize("i"))


def recv(sock: socket.socket) -> Any:
    """The next message; ``EOFError`` when the other side has gone."""
    packet, ancdata, _, _ = sock.recvmsg(_RECV_SIZE, _ANC_SIZE)
    if not packet:
        raise EOFError("peer closed")
    kind, length, n_spans = _HEAD.unpack_from(packet)
    body = packet[_HEAD.size:]
    if kind == b"I":
        return pickle.loads(body)
    if kind == b"P":
        chunks, got = [], 0
        while got < length:
            chunk = sock.recv(_RECV_SIZE)
            if not chunk:
                raise EOFError("peer closed mid-message")
            chunks.append(chunk)
            got += len(chunk)
        return pickle.loads(b"".join(chunks))
    fd = _take_fd(ancdata)
    try:
        spans = [_SPAN.unpack_from(body, i * _SPAN.size) for i in range(n_spans)]
        size = os.fstat(fd).st_size
        mem = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    view = memoryview(mem)
    return pickle.loads(view[:length], buffers=[view[s:s + n] for s, n in spans])


def _take_fd(ancdata: list) -> int:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            return struct.unpack("i", data[: struct.calcsize("i")])[0]
    raise EOFError("a large message arrived without its memory descriptor")
