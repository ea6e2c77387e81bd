"""kiln/errors.py: how a diagnostic is rendered for a terminal."""

from __future__ import annotations

import errno
import os

from kiln.errors import (
    MAX_EXCERPT,
    KilnError,
    Location,
    clip_excerpt,
    environment_error,
    printable,
    relative_path,
)


def test_control_characters_are_escaped_everywhere():
    err = KilnError(
        "kernel '\x1b[2Jboom' is odd",
        Location("pipe\nline.yaml", 3, 1, "kernels.\x00x", "  \x1b[2Jboom: {}"),
        expected="a\rb",
        found="\x07",
        hint="tab\tkept",
        notes=["first\nsecond"],
    )
    text = err.render()
    assert "\x1b" not in text and "\x00" not in text and "\r" not in text and "\x07" not in text
    assert "kernel '\\x1b[2Jboom' is odd" in text
    assert text.startswith("pipe\\nline.yaml:3:1: error:")
    assert "at key: kernels.\\x00x" in text
    assert "tab\tkept" in text
    assert "  note: first\nsecond" in text  # a multi-line note keeps its own lines


def test_printable_escapes_newlines_and_nul():
    assert printable("a\nb\x00c\x7f") == "a\\nb\\x00c\\x7f"


def test_caret_moves_with_escaped_text_before_it():
    err = KilnError("bad", Location("p.yaml", 1, 3, None, "\x1bab"))  # column 3: the 'b'
    source, caret = err.render().splitlines()[1:3]
    assert source == "  | \\x1bab"
    assert caret.index("^") - 4 == len("\\x1ba")


def test_long_source_line_is_clipped_around_the_column():
    line = "[" * 10_000 + "x" + "]" * 10_000
    text, column = clip_excerpt(line, 10_001)
    assert len(text) <= MAX_EXCERPT + 6
    assert text.startswith("...") and text.endswith("...")
    assert text[column - 1] == "x"
    rendered = KilnError("deep", Location("p.yaml", 1, 10_001, None, line)).render()
    assert max(len(row) for row in rendered.splitlines()) < 200


def test_short_lines_are_kept_whole():
    assert clip_excerpt("short", 3) == ("short", 3)


def test_paths_inside_the_working_directory_are_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert relative_path(tmp_path / "a" / "pipeline.yaml") == os.path.join("a", "pipeline.yaml")
    assert relative_path("/elsewhere/x.yaml") == "/elsewhere/x.yaml"
    header = KilnError("x", Location(str(tmp_path / "pipeline.yaml"), 2)).render()
    assert header.startswith("pipeline.yaml:2: error: x")


def test_os_errors_say_what_to_do():
    err = environment_error(OSError(errno.ENOSPC, "No space left on device", "/b/kernel.edf"))
    text = err.render()
    assert "No space left on device" in text and "the disk is full" in text
    assert environment_error(OSError(errno.EEXIST, "File exists", ".kiln")).hint.startswith(
        "a file is in the way"
    )
    # neither out_dir nor KILN_CACHE_DIR moves .kiln/: the hint must not send the user there
    lock = environment_error(OSError(errno.EROFS, "Read-only file system", "/p/.kiln/lock"))
    assert "KILN_CACHE_DIR" not in lock.hint and ".kiln/ beside pipeline.yaml" in lock.hint
    out = environment_error(OSError(errno.EROFS, "Read-only file system", "/p/build/x.edf"))
    assert "out_dir / KILN_CACHE_DIR" in out.hint


def test_an_os_error_on_a_temp_file_names_the_file_being_written():
    tmp = "/proc/.x.xml.4242.1dea6dd6.tmp"
    text = environment_error(OSError(errno.ENOENT, "No such file or directory", tmp)).render()
    assert text.startswith("/proc/x.xml: error: cannot use /proc/x.xml: No such file")
    renamed = OSError(errno.EISDIR, "Is a directory", "out/.s.json.42.0a0b0c0d.tmp", "out/s.json")
    text = environment_error(renamed).render()
    assert "cannot use out/s.json: Is a directory" in text and ".tmp" not in text
