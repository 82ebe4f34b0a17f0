"""Reading the small configuration files a user names: price tables, codebooks, crosswalks, steering specs.

They are read whole into memory, so a path that is not a small regular file must be refused before
it is read: ``--prices /dev/zero`` filled the memory until the kernel killed the process, a FIFO or
``/dev/stdin`` waited forever, a multi-GB file was read whole for a table of a few lines.
"""

from __future__ import annotations

import stat
from pathlib import Path

__all__ = ["MAX_CONFIG_BYTES", "read_config_bytes", "read_config_text"]

#: Largest configuration file read, in bytes. The shipped codebook is about 12 kB, a price table or
#: a crosswalk a few kB; 4 MiB leaves room for any hand-written or generated one.
MAX_CONFIG_BYTES = 4 * 2**20


def read_config_bytes(path: str | Path, *, limit: int | None = None) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (default :data:`MAX_CONFIG_BYTES`).

    Raises
    ------
    OSError
        The path cannot be opened, is not a regular file (a device such as ``/dev/zero``, a FIFO, a
        directory), or holds more than ``limit`` bytes; the message says which. Callers wrap it in
        their coded error ("cannot read the price table ...").
    """
    limit = MAX_CONFIG_BYTES if limit is None else limit
    path = Path(path)
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a device, pipe or socket"
        raise OSError(f"{path} is {kind}, not a regular file; give the path of a file")
    with path.open("rb") as handle:
        data = handle.read(limit + 1)  # a file that grows while it is read is still cut here
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit / 2**20:g} MiB, far beyond any configuration file; check the path")
    return data


def read_config_text(path: str | Path, *, limit: int | None = None) -> str:
    """:func:`read_config_bytes` decoded as UTF-8 (a byte-order mark dropped).

    Raises
    ------
    OSError
        As :func:`read_config_bytes`.
    UnicodeDecodeError
        The bytes are not UTF-8.
    """
    return read_config_bytes(path, limit=limit).decode("utf-8-sig")
