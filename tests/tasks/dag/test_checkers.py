"""doit's checkers answering from the compile loader's checks (tasks/dag/checkers.py)."""

import os

from doit.dependency import MD5Checker as DoitMD5Checker
from doit.dependency import TimestampChecker as DoitTimestampChecker

from kiln.tasks.dag import checkers


def test_checkers_keep_doits_class_names():
    # doit forgets every task whose recorded checker name differs: switching must not rebuild
    assert checkers.TimestampChecker.__name__ == DoitTimestampChecker.__name__
    assert checkers.MD5Checker.__name__ == DoitMD5Checker.__name__
    assert issubclass(checkers.TimestampChecker, DoitTimestampChecker)
    assert issubclass(checkers.MD5Checker, DoitMD5Checker)


def test_exists_answers_from_the_damage_check_and_falls_back_to_the_disk(tmp_path):
    checked = tmp_path / "kernel.edf"  # listed intact, though gone: no stat is made
    on_disk = tmp_path / "kernel.visa"
    on_disk.write_text("x")
    checkers.note_checked({str(checked)}, set())
    try:
        checker = checkers.TimestampChecker()
        assert checker.exists(str(checked))
        assert checker.exists(str(on_disk))
        assert not checker.exists(str(tmp_path / "missing"))
    finally:
        checkers.note_checked(set(), set())


def test_a_source_is_statted_once_anything_else_every_time(tmp_path):
    source, artifact = tmp_path / "mod.py", tmp_path / "kernel.edf"
    source.write_text("a")
    artifact.write_text("a")
    checkers.note_checked(set(), {str(source)})
    try:
        checker = checkers.MD5Checker()
        first = checker.info(str(source))
        before = checker.info(str(artifact))
        os.utime(source, ns=(1, 1))
        os.utime(artifact, ns=(1, 1))
        assert checker.info(str(source)) is first  # one stat per build
        assert checker.info(str(artifact)).st_mtime_ns == 1 != before.st_mtime_ns
    finally:
        checkers.note_checked(set(), set())


def test_a_later_load_replaces_what_an_earlier_one_noted(tmp_path):
    gone = str(tmp_path / "gone")
    checkers.note_checked({gone}, set())
    checkers.note_checked(set(), set())
    assert not checkers.TimestampChecker().exists(gone)
