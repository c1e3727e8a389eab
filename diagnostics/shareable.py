"""What a shared file may say of the machine that wrote it: nothing. A report (or any page made
to be sent) cuts absolute paths to their last part and URLs to their scheme, and names the
database by its base name, or by ``SHARED_DB_NAME`` where that name holds the user or host name.

Light on purpose (no plotting, no torch): the CLI's ``--help`` states the placeholder.
"""

from __future__ import annotations

import getpass
import re
import socket
from pathlib import Path

# The reproduce lines' database name when the file's own name would tell who or where sent it.
SHARED_DB_NAME = "runs.duckdb"
# What of the sender's machine a shared report must not carry: URLs (a host name), absolute POSIX
# paths of two parts or more and home-relative ones (~/x, ~alice/x), Windows drive and UNC paths.
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://[^\s'\"<>]+")
_PATH = re.compile(r"(?<![\w.~-])(?:~[\w.-]*(?:/[^\s/'\"<>(),;]+)+|(?:/[^\s/'\"<>(),;]+){2,})/?"
                   r"|(?<!\w)[A-Za-z]:[\\/][^\s'\"<>]+|\\\\[^\s\\'\"<>]+\\[^\s'\"<>]+")


# A value that is one path as a whole (a model folder, a prompt file): its name may hold spaces,
# brackets or markup, which a path inside free text is taken to end at.
_WHOLE_PATH = re.compile(r"(?:~[^/\\]*|[A-Za-z]:)?[/\\][^\n]*")


def _last_part(path: str) -> str:
    return "…/" + re.split(r"[/\\]", path.rstrip("/\\"))[-1]


def machine_free(text: str) -> str:
    """``text`` with nothing of this machine in it: each absolute or home-relative path cut to
    ``…/`` and its last part (``/home/alice/models/tiny`` → ``…/tiny``), each URL to its scheme."""
    if _WHOLE_PATH.fullmatch(text) and not _URL.search(text) and len(re.split(r"[/\\]", text.rstrip("/\\"))) > 2:
        return _last_part(text)
    text = _URL.sub(lambda match: f"{match.group(1)}://…", text)
    return _PATH.sub(lambda match: _last_part(match.group(0)), text)


def shared_db_name(path: str | Path) -> str:
    """The database as a shared report's reproduce lines name it: the file's base name, or
    ``SHARED_DB_NAME`` where that name holds this machine's user or host name."""
    name = Path(path).name
    words = {word.lower() for word in re.split(r"[^0-9A-Za-z]+", name) if word}
    try:
        identities = {getpass.getuser().lower(), socket.gethostname().split(".")[0].lower()}
    except (KeyError, OSError):  # no user name in this environment: the placeholder is the safe side
        return SHARED_DB_NAME
    return SHARED_DB_NAME if not name or words & identities else name
