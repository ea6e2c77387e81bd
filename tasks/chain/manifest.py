"""What Kiln wrote into each instance's out dir, with the digest of each file.

Every compile task records its artifact and dumps here (size, mtime and
sha256) after it writes them. Two readers:

- the task loader checks every recorded file in one pass: a file whose
  size or mtime moved is hashed, and one whose bytes changed (a truncated
  or bit-flipped ``kernel.edf``) is removed, so doit rebuilds it as a
  missing target. A stat per file; a hash only when the stat differs.
- ``kiln clean`` deletes exactly the files listed, never anything else.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from kiln.errors import printable, relative_path
from kiln.fsutil import file_digest, stat_identity, write_bytes_atomic

MANIFEST = ".kiln-manifest.json"
FORMAT = 1


def read_doc(directory: str) -> dict:
    """The whole manifest: ``files`` (rel path -> [size, mtime_ns, sha256]) and ``sides``."""
    try:
        with open(os.path.join(directory, MANIFEST), "rb") as f:
            data = json.loads(f.read())
        if data.get("format") != FORMAT:
            return {}
        files, sides = data.get("files", {}), data.get("sides", {})
        return {
            "files": files if isinstance(files, dict) else {},
            "sides": sides if isinstance(sides, dict) else {},
        }
    except FileNotFoundError:
        return {}
    except Exception:  # any damage (nesting past the stack too)
        return {}  # a damaged manifest only loses the check; the next build rewrites it


def read(directory: str) -> dict[str, list]:
    """rel path -> [size, mtime_ns, sha256] (empty when absent or unreadable)."""
    return read_doc(directory).get("files", {})


def write(directory: str, files: dict[str, list], sides: dict | None = None) -> None:
    """Write the manifest; ``sides`` None keeps the side files already listed."""
    if sides is None:
        sides = read_doc(directory).get("sides", {})
    doc = {"format": FORMAT, "files": files, "sides": sides}
    write_bytes_atomic(os.path.join(directory, MANIFEST), json.dumps(doc, sort_keys=True).encode())


def written_files(path: str) -> list[str]:
    """``path`` itself, or every regular file below it when it is a directory (no symlinks)."""
    if os.path.isfile(path) and not os.path.islink(path):
        return [path]
    found = []
    if os.path.isdir(path) and not os.path.islink(path):
        for base, _dirs, names in os.walk(path):  # os.walk does not follow symlinked dirs
            found.extend(
                os.path.join(base, n) for n in names if not os.path.islink(os.path.join(base, n))
            )
    return sorted(found)


def record(directory: str, paths: list[str], sides: list[str] = ()) -> None:
    """Add (or refresh) the entries of ``paths`` (files or dump dirs inside ``directory``).

    ``sides`` are files a stage wrote next to its artifact (paths[0]) that
    are no task target: not checked for damage (nothing would rebuild them
    alone), but deleted with the artifact by ``kiln clean``.
    """
    doc = read_doc(directory)
    files, side_map = doc.get("files", {}), doc.get("sides", {})
    _add(directory, files, side_map, paths, sides)
    write(directory, files, side_map)


def _add(
    directory: str, files: dict, side_map: dict, paths: list[str], sides, known: dict | None = None
) -> None:
    known = known or {}
    for path in paths:
        for file in written_files(path):
            st = os.stat(file)
            rel = _relative(file, directory)
            memo = known.get(file)
            if memo is not None and memo[0] == stat_identity(st):
                digest = memo[1]
            else:
                digest = file_digest(file)
            files[rel] = [st.st_size, st.st_mtime_ns, digest]
    if paths:
        side_map[_relative(paths[0], directory)] = sorted(
            _relative(side, directory) for side in sides
        )


def _relative(path: str, directory: str) -> str:
    """``os.path.relpath`` (which works out both absolute paths: slow, per file of a build)."""
    prefix = directory.rstrip(os.sep) + os.sep
    if path.startswith(prefix) and os.path.normpath(path) == path:
        return path[len(prefix) :]
    return os.path.relpath(path, directory)


INDEX = "manifests.json"  # in the state dir: every instance's file sizes and mtimes
INDEX_FORMAT = 2  # 1 held the digests too: read as no index, and rewritten


def forget_index(state_dir: str) -> None:
    """A task changed a manifest: the next load reads the manifests again."""
    try:
        os.unlink(os.path.join(state_dir, INDEX))
    except OSError:
        pass


def _read_index(state_dir: str | None) -> dict[str, dict] | None:
    if state_dir is None:
        return None
    try:
        with open(os.path.join(state_dir, INDEX), "rb") as f:
            data = json.loads(f.read())
        dirs = data["dirs"] if data.get("format") == INDEX_FORMAT else None
        return dirs if isinstance(dirs, dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


_BUILDS = [True]  # False while a command that builds nothing (kiln view) reads the out dir


@contextmanager
def building_nothing():
    """While a command that only reads the out dir runs: a damaged file is removed all the
    same (no reader may trust it), and the warning says to rebuild it rather than that
    this command does."""
    _BUILDS.append(False)
    try:
        yield
    finally:
        _BUILDS.pop()


def _then() -> str:
    """What happens to a damaged file: rebuilt by this command, or by the next compile."""
    return "rebuilding it" if _BUILDS[-1] else "removed it: run `kiln compile` to rebuild it"


def drop_damaged(
    directories: list[str], state_dir: str | None = None, intact: set[str] | None = None
) -> list[str]:
    """Remove recorded files whose bytes changed since Kiln wrote them; returns their paths.

    One pass over ``directories`` (each instance's out dir): a stat per
    recorded file, a hash only when its size or mtime differ. The sizes and
    mtimes come from one index file in ``state_dir`` while no task has
    written since it was made (a task that writes removes it), so a no-op
    build reads one file, not one per instance; a directory where anything
    moved is checked against its own manifest, digests included. ``intact``,
    when given, receives the path of every recorded file found unchanged.
    """
    index = _read_index(state_dir)
    index_changed = index is None
    index = index or {}
    damaged: list[str] = []
    unchanged = intact if intact is not None else set()
    stat = os.stat
    for directory in directories:
        stats = index.get(directory)
        if isinstance(stats, dict):
            # the common case, in as few steps as it takes: thousands of files per no-op build
            prefix, seen = directory + os.sep, []
            for rel, entry in stats.items():
                path = prefix + rel
                try:
                    st = stat(path)  # the one syscall an intact file costs
                    if entry[1] != st.st_mtime_ns or entry[0] != st.st_size:
                        break
                except (OSError, LookupError, TypeError):  # gone, or a damaged index entry
                    break
                seen.append(path)
            else:
                unchanged.update(seen)
                continue
        files = read(directory)
        if _check_dir(directory, files, damaged, unchanged):
            try:
                write(directory, files)
            except OSError:
                pass
        fresh = {rel: entry[:2] for rel, entry in files.items()}
        if fresh != stats:
            index[directory] = fresh
            index_changed = True
    if index_changed and state_dir is not None:
        text = json.dumps({"format": INDEX_FORMAT, "dirs": index}, sort_keys=True)
        try:
            write_bytes_atomic(os.path.join(state_dir, INDEX), text.encode())
        except OSError:
            pass  # the index only saves reads
    then = _then()
    for path in damaged:
        print(
            f"kiln: warning: {printable(relative_path(path))} changed since Kiln wrote it "
            f"(damaged or edited); {then}",
            file=sys.stderr,
            flush=True,
        )
    return damaged


def _check_dir(directory: str, files: dict, damaged: list[str], unchanged: set[str]) -> bool:
    """Check one directory's recorded ``files`` (its manifest, changed in place); True if
    the manifest changed. Damaged files are removed and listed in ``damaged``."""
    changed = False
    lost_dirs = set()  # dump directories (targets) that lost a file Kiln wrote there
    for rel, entry in list(files.items()):
        path = os.path.join(directory, rel)
        try:
            size, mtime, digest = entry
        except (TypeError, ValueError):
            del files[rel]
            changed = True
            continue
        try:
            st = os.stat(path)
            if st.st_size == size and st.st_mtime_ns == mtime:
                unchanged.add(path)
                continue
            if _through_symlink(directory, rel):
                raise FileNotFoundError(path)
        except OSError:
            # missing: doit rebuilds a missing target by itself, once no symlink
            # stands in for it (a dump dir replaced by a link to elsewhere)
            damaged.extend(_unlink_links(directory, rel))
            lost_dirs.add(_dump_dir(rel))
            continue
        try:
            same = file_digest(path) == digest
        except OSError:
            same = False
        if same:  # touched, not changed: remember the new stat
            files[rel] = [st.st_size, st.st_mtime_ns, digest]
            unchanged.add(path)
        else:
            try:
                os.unlink(path)
                damaged.append(path)
            except IsADirectoryError:  # made by hand: kept aside, never deleted
                from kiln.statefiles import quarantine

                if quarantine(Path(path), "a directory where Kiln wrote a file", _then()) is None:
                    continue
            except OSError:
                continue
            del files[rel]
            lost_dirs.add(_dump_dir(rel))
        changed = True
    lost_dirs.discard(None)
    if lost_dirs:
        changed = _clear_dump_dirs(directory, files, lost_dirs) or changed
    return changed


def _dump_dir(rel: str) -> str | None:
    """The dump directory (``dumps/summary``) a recorded file lies in; None for any other."""
    parts = rel.split(os.sep)
    return os.sep.join(parts[:2]) if len(parts) > 2 and parts[0] == "dumps" else None


def _clear_dump_dirs(directory: str, files: dict, lost: set[str]) -> bool:
    """Remove the rest of what Kiln wrote in each dump directory that lost a file.

    A directory dump is one target of its task: while the directory stands,
    doit takes the task as built, and the file lost in it would never come
    back. Emptied and removed, the target is missing and the next build
    writes the whole directory again. A file of yours in it stays (and so
    does the directory).
    """
    for rel in [r for r in files if _dump_dir(r) in lost]:
        try:
            os.unlink(os.path.join(directory, rel))
        except FileNotFoundError:
            pass
        except OSError:
            continue
        del files[rel]
    for name in lost:
        try:
            os.rmdir(os.path.join(directory, name))  # only when empty
        except OSError:
            pass
    return True


def _through_symlink(directory: str, rel: str) -> bool:
    parts = rel.split(os.sep)
    return any(
        os.path.islink(os.path.join(directory, *parts[:n])) for n in range(1, len(parts) + 1)
    )


def _unlink_links(directory: str, rel: str) -> list[str]:
    """Remove symlinks standing on the path of a recorded file (never their targets)."""
    parts = rel.split(os.sep)
    removed = []
    for n in range(1, len(parts) + 1):
        path = os.path.join(directory, *parts[:n])
        if os.path.islink(path):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
            break
    return removed


def prune(directory: str, stop: str) -> None:
    """Remove ``directory`` and its parents while empty, up to but never ``stop``."""
    stop = os.path.abspath(stop)
    directory = os.path.abspath(directory)
    while directory != stop and directory.startswith(stop + os.sep):
        try:
            os.rmdir(directory)  # only when empty
        except OSError:
            return
        directory = os.path.dirname(directory)


def real_dir(path: Path, inside: Path) -> None:
    """Make ``path`` a real directory below ``inside``: a symlink on the way is removed.

    A dump directory replaced by a symlink must not make Kiln write
    wherever the link points.
    """
    parts = []
    current = path
    while current != inside and inside in current.parents:
        parts.append(current)
        current = current.parent
    for part in reversed(parts):
        if part.is_symlink():
            print(
                f"kiln: warning: {printable(relative_path(part))} is a symlink; "
                "replacing it by a directory (its target is left alone)",
                file=sys.stderr,
            )
            part.unlink()
    path.mkdir(parents=True, exist_ok=True)


def clean_targets(
    directory: str, targets: list[str], stop: str, state_dir: str, *, dryrun: bool = False
) -> None:
    """doit's clean for one compile task: delete what it wrote, as the manifest lists it.

    A target directory (``dumps/summary``) loses only the files Kiln wrote
    into it; a symlink is removed, never followed; empty directories go,
    up to but never including ``stop`` (the out dir). ``dryrun`` only says
    what would go.
    """
    doc = read_doc(directory)
    files, sides = doc.get("files", {}), doc.get("sides", {})
    if dryrun:
        for target in targets:
            for rel in _owned(directory, target, files, sides):
                if os.path.lexists(path := os.path.join(directory, rel)):
                    print(f"kiln: would remove {printable(relative_path(path))}")
        return
    forget_index(state_dir)
    for target in targets:
        owned = _owned(directory, target, files, sides)
        sides.pop(os.path.relpath(target, directory), None)
        for rel in owned:
            path = os.path.join(directory, rel)
            try:
                os.unlink(path)
                print(f"kiln: removed {printable(relative_path(path))}")
            except OSError:
                pass
            files.pop(rel, None)
            prune(os.path.dirname(path), stop)
    if files or sides:
        write(directory, files, sides)
    else:
        try:
            os.unlink(os.path.join(directory, MANIFEST))
        except OSError:
            pass
        prune(directory, stop)


def _owned(directory: str, target: str, files: dict, sides: dict) -> list[str]:
    """What one target of a compile task stands for, relative to ``directory``."""
    rel_target = os.path.relpath(target, directory)
    owned = [r for r in files if r == rel_target or r.startswith(rel_target + os.sep)]
    if os.path.islink(target) or (os.path.isfile(target) and rel_target not in owned):
        owned.append(rel_target)  # the artifact itself, also when written before the manifest
    return owned + [side for side in sides.get(rel_target, []) if not side.startswith("..")]
