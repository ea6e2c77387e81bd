"""Which kernel instances (or which app) a command's FILTER arguments name.

One rule for every subcommand (compile, status, run, test, bench, tune,
view, graph, clean):

- an exact kernel name (``gemm``) selects that kernel, every shape set;
- an exact instance name (``gemm.small``) selects that instance;
- an exact module or function path (``kernels.linalg``, ``kernels.linalg.gemm``)
  selects the kernels defined there;
- a glob (``gemm*``, ``*norm``, ``kernels.nn.*``) selects every match;
- a substring of a kernel's full path (package.module.function) or of an
  instance name selects every kernel it is found in, as ``cargo test``,
  ``pytest -k`` and the kernel optimizer's ``compile [FILTER]`` do, and the
  command says how many it picked;
- where one kernel is needed (``kiln run KERNEL``, a dump flag, ``--shape``)
  a substring found in several kernels stops with the candidates instead;
- ``kernel:NAME`` and ``app:NAME`` say which namespace a name lives in when
  a kernel and an app share it (``problem:NAME`` belongs to ``kiln bench``).

A FILTER that matches nothing is one error that names the kernels and the
nearest one, with the exact command to type.
"""

from __future__ import annotations

import difflib
import fnmatch
import shlex
import sys
from dataclasses import dataclass, field

from kiln.errors import KilnError

KERNEL_PREFIX = "kernel:"
APP_PREFIX = "app:"
GLOB_CHARS = "*?["
SINGLE_INSTANCE_COMMANDS = frozenset({"run"})  # a glob cannot help there
SHOWN_NAMES = 5  # kernels a selection note names; -v names them all
# the filters of the selection being made, dropped from a suggested command line
_LAST_FILTERS: list[str] = []


@dataclass
class Selection:
    """The instances a command acts on, or the one app it names."""

    instances: list = field(default_factory=list)
    app: str | None = None


def select(
    project,
    filters: list[str] | None,
    *,
    packages: list[str] | tuple[str, ...] = (),
    shape_set: str | None = None,
    apps: bool = False,
    command: str | None = None,
    single: bool = False,
) -> Selection:
    """Resolve ``filters`` against the project; ``apps`` lets one filter name an app.

    ``single``: the command needs one kernel (a dump flag, ``--shape``), so a
    substring found in several kernels is an error listing them, as for ``run``.
    """
    filters = list(filters or [])
    single = single or command in SINGLE_INSTANCE_COMMANDS
    _LAST_FILTERS[:] = filters
    app = _app_named(project, filters, apps, command)
    if app is not None:
        if packages or shape_set:
            flag = "--shapes" if shape_set else "-p/--package"
            raise KilnError(
                f"{flag} picks kernels; {app!r} is an app",
                hint="an app's kernel calls pick their instances by the shapes they pass",
            )
        return Selection(app=app)
    chosen = list(project.instances)
    if packages:
        chosen = [i for i in chosen if any(_in_package(i.source.path, p) for p in packages)]
        if not chosen:
            raise KilnError(
                "no kernel is defined in package " + ", ".join(repr(p) for p in packages),
                expected="a package of pipeline.yaml: " + ", ".join(project.pipeline.packages),
                found=", ".join(packages),
            )
    if filters:
        picked: dict[str, object] = {}
        for pattern in filters:
            found, loose = _match(project, chosen, pattern, command, single)
            if loose:
                _say_picked(pattern, found, command)
            for inst in found:
                picked.setdefault(inst.name, inst)
        chosen = [i for i in chosen if i.name in picked]
    if shape_set is not None:
        narrowed = [i for i in chosen if i.shape_set == shape_set]
        if not narrowed:
            sets = sorted({i.shape_set for i in chosen})
            raise KilnError(
                f"no selected kernel has a shape set named {shape_set!r}",
                expected="one of: " + (", ".join(sets) or "(none)"),
                found=shape_set,
                hint=f"try `{_retyped(command, '--shapes', sets[0])}`" if sets else None,
            )
        chosen = narrowed
    return Selection(instances=chosen)


def one_instance(selection: Selection, command: str | None, what: str) -> object:
    """The single instance ``what`` (a dump, a run) needs, or an error naming the choices."""
    instances = selection.instances
    if len(instances) == 1:
        return instances[0]
    kernels = sorted({i.kernel for i in instances})
    if len(kernels) > 1:
        raise KilnError(
            f"{what} needs exactly one kernel, but the filters select {len(kernels)}",
            expected="a filter that names one kernel",
            found=", ".join(kernels),
            hint=f"type e.g. `{_replace_filters(command, kernels[0])}`",
        )
    sets = [i.shape_set for i in instances]
    raise KilnError(
        f"{what} needs one shape set, but kernel {kernels[0]!r} has {len(sets)}",
        expected=f"--shapes NAME (or the instance name, e.g. {instances[0].name})",
        found=", ".join(sets),
        hint=f"type e.g. `{_retyped(command, '--shapes', sets[0])}`",
    )


def first_shape_set(selection: Selection, command: str | None, what: str) -> object:
    """One kernel's first declared shape set when no --shapes narrowed it, saying so.

    Several kernels are still an error (``one_instance``): which one is meant
    cannot be guessed, but a kernel's first shape set is its usual one.
    """
    from kiln.logconfig import verbosity

    instances = selection.instances
    if len({i.kernel for i in instances}) == 1 and len(instances) > 1:
        first = instances[0]
        others = ", ".join(i.shape_set for i in instances[1:])
        if verbosity() == 0:  # -q: the run or dump itself says which instance
            return first
        print(
            f"kiln {command or ''}: {first.kernel} has {len(instances)} shape sets; "
            f"{what} uses {first.shape_set} (pick another with --shapes: {others})",
            file=sys.stderr,
        )
        return first
    return one_instance(selection, command, what)


# -- matching -------------------------------------------------------------------------


def _app_named(project, filters: list[str], apps: bool, command: str | None) -> str | None:
    app_names = {a.name for a in project.pipeline.apps}
    kernel_names = {i.kernel for i in project.instances}
    named = [f for f in filters if f.startswith(APP_PREFIX)]
    if named:
        name = named[0][len(APP_PREFIX) :]
        if not apps:
            raise KilnError(
                f"`kiln {command or ''}` acts on kernels, not apps",
                found=named[0],
                hint="apps are run, tested and inspected with kiln run, test and status",
            )
        if name not in app_names:
            raise KilnError(
                f"no app named {name!r}",
                expected="an app of pipeline.yaml: " + (", ".join(sorted(app_names)) or "(none)"),
                found=name,
                hint=_did_you_mean(name, sorted(app_names), APP_PREFIX),
            )
        if len(filters) > 1:
            raise KilnError("an app is selected alone", found=" ".join(filters))
        return name
    if len(filters) == 1 and filters[0] in app_names and apps:
        name = filters[0]
        if name in kernel_names:
            raise KilnError(
                f"{name!r} is both a kernel and an app",
                expected=f"{KERNEL_PREFIX}{name} or {APP_PREFIX}{name}",
                found=name,
                hint=f"type `{_replace_filters(command, APP_PREFIX + name)}` or "
                f"`{_replace_filters(command, KERNEL_PREFIX + name)}`",
            )
        return name
    plain_apps = [f for f in filters if f in app_names and f not in kernel_names]
    if apps and len(filters) > 1 and plain_apps:
        # with another FILTER beside it the name would match instances by substring
        # instead: the app's own tests would never run, and the run could pass green
        raise KilnError(
            "an app is selected alone",
            found=" ".join(filters),
            hint=f"one app per command: `{_replace_filters(command, plain_apps[0])}`",
        )
    return None


def _say_picked(pattern: str, found: list, command: str | None) -> None:
    """One line on stderr: how many kernels a glob or substring FILTER picked, and which."""
    from kiln.logconfig import verbosity

    level = verbosity()
    if level == 0:  # -q: the selection is what was asked for
        return
    kernels = list(dict.fromkeys(i.kernel for i in found))
    shown = kernels if level > 1 else kernels[:SHOWN_NAMES]
    more = len(kernels) - len(shown)
    names = ", ".join(shown) + (f" and {more} more (-v lists them)" if more else "")
    count = f"{len(kernels)} kernel{'s' * (len(kernels) != 1)}"
    if len(found) != len(kernels):
        count += f" ({len(found)} instances)"
    print(f"kiln {command or ''}: {pattern!r} selects {count}: {names}", file=sys.stderr)


def _match(
    project, instances: list, pattern: str, command: str | None, single: bool = False
) -> tuple[list, bool]:
    """The instances ``pattern`` selects, and whether it was a glob or substring (not a name)."""
    name = pattern.removeprefix(KERNEL_PREFIX)
    if not name.strip():  # '' is a substring of every name: an empty shell variable, likely
        raise KilnError(
            "an empty FILTER selects nothing",
            expected="a kernel name, an instance (kernel.shapes), a module path, or a glob",
            found=repr(pattern),
            hint="leave the FILTER out to select every kernel",
        )
    exact = [
        i
        for i in instances
        if name in (i.kernel, i.name, i.source.path) or _in_package(i.source.path, name)
    ]
    if exact:
        return exact, False
    if any(c in name for c in GLOB_CHARS):
        found = [
            i
            for i in instances
            if any(fnmatch.fnmatchcase(s, name) for s in (i.kernel, i.name, i.source.path))
        ]
        if not found:
            raise _no_match(project, instances, pattern, command)
        return found, True
    found = [i for i in instances if name in i.name or name in i.source.path]
    kernels = sorted({i.kernel for i in found})
    if not kernels:
        raise _no_match(project, instances, pattern, command)
    if len(kernels) == 1 or not single:
        return found, True
    raise KilnError(
        f"{pattern!r} matches {len(kernels)} kernels: {', '.join(kernels)}",
        expected="one kernel: its exact name, an instance (kernel.shapes), or a substring "
        "found in that kernel only",
        found=pattern,
        hint=f"type `{_replace_filters(command, kernels[0], pattern)}`",
    )


def _no_match(project, instances: list, pattern: str, command: str | None) -> KilnError:
    names = sorted({i.kernel for i in instances})
    apps = sorted(a.name for a in project.pipeline.apps)
    notes = ["kernels: " + (", ".join(names) or "(none)")]
    if apps:
        notes.append("apps: " + ", ".join(apps))
    bare = pattern.removeprefix(KERNEL_PREFIX)
    if pattern in apps:  # commands that take apps resolved it before: this one does not
        return KilnError(
            f"{pattern!r} is an app, and `kiln {command or ''}` acts on kernels",
            expected="a kernel name, an instance (kernel.shapes), a module path, or a glob",
            found=pattern,
            hint=f"`kiln run {pattern}` builds the kernels the app reaches and runs it; "
            f"`kiln status {pattern}` lists them",
            notes=notes,
        )
    close = difflib.get_close_matches(bare, names, n=1)
    return KilnError(
        f"no kernel matches {pattern!r}",
        expected="a kernel name, an instance (kernel.shapes), a module path, or a glob",
        found=pattern,
        hint=f"did you mean `{_replace_filters(command, close[0], pattern)}`?" if close else None,
        notes=notes,
    )


def _in_package(path: str, package: str) -> bool:
    return path.startswith(package + ".")


def _did_you_mean(name: str, names: list[str], prefix: str = "") -> str | None:
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {prefix}{close[0]}?" if close else None


# -- the command to type ---------------------------------------------------------------


def _argv() -> list[str]:
    """The arguments after ``kiln`` as the user typed them (global flags dropped)."""
    args = list(sys.argv[1:])
    while args and args[0].startswith("-"):
        args = args[2:] if args[0] in ("-f", "--file") else args[1:]
    return args


def _replace_filters(command: str | None, replacement: str, pattern: str | None = None) -> str:
    """The user's command line with ``pattern`` replaced by ``replacement``.

    Without ``pattern`` the filters the user typed (none of the options) give
    way to ``replacement`` right after the command.
    """
    argv = _argv()
    if not (command and argv[:1] == [command]):
        return shlex.join(["kiln", command or "compile", replacement])
    if pattern is not None and pattern in argv:
        return shlex.join(["kiln", *(replacement if a == pattern else a for a in argv)])
    filters = set(_LAST_FILTERS)
    rest = [a for a in argv[1:] if a not in filters]
    return shlex.join(["kiln", command, replacement, *rest])


def _retyped(command: str | None, flag: str, value: str) -> str:
    """The user's command line with ``flag value`` set (replaced when already there)."""
    argv = _argv()
    if not (command and argv[:1] == [command]):
        argv = [command or "compile"]
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return shlex.join(["kiln", *out, flag, value])
