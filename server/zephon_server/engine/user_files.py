"""Reading a small file a user named on the command line (a key, a certificate).

One place for the errors: each names the flag and the path, says what is wrong (missing, a
directory, unreadable) and what to check, on one line, instead of an ``OSError`` traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError


def read_user_file(flag: str, path: str | os.PathLike[str], what: str = "file") -> bytes:
    """The bytes of ``path``, given as ``flag``; :class:`ConfigError` naming both otherwise.

    ``what`` names the expected content in the directory case ("a PEM file", "a key file").
    """
    source = f"{flag} {str(path)!r}"
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{source}: the file does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, not {what}") from None
    except OSError as exc:
        raise ConfigError(
            f"{source}: cannot read it ({exc.strerror}); check its owner and mode"
        ) from None
