"""Whether a directory is on a disk of this machine, not a network filesystem.

A read from a network filesystem can hang for as long as its server is
gone (an NFS hard mount), so the remote cache runs every call on a thread
under a deadline. A read from a local disk cannot hang like that, and the
hand-over to that thread cost a clean clone of 1,500 instances about 0.3 s
of its 2.4 s; such a remote directory is read inline. Only filesystems
known to be local count; anything else (NFS, SMB, FUSE, an unknown type,
a system without /proc/self/mountinfo) keeps the deadline.
"""

from __future__ import annotations

import os

MOUNTINFO = "/proc/self/mountinfo"
LOCAL_TYPES = frozenset(
    {
        "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs",
        "tmpfs", "ramfs", "overlay", "vfat", "exfat", "ntfs3",
    }
)  # fmt: skip


def on_local_disk(path: str, mountinfo: str = MOUNTINFO) -> bool:
    """Whether ``path`` (or, while it does not exist, its nearest existing parent)
    lies on a filesystem of ``LOCAL_TYPES``."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            mounts = [_parse(line) for line in f]
    except OSError:
        return False
    target = _existing(os.path.realpath(path))
    best, best_type = "", None
    for mount_point, fs_type in filter(None, mounts):
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, fs_type
    return best_type in LOCAL_TYPES


def _parse(line: str) -> tuple[str, str] | None:
    """(mount point, filesystem type) of one mountinfo line; None when it is not one."""
    fields, sep, rest = line.partition(" - ")
    parts = fields.split()
    if not sep or len(parts) < 5:
        return None
    fs_type = rest.split(" ", 1)[0]
    return _unescape(parts[4]), fs_type


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in a path as octal escapes
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _existing(path: str) -> str:
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
