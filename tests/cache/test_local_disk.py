"""A remote directory is read inline only on a filesystem known to be local."""

from __future__ import annotations

import pytest

from kiln.cache.local_disk import on_local_disk

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683792k
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:50 / /mnt/team rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2
41 40 0:51 / /mnt/team/local rw,relatime - xfs /dev/vdb rw
42 27 0:52 / /mnt/my\\040cache rw,relatime - fuse.sshfs host:/c rw
43 27 0:53 / /mnt/odd rw,relatime - someunknownfs x rw
"""


@pytest.fixture
def mountinfo(tmp_path):
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return str(path)


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("/dev/shm/team-cache", True),  # tmpfs
        ("/srv/kiln-cache", True),  # the root's ext4
        ("/mnt/team/kiln", False),  # NFS: a read can hang while its server is gone
        ("/mnt/team/local/kiln", True),  # a local disk mounted below it: the nearest wins
        ("/mnt/my cache/kiln", False),  # FUSE, its space written as \\040
        ("/mnt/odd/kiln", False),  # a type not known to be local keeps the deadline
        ("/mnt/teamx", True),  # a sibling of /mnt/team, not inside it
    ],
)
def test_only_filesystems_known_to_be_local_are_read_inline(mountinfo, path, local, monkeypatch):
    from kiln.cache import local_disk

    monkeypatch.setattr(local_disk, "_existing", lambda p: p)  # these mounts are not here
    assert on_local_disk(path, mountinfo) is local


def test_a_directory_not_made_yet_is_judged_by_its_nearest_parent(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(f"27 1 254:0 / / rw - nfs4 s:/ rw\n28 27 0:1 / {tmp_path} rw - tmpfs t rw\n")
    assert on_local_disk(str(tmp_path / "not" / "made" / "yet"), str(info)) is True


def test_no_mount_table_means_the_deadline_stays(tmp_path):
    assert on_local_disk("/dev/shm", str(tmp_path / "absent")) is False


def test_a_shared_directory_on_this_machines_disk_is_read_inline(tmp_path):
    from kiln.cache.remote import RemoteStore

    remote = RemoteStore(f"file://{tmp_path}/team")
    assert remote.local_disk is on_local_disk(str(tmp_path))
    assert RemoteStore("memory://team").local_disk is False  # not a directory at all
