"""``TarReader``: webdataset-style tar shards, read as a stream of samples.

A shard's members are named ``<key>.<ext>`` (the key is the name up to the first dot of its base
name, the extension the rest: ``dir/0001.seg.png`` is key ``dir/0001``, extension ``seg.png``);
consecutive members of one key make a sample, with one column per extension plus ``__key__``.
Contracts:

- The shard is read as a stream over ``open_file`` (by hand, ``_ustar``, when uncompressed; else ``tarfile``
  ``r|*``): one member is held at a time, never the shard; members of extensions not kept are skipped
  unread. Local and remote shards alike, compressed ones (``.tar.gz``, ``.tgz``, and the codecs
  ``open_file`` knows) too.
- Every sample has the same extensions: those of ``keep``, else those of the shard's first sample.
  A sample missing one, or with one more, a key met again after other keys, a member with no
  extension and a corrupt or truncated shard raise ``FileFormatError`` (a ``ValueError``) naming the
  shard and the member (the original exception as ``__cause__``); so does a decoder that fails.
  A shard must end as a complete archive does, with two zero blocks: one cut at or inside a
  member's header (which ``tarfile`` alone takes for the end) is truncated, for ``count`` too.
- ``iter_file`` delivers every sample before the damage (the last piece shorter), then raises.
- ``count`` reads the members' headers only (no member is decoded or held).
"""
from __future__ import annotations

import io
import itertools
import json
import tarfile
import zlib
from tarfile import HeaderError
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .._abc import DataReader
from .._columns import Columns
from .._storage.compression import DecompressionError
from .._storage.files import open_file
from ._base import FileFormatError, check_fields, check_piece_size, file_error
from ._ustar import ENDS, Members, is_ustar, no_end

__all__ = ["TarReader", "decode_image", "DECODERS"]

Decoder = Callable[[bytes], object]
KEY = "__key__"
_CORRUPT = (tarfile.TarError, EOFError, zlib.error, DecompressionError)
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "pgm", "bmp", "gif", "tif", "tiff", "webp")


def decode_image(data: bytes, mode: Optional[str] = "RGB") -> np.ndarray:
    """An encoded image (JPEG, PNG, ...) as a ``uint8`` array, ``[H, W, C]`` (``[H, W]`` for one
    channel), converted to ``mode`` unless it is ``None``. Needs Pillow (the ``image`` extra).

    Example:
        ```python
        columns, n = TarReader(keep=["jpg"], decode=False).read_file("shards/shard-0000.tar")
        pixels = decode_image(columns["jpg"][0])     # the JPEG's bytes, decoded
        assert pixels.dtype == "uint8" and pixels.shape == (40, 40, 3)   # [H, W, 3]
        ```
    """
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError("decoding images needs Pillow: pip install pyloader-ml[image]") from exc
    with Image.open(io.BytesIO(data)) as opened:
        image = opened.convert(mode) if mode not in (None, opened.mode) else opened
        return np.asarray(image)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _class(data: bytes) -> int:
    return int(data.decode("utf-8").strip())


def _npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


# by the last part of the extension, lower case
DECODERS: Dict[str, Decoder] = {
    **dict.fromkeys(IMAGE_EXTENSIONS, decode_image),
    "cls": _class, "cls2": _class, "index": _class, "txt": _text, "text": _text,
    "json": json.loads, "jsn": json.loads, "npy": _npy,
}


def split_name(name: str) -> Optional[Tuple[str, str]]:
    """``(key, extension)`` of a member name, or ``None`` when its base name has no dot."""
    base = name.rfind("/") + 1
    dot = name.find(".", base)
    if dot <= base or dot == len(name) - 1:  # no stem, or no extension (which means a dot)
        return None
    return name[:dot], name[dot + 1:]


class TarReader(DataReader):
    """Reads webdataset-style tar shards into samples: ``__key__`` plus one column per extension.

    ``keep``: the extensions to read (each sample must have every one; the others are skipped
    unread); default: every extension, as the shard's first sample has them. ``decode``: ``True``
    decodes by the last part of the extension with ``DECODERS`` (images to ``uint8`` ``[H, W, C]``
    arrays through Pillow, ``cls`` to ``int``, ``txt`` to ``str``, ``json``, ``npy``; other
    extensions stay ``bytes``); ``False`` gives ``bytes`` throughout; a mapping adds or replaces
    decoders (by full or last extension; ``None``: keep ``bytes``). ``image_mode``: what images are
    converted to (``None``: as stored). ``iter_file`` gives ``piece_size`` samples at a time.

    Example:
        ```python
        reader = TarReader(batch_size=16, keep=["jpg", "cls"])   # read: batch["jpg"] holds uint8 [H, W, 3] arrays
        collator = TorchCollator(images=Images(["jpg"], size=(32, 32)))
        for batch in DataLoader(reader, IdentityDataset(), collator, "shards/"):
            assert batch["jpg"].shape == (16, 3, 32, 32) and batch["cls"].shape == (16,)
        ```
    """

    thread_safe = True  # holds no per-call state on self

    def __init__(self, batch_size: int = 16, shuffle: bool = False, random_seed: int = 42, *,
                 keep: Optional[Sequence[str]] = None,
                 decode: Union[bool, Mapping[str, Optional[Decoder]]] = True,
                 image_mode: Optional[str] = "RGB", piece_size: int = 256) -> None:
        super().__init__(batch_size=batch_size, shuffle=shuffle, random_seed=random_seed)
        self.keep = check_fields(keep, "keep")
        if self.keep is not None and KEY in self.keep:
            raise ValueError(f"keep lists extensions; {KEY!r} is always a column")
        self.decoders = _decoders(decode)
        self.image_mode = image_mode
        self.piece_size = check_piece_size(piece_size)

    def read_file(self, path: str) -> Tuple[Dict[str, List[object]], int]:
        columns: Dict[str, List[object]] = {}
        n = 0
        for piece in self.iter_file(path):
            for name, values in piece.items():
                columns.setdefault(name, []).extend(values)
            n += len(piece[KEY])
        return columns, n

    def iter_file(self, path: str) -> Iterator[Columns]:
        """The shard's samples, ``piece_size`` at a time; when the shard turns out damaged, the samples
        before the damage come first (a shorter piece), then the error."""
        samples = _samples(path, self.keep, self._decoded(path))
        while True:
            piece, error = _gathered(samples, self.piece_size)
            if piece:
                yield self.checked(path, piece)
            if error is not None:
                raise error
            if len(piece.get(KEY, ())) < self.piece_size:
                return

    def count(self, path: str) -> int:
        """The samples of the shard, from its members' headers alone."""
        return sum(1 for _ in _samples(path, self.keep, None))

    def _decoded(self, path: str) -> Callable[[str, str, bytes], object]:
        def decode(name: str, ext: str, data: bytes) -> object:
            fn = self.decoders[ext] if ext in self.decoders else self.decoders.get(ext.rpartition(".")[2].lower())
            if fn is None:
                return data
            try:
                return decode_image(data, self.image_mode) if fn is decode_image else fn(data)
            except ImportError:
                raise
            except Exception as exc:
                raise file_error(path, f"member {name!r}: cannot decode {ext!r}: {type(exc).__name__}: {exc}") \
                    from exc
        return decode


def _decoders(decode: Union[bool, Mapping[str, Optional[Decoder]]]) -> Dict[str, Optional[Decoder]]:
    """The decoder of each extension: ``DECODERS`` (``True``), none (``False``), or those updated by a mapping."""
    if not isinstance(decode, (bool, Mapping)):
        raise ValueError(f"decode must be True, False or a mapping of extension to decoder, got {decode!r}")
    decoders: Dict[str, Optional[Decoder]] = {} if decode is False else dict(DECODERS)
    if isinstance(decode, Mapping):
        for ext, fn in decode.items():
            if fn is not None and not callable(fn):
                raise ValueError(f"decode[{ext!r}] must be callable or None, got {fn!r}")
        decoders.update(decode)
    return decoders


class _Shard:
    """The samples of one shard as they stream by, checked as ``TarReader`` says."""

    def __init__(self, path: str, keep: Optional[List[str]]) -> None:
        self.path = path
        self.expected = None if keep is None else set(keep)
        self.keep = self.expected
        self.seen: set = set()
        self.last: Optional[str] = None  # the name of the last member met
        self.key: Optional[str] = None  # the sample being read: its key,
        self.members: Dict[str, str] = {}  # the names of its members kept, by extension,
        self.sample: Dict[str, object] = {}  # and its values

    def error(self, what: str) -> FileFormatError:
        return FileFormatError(f"shard {self.path!r}: {what}")

    def corrupt(self, exc: Exception) -> FileFormatError:
        """``exc``, which stopped the reading of the shard, as the error saying where: after member ``last``."""
        where = "at its start" if self.last is None else f"after member {self.last!r}"
        return self.error(f"corrupt or truncated {where}: {type(exc).__name__}: {exc}")

    def finished(self) -> Iterator[Dict[str, object]]:
        """The sample being read (if there is one), its members all read, its columns in one order
        (``__key__``, then the extensions sorted): its extensions must be those every sample has."""
        if self.key is not None:
            self.check(self.key, self.members)
            yield {name: self.sample[name] for name in [KEY, *sorted(self.members)] if name in self.sample}

    def check(self, key: str, members: Dict[str, str]) -> None:
        if self.expected is None:
            self.expected = set(members)
        got = set(members)
        if got == self.expected:
            return
        missing = sorted(self.expected - got)
        if missing:
            raise self.error(f"sample {key!r} has no member {key + '.' + missing[0]!r} (its members: "
                             f"{', '.join(sorted(members.values()))})")
        extra = sorted(got - self.expected)
        raise self.error(f"member {members[extra[0]]!r}: sample {key!r} has extension {extra[0]!r}, which the "
                         f"shard's first sample has not (expected {', '.join(sorted(self.expected))}; pass keep=)")

    def split(self, name: str) -> Tuple[str, str]:
        """A member's name as ``(key, extension)``."""
        parts = split_name(name)
        if parts is None:
            raise self.error(f"member {name!r} has no extension: members are named <key>.<ext>")
        return parts

    def kept(self, ext: str, name: str) -> bool:
        """Whether member ``name`` of the sample being read is kept (``keep``), and then recorded; a second
        one of an extension is an error."""
        if self.keep is not None and ext not in self.keep:
            return False
        if ext in self.members:
            raise self.error(f"member {name!r}: sample {self.key!r} has two members of extension {ext!r}")
        self.members[ext] = name
        return True

    def start(self, key: str, name: str) -> None:
        """Start reading the sample ``key`` at its first member, ``name``."""
        if key in self.seen:
            raise self.error(f"member {name!r}: key {key!r} comes again after other keys (a sample's members "
                             f"must be consecutive)")
        self.seen.add(key)
        self.key, self.members, self.sample = key, {}, {KEY: key}


def _gathered(samples: Iterator[Dict[str, object]], size: int) -> Tuple[Dict[str, List[object]], Optional[Exception]]:
    """The next ``size`` of ``samples`` (fewer at their end) as columns, and the error that stopped them
    early, if one did: the samples before it are kept."""
    piece: Dict[str, List[object]] = {}
    try:
        for sample in itertools.islice(samples, size):
            for name, value in sample.items():
                piece.setdefault(name, []).append(value)
    except Exception as exc:
        return piece, exc
    return piece, None


class _Header(tarfile.TarInfo):
    """A member's header as ``tarfile`` reads it, keeping on the archive (``_Tar.end``) the error that
    ended it: in stream mode ``tarfile`` takes any header it cannot read for the end of the archive."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> "_Header":
        try:
            return super().fromtarfile(tar)
        except HeaderError as exc:
            if isinstance(tar, _Tar):
                tar.end = exc
            raise


class _Tar(tarfile.TarFile):
    end: Optional[HeaderError] = None  # what the last header read met instead of a member


def _check_end(tar: _Tar) -> None:
    """Raise ``tarfile.ReadError`` unless the archive ended as a complete one does: with two zero blocks
    (a shard cut at or inside a header would otherwise read as a shorter valid one)."""
    end, at = tar.end, tar.offset
    if type(end).__name__ == "EOFHeaderError":  # a zero block
        if tar.fileobj.read(tarfile.BLOCKSIZE) == bytes(tarfile.BLOCKSIZE):
            return
    raise no_end(at, ENDS.get(type(end).__name__, f"its end could not be read ({end})")) from end


def _samples(path: str, keep: Optional[List[str]],
             decode: Optional[Callable[[str, str, bytes], object]]) -> Iterator[Dict[str, object]]:
    """Each sample as ``{__key__, ext: value}`` (``decode``: ``None`` reads no data, for counting)."""
    shard = _Shard(path, keep)
    try:
        yield from _members_of(path, shard, decode)
    except _CORRUPT as exc:
        raise shard.corrupt(exc) from exc
    yield from shard.finished()


def _members_of(path: str, shard: _Shard,
                decode: Optional[Callable[[str, str, bytes], object]]) -> Iterator[Dict[str, object]]:
    """The samples of the shard but the last: an uncompressed archive read by hand (``_ustar``), any other
    (compressed by a codec its name does not say, an old format) by ``tarfile``."""
    with open_file(path, "rb") as f:
        first = f.read(tarfile.BLOCKSIZE)
        if is_ustar(first):
            members = Members(f, first)
            yield from _gone_through(shard, members, members.read, decode)
            return
    with open_file(path, "rb") as f, _Tar.open(fileobj=f, mode="r|*", tarinfo=_Header) as tar:
        met: List[tarfile.TarInfo] = []
        yield from _gone_through(shard, _named(tar, met), lambda: _read(tar, met[-1]), decode)
        _check_end(tar)


def _named(tar: tarfile.TarFile, met: List[tarfile.TarInfo]) -> Iterator[Tuple[str, bool]]:
    for member in tar:
        met[:] = [member]
        yield member.name, member.isfile()


def _gone_through(shard: _Shard, members: Iterable[Tuple[str, bool]], read: Callable[[], bytes],
                  decode: Optional[Callable[[str, str, bytes], object]]) -> Iterator[Dict[str, object]]:
    """The samples of ``members`` (each ``(name, is_file)``; ``read()`` the data of the one just met)."""
    for name, is_file in members:
        shard.last = name
        if not is_file:
            continue
        key, ext = shard.split(name)
        if key != shard.key:
            yield from shard.finished()
            shard.start(key, name)
        if shard.kept(ext, name) and decode is not None:
            shard.sample[ext] = decode(name, ext, read())


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(member)
    assert f is not None, "a regular member has data"
    return f.read()
