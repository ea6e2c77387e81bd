"""YAML loading that remembers the line and column of every key and value.

PyYAML's constructors drop node marks and silently keep the last of two
equal keys, so this module composes the node tree (with libyaml when it is
available) and builds plain Python data from it itself: mapping keys are
their scalar text, duplicates are errors, ``<<`` merge keys work, and each
key path (``kernels.gemm.shapes.small.M``, ``stages[2].module``) gets a
position.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.errors import Location, PipelineError

if TYPE_CHECKING:  # PyYAML itself is imported only when a file is parsed
    import yaml

_MERGE_TAG = "tag:yaml.org,2002:merge"
_COLLECTION_TAGS = ("tag:yaml.org,2002:seq", "tag:yaml.org,2002:map")

# Bounds on what a pipeline file may make the loader do. A real pipeline is
# far inside them; an alias bomb ("billion laughs") or a pathological nesting
# is refused before it is expanded, in milliseconds, at its own line.
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 64
MAX_VALUES = 1_000_000  # keys, values and items once every alias is expanded

Position = tuple[int, int]  # 1-based line and column


def child_path(parent: str, key: str | int) -> str:
    """The key path of ``key`` (a mapping key or a list index) under ``parent``."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def parent_path(path: str) -> str | None:
    """The key path one level up; ``""`` is the document root, its parent None."""
    if not path:
        return None
    if path.endswith("]"):
        return path[: path.rindex("[")]
    cut = path.rfind(".")
    bracket = path.rfind("]")
    if cut < 0 or cut < bracket:
        return path[: bracket + 1] if bracket >= 0 else ""
    return path[:cut]


def join_path(parts: Any) -> str:
    """The key path of a sequence of keys and indexes (jsonschema's ``absolute_path``)."""
    path = ""
    for part in parts:
        path = child_path(path, part) if isinstance(part, int) else child_path(path, str(part))
    return path


_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
_KINDS.update({list: "a list", dict: "a mapping", type(None): "nothing (null)"})


def describe(value: Any) -> str:
    """How a found value is shown in a message: its YAML kind and a short repr."""
    kind = _KINDS.get(type(value), type(value).__name__)
    if value is None:
        return kind
    text = repr(value)
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"


def did_you_mean(word: Any, choices: Any) -> str | None:
    """A "did you mean 'X'?" hint for a misspelt name, or None."""
    if not isinstance(word, str):
        return None
    import difflib

    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None


def display_name(path: Path | str) -> str:
    """How a file is named in messages: relative to the cwd when it lies below it."""
    path = Path(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclass(slots=True)
class SourceMap:
    """Where each key path of one YAML file was written."""

    file: str
    lines: tuple[str, ...]
    keys: dict[str, Position]  # position of the key text of a mapping entry
    values: dict[str, Position]  # position of the value (or list item)

    def is_builtin(self, key_path: str) -> bool:
        """Whether ``key_path`` is a built-in default rather than this file's (never, here)."""
        return False

    def written(self, key_path: str) -> bool:
        """Whether ``key_path`` itself is written in the file (not only a parent of it)."""
        return key_path in self.keys or key_path in self.values

    def source(self, line: int | None) -> str | None:
        if line is None or not 1 <= line <= len(self.lines):
            return None
        return self.lines[line - 1]

    def position(self, key_path: str, *, value: bool = False) -> Position | None:
        """The key's position (or the value's), falling back to the nearest parent."""
        path: str | None = key_path
        while path is not None:
            first, second = (self.values, self.keys) if value else (self.keys, self.values)
            pos = first.get(path) or second.get(path)
            if pos is not None:
                return pos
            path = parent_path(path)
        return None

    def locate(self, key_path: str, *, value: bool = False) -> Location:
        """A Location for ``key_path``: its key by default, its value when asked."""
        pos = self.position(key_path, value=value)
        if pos is None:
            return Location(self.file, key_path=key_path or None)
        return Location(self.file, pos[0], pos[1], key_path or None, self.source(pos[0]))

    def error(
        self, message: str, key_path: str, *, value: bool = False, **detail: Any
    ) -> PipelineError:
        """A PipelineError pointing at ``key_path`` (``expected=``, ``found=``, ``hint=``)."""
        return PipelineError(message, self.locate(key_path, value=value), **detail)


def _mark_error(file: str, lines: tuple[str, ...], exc: Any) -> PipelineError:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "cannot parse"
    notes = []
    if exc.context and exc.problem and exc.context_mark is not None:
        notes.append(f"{exc.context} (line {exc.context_mark.line + 1})")
    if "end of stream" in problem and exc.context_mark is not None:
        # an unclosed quote or bracket: the useful place is where it opens, not the file's end
        mark, notes = exc.context_mark, [f"{problem} (line {exc.problem_mark.line + 1})"]
        if "quoted scalar" in (exc.context or ""):
            problem = "unclosed quote: the string that starts here never ends"
    if mark is None:
        return PipelineError(f"invalid YAML: {problem}", Location(file), notes=notes)
    line, column = mark.line + 1, mark.column + 1
    source = lines[line - 1] if 1 <= line <= len(lines) else None
    indent = (source or "")[: len(source or "") - len((source or "").lstrip(" \t"))]
    if "\t" in indent:  # the parser's words ("cannot start any token") never say "tab"
        return PipelineError(
            "invalid YAML: a tab indents this line",
            Location(file, line, indent.index("\t") + 1, None, source),
            expected="indentation with spaces",
            found="a tab character",
            hint="replace the tab with spaces: YAML does not allow tabs in indentation",
        )
    return PipelineError(
        f"invalid YAML: {problem}",
        Location(file, line, column, None, source),
        expected="valid YAML",
        found=problem,
        notes=notes,
        hint=_INDENT_HINT if problem in _INDENT_PROBLEMS else None,
    )


# What the parser says when a line is indented too little or too much.
_INDENT_PROBLEMS = (
    "did not find expected key",
    "mapping values are not allowed in this context",
    "did not find expected '-' indicator",
)
_INDENT_HINT = (
    "check the indentation of this line and the one above: the keys of one mapping "
    "start in the same column, and a key's value is indented further than the key"
)


class _Builder:
    """Turns a composed node tree into dicts/lists/scalars and a SourceMap."""

    def __init__(self, loader: Any, smap: SourceMap) -> None:
        self.loader = loader
        self.smap = smap
        self.active: set[int] = set()  # nodes on the current path (recursive aliases)
        self.merging = 0  # > 0 while building the mapping of a `<<` merge key

    def pos(self, node: yaml.Node) -> Position:
        return (node.start_mark.line + 1, node.start_mark.column + 1)

    def build(self, node: yaml.Node, path: str) -> Any:
        self.smap.values.setdefault(path, self.pos(node))
        if node.id == "scalar":
            return self.loader.construct_object(node)
        if node.tag not in _COLLECTION_TAGS:
            raise self.smap.error(
                f"YAML tag {node.tag!r} is not allowed",
                path,
                value=True,
                expected="plain YAML mappings, lists and scalars (no tags)",
                found=node.tag,
                hint="remove the tag",
            )
        if id(node) in self.active:
            raise self.smap.error(
                "recursive YAML alias",
                path,
                value=True,
                expected="a finite document",
                found="an alias inside its own anchor",
            )
        self.active.add(id(node))
        try:
            if node.id == "sequence":
                return [self.build(item, child_path(path, i)) for i, item in enumerate(node.value)]
            return self.mapping(node, path)
        finally:
            self.active.discard(id(node))

    def key_text(self, key: yaml.Node, path: str) -> str:
        if key.id != "scalar":
            line, col = self.pos(key)
            raise PipelineError(
                "mapping keys must be plain names",
                Location(self.smap.file, line, col, path or None, self.smap.source(line)),
                expected="a scalar key such as `name:`",
                found=f"a {'list' if key.id == 'sequence' else 'mapping'} used as a key",
            )
        text = str(key.value)
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):  # a name that would drive a terminal
            line, col = self.pos(key)
            raise PipelineError(
                "a key contains a control character",
                Location(self.smap.file, line, col, path or None, self.smap.source(line)),
                expected="a name of printable characters",
                found=repr(text),
                hint="remove the escape sequence, newline or NUL from the name",
            )
        return text

    def record(self, path: str, key: yaml.Node, value: yaml.Node) -> None:
        if self.merging:  # a merged key never moves an explicit key's position
            self.smap.keys.setdefault(path, self.pos(key))
            self.smap.values.setdefault(path, self.pos(value))
        else:
            self.smap.keys[path] = self.pos(key)
            self.smap.values[path] = self.pos(value)

    def mapping(self, node: yaml.MappingNode, path: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        merges: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append((key_node, value_node))
                continue
            key = self.key_text(key_node, path)
            sub = child_path(path, key)
            if key in result:
                first = self.smap.keys.get(sub, self.pos(key_node))
                line, col = self.pos(key_node)
                raise PipelineError(
                    f"duplicate key '{key}'",
                    Location(self.smap.file, line, col, sub, self.smap.source(line)),
                    expected="each key at most once in a mapping",
                    found=f"'{key}' again (first defined at line {first[0]})",
                    hint="merge the two entries or rename one of them",
                )
            self.record(sub, key_node, value_node)
            result[key] = self.build(value_node, sub)
        for merge_key, merge in merges:  # explicit keys win; among merged mappings, the first wins
            sources = merge.value if merge.id == "sequence" else [merge]
            for source in sources:
                if source.id != "mapping":  # at the `<<` (an alias's node sits at its anchor)
                    line, col = self.pos(merge_key)
                    found = "a list" if source.id == "sequence" else f"the value {source.value!r}"
                    found += f" (line {self.pos(source)[0]})" if self.pos(source)[0] != line else ""
                    raise PipelineError(
                        "a '<<' merge key needs a mapping or a list of mappings",
                        Location(self.smap.file, line, col, path or None, self.smap.source(line)),
                        expected="an alias of a mapping",
                        found=found,
                        hint="anchor a mapping (`base: &base {...}`), then write `<<: *base`",
                    )
                self.merging += 1
                try:
                    merged = self.build(source, path)
                finally:
                    self.merging -= 1
                for key, value in merged.items():
                    result.setdefault(key, value)
        return result


def _too_deep(text: str) -> tuple[int | None, int | None]:
    """Where ``text`` first nests deeper than MAX_DEPTH: (line, column), 1-based.

    YAML's scanner is a loop, not a recursion, so its tokens find the place
    that the recursive composer could not reach; (None, None) if they do not.
    """
    import yaml

    opening = (
        yaml.BlockMappingStartToken,
        yaml.BlockSequenceStartToken,
        yaml.FlowMappingStartToken,
        yaml.FlowSequenceStartToken,
    )
    closing = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)
    depth = 0
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if isinstance(token, opening):
                depth += 1
                if depth > MAX_DEPTH:
                    return token.start_mark.line + 1, token.start_mark.column + 1
            elif isinstance(token, closing):
                depth -= 1
    except (yaml.YAMLError, RecursionError):
        pass
    return None, None


def _check_bounds(root: yaml.Node, smap: SourceMap) -> None:
    """Refuse a tree nested deeper than MAX_DEPTH or that expands past MAX_VALUES.

    One pass over the composed nodes (an alias is the same node object as
    its anchor, so each is visited once): the height and expanded size of
    every node are memoized, so the check costs the file's size, not the
    bomb's.
    """
    height: dict[int, int] = {}
    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if node.id == "scalar":
            height[key], size[key] = 1, 1
            continue
        children = [c for pair in node.value for c in pair] if node.id == "mapping" else node.value
        if not done:
            if key in height or key in on_path:  # shared (alias) or recursive: the builder says so
                continue
            on_path.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in height)
            continue
        on_path.discard(key)
        height[key] = 1 + max((height.get(id(c), 1) for c in children), default=0)
        size[key] = 1 + sum(size.get(id(c), 1) for c in children)
        line, column = node.start_mark.line + 1, node.start_mark.column + 1
        where = Location(smap.file, line, column, None, smap.source(line))
        if height[key] > MAX_DEPTH:
            raise PipelineError(
                f"YAML nested too deeply (more than {MAX_DEPTH} levels)",
                where,
                expected=f"at most {MAX_DEPTH} levels of nested mappings and lists",
                found=f"{height[key]} levels below this line",
            )
        if size[key] > MAX_VALUES:
            raise PipelineError(
                "YAML aliases expand to too many values",
                where,
                expected=f"at most {MAX_VALUES:,} values once aliases are expanded",
                found=f"{size[key]:,} values from this node",
                hint="an alias inside an anchor that is itself aliased many times "
                "multiplies; write the values out, or alias less",
            )


# YAML 1.2's core schema reads 1e-5, 1E3, -2e+4 and 1.0e5 as floats; PyYAML's
# YAML 1.1 resolver wants a dot and a signed exponent, and made them strings.
_FLOAT_12 = r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"
_loader: Any = None


def _loader_class() -> Any:
    """PyYAML's safe loader (libyaml's when available) that also resolves YAML 1.2 floats.

    A subclass: ``add_implicit_resolver`` on it copies the resolver table,
    so PyYAML's own loaders are left as they are. A quoted scalar is never
    resolved, so ``'1e-5'`` stays a string.
    """
    global _loader
    if _loader is None:
        import re

        import yaml

        class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
            pass

        Loader.add_implicit_resolver(
            "tag:yaml.org,2002:float", re.compile(_FLOAT_12), list("-+0123456789.")
        )
        _loader = Loader
    return _loader


def load_yaml(path: Path, text: str | None = None) -> tuple[Any, SourceMap]:
    """Parse ``path`` (or ``text``) into plain data and a SourceMap.

    Raises PipelineError for unreadable files, invalid YAML, duplicate keys,
    non-scalar keys and recursive aliases. An empty document gives ``None``.
    """
    file = display_name(path)
    if text is None:
        try:
            if Path(path).stat().st_size > MAX_FILE_BYTES:
                raise PipelineError(
                    "pipeline file is too large",
                    Location(file),
                    expected=f"at most {MAX_FILE_BYTES // (1024 * 1024)} MiB",
                    found=f"{Path(path).stat().st_size:,} bytes",
                )
            text = Path(path).read_bytes().decode("utf-8-sig")  # a BOM is not content
        except FileNotFoundError:
            raise PipelineError(f"pipeline file not found: {file}", Location(file)) from None
        except UnicodeDecodeError as exc:  # point at the line of the first bad byte
            raw = exc.object
            line = raw[: exc.start].count(b"\n") + 1
            column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
            bad = raw[exc.start : exc.end].hex(" ")
            found = f"byte(s) {bad} at line {line}, column {column}"
            if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):  # what Windows editors call "Unicode"
                found = f"UTF-16 text (it starts with the byte order mark {raw[:2].hex(' ')})"
            shown = raw.split(b"\n")[line - 1].rstrip(b"\r").decode("utf-8", "replace")
            raise PipelineError(
                f"pipeline file is not UTF-8 text: {exc.reason}",
                Location(file, line, column, None, shown),
                expected="UTF-8 text",
                found=found,
                hint="save the file with the UTF-8 encoding (your editor's 'Save with Encoding')",
            ) from None
        except OSError as exc:
            raise PipelineError(
                f"cannot read pipeline file: {os.strerror(exc.errno or 0)}", Location(file)
            ) from None
    import yaml

    lines = tuple(text.splitlines())
    smap = SourceMap(file, lines, {}, {})
    loader = _loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, smap
        _check_bounds(node, smap)
        data = _Builder(loader, smap).build(node, "")
    except yaml.MarkedYAMLError as exc:
        raise _mark_error(file, lines, exc) from None
    except yaml.reader.ReaderError as exc:  # a byte YAML does not allow: find its line
        before = text[: exc.position]
        line = before.count("\n") + 1
        column = exc.position - (before.rfind("\n") + 1) + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character or "?")
        raise PipelineError(
            f"invalid YAML: character U+{char:04X} is not allowed in a YAML file",
            Location(file, line, column, None, lines[line - 1] if line <= len(lines) else None),
            expected="printable text",
            found=f"U+{char:04X} ({exc.reason})",
        ) from None
    except yaml.YAMLError as exc:  # any other error with no mark
        raise PipelineError(f"invalid YAML: {exc}", Location(file)) from None
    except RecursionError:  # the pure-Python parser, without libyaml's own depth limit
        line, column = _too_deep(text)
        source = lines[line - 1] if line is not None and line <= len(lines) else None
        raise PipelineError(
            f"YAML nested too deeply (more than {MAX_DEPTH} levels)",
            Location(file, line, column, None, source),
            expected=f"at most {MAX_DEPTH} levels of nested mappings and lists",
            found="a collection opened here, deeper than that",
        ) from None
    finally:
        loader.dispose()
    return data, smap
