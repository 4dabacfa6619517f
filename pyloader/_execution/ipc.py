"""Messages between the loader and its worker processes, with zero-copy arrays.

A message is pickled with protocol 5. Array buffers over ``INBAND_MAX`` bytes
leave the pickle as out-of-band buffers; smaller ones are copied into it, which
costs less than a mapping (a memfd round trip took about 100 µs more than an
inline packet for messages of 32 bytes to 32 KiB). A message with no
out-of-band buffer and at most ``INLINE_MAX`` bytes travels inline in one
``SOCK_SEQPACKET`` packet. Any other is written once into an anonymous
``memfd`` whose file descriptor is passed over the socket; the receiver maps it
and closes the descriptor at once, and rebuilds arrays as views of the mapping:
no copy on the way in, nothing ever named in ``/dev/shm``, and the memory goes
away with the last array using it, even when a process is killed.

An array whose bytes are unwritten bytes of a file a reader mapped (``_npy.file_span``: a
``.npy`` of the ``NumpyReader``, an Arrow IPC file of the ``ParquetReader``) travels as
``(file, offset, shape, dtype)`` instead, and ``mapped_array`` maps that file here (copy on
write, one map per file while arrays over it live): no copy on either side. The file must
be the one the sender mapped (device, inode, size and mtime are checked): one replaced,
changed or gone by then fails the message's result with an error naming it
(``MappedFileChanged``, a ``ValueError``, or ``FileNotFoundError``).

The mapping holds no file descriptor: ``mmap.mmap`` keeps a ``dup()`` of the
descriptor for as long as the map lives (before Python 3.13), so every batch a
consumer kept would hold one, and ``list(loader)`` ran out of descriptors after
about 1,000 batches. ``_map_shared`` calls libc's ``mmap`` instead (the same
cost) and unmaps when the last view is gone.

Every message carries two integers outside its pickle: ``tag`` (the request id
of a request or of its reply, the file id of an ``open``) and ``gen`` (the
generation of a request, see ``_execution.pool``). A message that arrives but cannot be
decoded — its pickle fails in this process, or its descriptor was dropped
because this process has no free one (``EMFILE``) — raises ``MessageLost``
with them, so what waits for it fails instead of waiting forever. ``Sealed`` wraps one result
inside a message so that it is unpickled on its own, later: one result that
cannot be unpickled fails alone, not the whole message; a result that is a dict of
small arrays is sealed as a ``Packed`` instead (``_execution.packed``: its bytes, no pickle).
"""
from __future__ import annotations

import ctypes
import errno
import io
import mmap
import os
import pickle
import socket
import struct
import sys
import threading
import weakref
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._libc import libc as c_library
from .._npy import Identity, file_span, identity_of
from .packed import Packed, pack

INLINE_MAX = 64 * 1024
INBAND_MAX = 16 * 1024
_ALIGN = 64
_HEAD = struct.Struct("<cQIqq")  # kind, pickle length, number of buffers, tag, gen
_SPAN = struct.Struct("<QQ")  # offset, length
HAVE_MEMFD = hasattr(os, "memfd_create")
_ARRAY_TYPES = (np.ndarray, np.memmap)
_Reduction = Tuple[Callable[..., object], Tuple[object, ...]]  # what ``__reduce__`` returns: rebuild, its arguments


class MessageLost(Exception):
    """A message arrived but could not be decoded; the reason is ``__cause__``."""

    def __init__(self, tag: int, gen: int, cause: BaseException) -> None:
        super().__init__(f"message {tag} could not be decoded: {type(cause).__name__}: {cause}")
        self.tag = tag
        self.gen = gen
        self.cause = cause
        self.__cause__ = cause


class _Pickler(pickle.Pickler):
    """Sends CPU torch tensors as NumPy arrays (zero-copy), rebuilt as tensors on arrival, and
    arrays that are unwritten bytes of a mapped file as where they lie in it (``_npy.file_span``)."""

    def reducer_override(self, obj: Any) -> _Reduction:
        if type(obj) in _ARRAY_TYPES:
            return _span_reduction(obj)
        return _tensor_reduction(obj)


def _tensor_reduction(obj: Any) -> _Reduction:
    """A CPU torch tensor not requiring grad as its NumPy array, rebuilt by ``torch.from_numpy``; else as usual."""
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad:
        try:
            return torch.from_numpy, (obj.numpy(),)
        except (TypeError, RuntimeError):
            return NotImplemented  # dtypes NumPy lacks (bfloat16): torch's own pickling
    return NotImplemented


def _span_reduction(array: np.ndarray) -> _Reduction:
    """``array`` as ``(file, offset, shape, dtype)``, mapped on arrival by ``mapped_array``, where
    its bytes are a mapped file's (any NumPy dtype but records and objects); else as usual."""
    dtype = array.dtype
    if dtype.hasobject or dtype.names is not None or dtype.subdtype is not None:
        return NotImplemented
    span = file_span(array)
    if span is None:
        return NotImplemented
    return mapped_array, (span.path, span.identity, span.offset, array.shape, dtype.str, array.flags.writeable)


def _dumps(obj: object) -> Tuple[bytes, List[pickle.PickleBuffer]]:
    """The pickle and its out-of-band buffers (those over ``INBAND_MAX`` bytes)."""
    buffers: List[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes <= INBAND_MAX:
            return True  # true: pickled in band
        buffers.append(buffer)
        return False

    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=out_of_band).dump(obj)
    return out.getvalue(), buffers


class Sealed:
    """``obj`` pickled on its own (large arrays still out of band), unpickled by ``open()``."""

    __slots__ = ("data", "buffers")

    def __init__(self, data: pickle.PickleBuffer, buffers: Sequence[pickle.PickleBuffer]) -> None:
        self.data = data
        self.buffers = buffers

    @classmethod
    def seal(cls, obj: object) -> Union["Sealed", Packed]:
        """``obj`` as a ``Packed`` when it is a dict of small arrays (``_execution.packed``), else pickled."""
        packed = pack(obj, INBAND_MAX)
        if packed is not None:
            return packed
        data, buffers = _dumps(obj)
        return cls(pickle.PickleBuffer(data), buffers)

    def __reduce__(self) -> Tuple[type, Tuple[pickle.PickleBuffer, Sequence[pickle.PickleBuffer]]]:
        return Sealed, (self.data, self.buffers)

    def open(self) -> object:
        return pickle.loads(self.data, buffers=self.buffers)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def channel_pair() -> Tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(sock: socket.socket, obj: object, tag: int = -1, gen: int = 0) -> None:
    """Send ``obj`` as one packet (plus a memfd when it is large or holds large arrays)."""
    data, buffers = _dumps(obj)
    raws = [b.raw() for b in buffers]
    if not HAVE_MEMFD or (len(data) <= INLINE_MAX and not raws):
        if raws:  # no memfd on this system: arrays travel in-band
            data, raws = pickle.dumps(obj, protocol=5), []
        if len(data) <= INLINE_MAX:
            sock.sendall(_HEAD.pack(b"I", len(data), 0, tag, gen) + data)
        else:
            _send_fd_less(sock, data, tag, gen)
        return
    _send_memfd(sock, data, raws, tag, gen)


def _send_memfd(sock: socket.socket, data: bytes, raws: List[memoryview], tag: int, gen: int) -> None:
    """The pickle and its buffers written into an anonymous memory file, whose descriptor is sent."""
    spans, offset = [], _aligned(len(data))
    for raw in raws:
        spans.append((offset, len(raw)))
        offset = _aligned(offset + len(raw))
    fd = os.memfd_create("pyloader", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(offset, 1))
        _write_at(fd, memoryview(data), 0)  # not through a map: each fresh page would cost a fault here
        for (start, _), raw in zip(spans, raws):
            _write_at(fd, raw, start)
        header = _HEAD.pack(b"M", len(data), len(spans), tag, gen) + b"".join(_SPAN.pack(*s) for s in spans)
        sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
    finally:
        os.close(fd)


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _send_fd_less(sock: socket.socket, data: bytes, tag: int, gen: int) -> None:
    """Fallback without memfd: a big pickle in several packets."""
    sock.sendall(_HEAD.pack(b"P", len(data), 0, tag, gen))
    for start in range(0, len(data), INLINE_MAX):
        sock.sendall(data[start:start + INLINE_MAX])


_RECV_SIZE = INLINE_MAX + 4096
_ANC_SIZE = socket.CMSG_SPACE(struct.calcsize("i"))


def recv(sock: socket.socket) -> Tuple[int, int, Any]:
    """The next message as ``(tag, gen, obj)``; ``EOFError`` when the other side has gone,
    ``MessageLost`` when it arrived but cannot be decoded."""
    packet, ancdata, flags, _ = sock.recvmsg(_RECV_SIZE, _ANC_SIZE)
    if not packet:
        raise EOFError("peer closed")
    kind, length, n_spans, tag, gen = _HEAD.unpack_from(packet)
    body = memoryview(packet)[_HEAD.size:]
    if kind == b"I":
        return tag, gen, _loads(tag, gen, body, [])
    if kind == b"P":
        return tag, gen, _loads(tag, gen, _recv_rest(sock, length), [])
    fd = _message_fd(ancdata, flags, tag, gen)
    try:
        spans = [_SPAN.unpack_from(body, i * _SPAN.size) for i in range(n_spans)]
        view = _map_shared(fd, os.fstat(fd).st_size)
    except OSError as exc:
        raise MessageLost(tag, gen, exc) from exc
    finally:
        os.close(fd)
    return tag, gen, _loads(tag, gen, view[:length], [view[s:s + n] for s, n in spans])


def _message_fd(ancdata: list, flags: int, tag: int, gen: int) -> int:
    """The memory descriptor that came with message ``tag``."""
    fd = _take_fd(ancdata)
    if fd is None:
        if flags & socket.MSG_CTRUNC:  # the kernel dropped the descriptor: no free one here
            raise MessageLost(tag, gen, _out_of_descriptors())
        raise EOFError("a large message arrived without its memory descriptor")
    return fd


def _recv_rest(sock: socket.socket, length: int) -> bytes:
    """The ``length`` bytes of a pickle sent in several packets (``_send_fd_less``)."""
    chunks, got = [], 0
    while got < length:
        chunk = sock.recv(_RECV_SIZE)
        if not chunk:
            raise EOFError("peer closed mid-message")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _loads(tag: int, gen: int, data: Union[bytes, memoryview], buffers: List[memoryview]) -> Any:
    try:
        return pickle.loads(data, buffers=buffers)
    except Exception as exc:  # whatever a class's unpickling raises
        raise MessageLost(tag, gen, exc) from exc


def _out_of_descriptors() -> OSError:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return OSError(errno.EMFILE, f"Too many open files: this process has no free file descriptor (ulimit -n is "
                                 f"{soft}), so the descriptor of a message from a worker was dropped")


def _take_fd(ancdata: list) -> Optional[int]:
    fds: List[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % struct.calcsize("i")
            fds.extend(struct.unpack(f"{usable // struct.calcsize('i')}i", data[:usable]))
    for extra in fds[1:]:
        os.close(extra)
    return fds[0] if fds else None


# -- mapping without keeping a descriptor ------------------------------------------------
class _Mapping:
    """Owns one ``mmap``ed region; NumPy views it through ``__array_interface__`` (so every
    array or memoryview over it keeps this object alive), and it unmaps on collection."""

    __slots__ = ("__array_interface__", "_address", "_size", "__weakref__")

    def __init__(self, address: int, size: int) -> None:
        self._address = address
        self._size = size
        self.__array_interface__ = {"data": (address, False), "shape": (size,), "typestr": "|u1", "version": 3}

    def __del__(self) -> None:
        libc = _LIBC
        if libc is not None:  # None only while the interpreter tears the module down
            libc.munmap(self._address, self._size)


def _load_libc() -> Optional[ctypes.CDLL]:
    libc = c_library()
    if libc is None:
        return None
    try:
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        return libc
    except AttributeError:
        return None


_LIBC = _load_libc() if HAVE_MEMFD else None
_MAP_FAILED = ctypes.c_void_p(-1).value
_Owner = Union[_Mapping, mmap.mmap]


def _map_shared(fd: int, size: int, flags: int = mmap.MAP_SHARED, what: str = "message") -> memoryview:
    """A writable buffer over the first ``size`` bytes of ``fd``; the caller may close ``fd`` at once.
    ``MAP_PRIVATE``: writing to it changes only this process's copy (copy on write)."""
    owner = _map_owner(fd, size, flags, what)
    return memoryview(owner) if isinstance(owner, mmap.mmap) else np.asarray(owner).data


def _map_owner(fd: int, size: int, flags: int, what: str) -> _Owner:
    """What owns the map of the first ``size`` bytes of ``fd`` (views over it keep it alive)."""
    if _LIBC is None:
        return mmap.mmap(fd, size, flags)  # keeps a descriptor, but there is no other way here
    address = _LIBC.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, f"mmap of a {size}-byte {what} failed: {os.strerror(code)}")
    return _Mapping(address, size)


# -- arrays that are spans of mapped files ----------------------------------------------
_FILES: "weakref.WeakValueDictionary[Tuple[str, Identity], _Owner]" = weakref.WeakValueDictionary()
_FILES_LOCK = threading.Lock()


class MappedFileChanged(ValueError):
    """A file whose mapped bytes a worker sent changed before the loader's process mapped it."""


def mapped_array(path: str, identity: Identity, offset: int, shape: Tuple[int, ...], dtype: str,
                 writeable: bool = True) -> np.ndarray:
    """The array a worker sent as a span of ``path`` (``_span_reduction``), over this process's
    copy-on-write map of the file: one map per file while arrays over it live, no descriptor held.
    The file must be the one the worker mapped (device, inode, size, modification time)."""
    key = (path, identity)
    with _FILES_LOCK:
        mapping = _FILES.get(key)
        if mapping is None:
            mapping = _FILES[key] = _map_file(path, identity)
    out = np.ndarray(shape, dtype=np.dtype(dtype), buffer=np.asarray(mapping).view(np.uint8), offset=offset)
    out.flags.writeable = writeable
    return out


def _map_file(path: str, identity: Identity) -> _Owner:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"file {path!r} vanished while it was read: a batch a worker process "
                                f"mapped from it cannot be mapped here ({e.strerror})") from e
    try:
        now = identity_of(os.fstat(fd))
        if now != identity:
            raise MappedFileChanged(f"file {path!r} changed while it was read (device, inode, size, "
                                    f"mtime_ns were {identity}, are {now}): a batch a worker process mapped "
                                    f"from it cannot be mapped here")
        return _map_owner(fd, identity[2], mmap.MAP_PRIVATE, "file")  # arrays over it keep it alive
    finally:
        os.close(fd)
