"""`kiln completion bash|zsh|fish`: shell completion scripts, generated from the parser.

Every command, option and choice comes from kiln/cli/parser.py's parser, so a
new option completes in every shell the day it is added.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from kiln.cli.help import SUMMARIES
from kiln.cli.parser import build_parser, subcommands

PATH_METAVARS = {"FILE", "DIR", "PATH"}


@dataclass
class Option:
    names: list[str]
    help: str
    takes_value: bool
    choices: list[str] | None = None
    path: bool = False
    repeat: bool = False
    metavar: str = "VALUE"


@dataclass
class Command:
    name: str  # "compile", or "cache gc" for a nested command
    help: str
    options: list[Option]
    words: list[str] = field(default_factory=list)  # what its positional may be
    path_arg: bool = False  # its positional is a file or directory
    children: list[Command] = field(default_factory=list)


def cmd_completion(args: argparse.Namespace) -> int:
    print(script(args.shell), end="")
    return 0


def script(shell: str, parser: argparse.ArgumentParser | None = None) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    parser = parser or build_parser()
    top = _options(parser)
    commands = [_command(name, sub, text) for name, sub, text in subcommands(parser)]
    commands += [Command(name, text, []) for name, text in DOIT_PASSED_ON.items()]
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](top, commands)


# doit's commands `kiln --help` names, which kiln passes on to doit
DOIT_PASSED_ON = {
    "list": "list the doit tasks (doit's command)",
    "info": "show a task's doit record (doit's command)",
    "forget": "forget what doit recorded of tasks (doit's command)",
}


def _options(parser: argparse.ArgumentParser) -> list[Option]:
    out = []
    for action in parser._actions:  # argparse has no public accessor
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        metavar = action.metavar if isinstance(action.metavar, str) else ""
        out.append(
            Option(
                names=list(action.option_strings),
                help=action.help or "",
                takes_value=action.nargs != 0,
                choices=[str(c) for c in action.choices] if action.choices else None,
                path=action.type is Path or metavar in PATH_METAVARS,
                repeat=isinstance(action, argparse._AppendAction),
                metavar=metavar or action.dest.upper(),
            )
        )
    return out


def _command(name: str, parser: argparse.ArgumentParser, text: str) -> Command:
    cmd = Command(name, text or SUMMARIES.get(name, ""), _options(parser))
    children = subcommands(parser)
    cmd.children = [_command(f"{name} {n}", p, t) for n, p, t in children]
    cmd.words = [n for n, _, _ in children]
    for action in parser._actions:
        if action.option_strings or isinstance(action, argparse._SubParsersAction):
            continue
        if action.choices:
            cmd.words += [str(c) for c in action.choices]
        elif action.type is Path:
            cmd.path_arg = True
    if name == "help":
        cmd.words = list(SUMMARIES)
    return cmd


def _all(commands: list[Command]) -> list[Command]:
    return [c for cmd in commands for c in (cmd, *_all(cmd.children))]


# -- bash ------------------------------------------------------------------------


def bash(top: list[Option], commands: list[Command]) -> str:
    names = " ".join(c.name for c in commands)
    top_words = " ".join(n for o in top for n in o.names)
    top_cases, value_cases, option_cases, word_cases = [], [], [], []
    for cmd in [Command("", "", top), *_all(commands)]:
        for opt in cmd.options:
            if not opt.takes_value:
                continue
            keys = "|".join(f'"{cmd.name} {n}"' for n in opt.names)
            if opt.choices:
                reply = f'COMPREPLY=($(compgen -W "{" ".join(opt.choices)}" -- "$cur"))'
            elif opt.path:
                reply = 'COMPREPLY=($(compgen -f -- "$cur"))'
            else:
                reply = ":"  # a free-form value: nothing to offer
            (value_cases if cmd.name else top_cases).append(f"        {keys}) {reply}; return ;;")
        if cmd.name:
            opts = " ".join(n for o in cmd.options for n in o.names)
            option_cases.append(f'        "{cmd.name}") opts="{opts}" ;;')
            if cmd.words:
                words = " ".join(cmd.words)
                word_cases.append(
                    f'        "{cmd.name}") COMPREPLY=($(compgen -W "{words}" -- "$cur")) ;;'
                )
    nested = " ".join(c.name for c in commands if c.children)
    return BASH_TEMPLATE.format(
        commands=names,
        top_words=top_words,
        nested=nested,
        top_value_cases="\n".join(top_cases),
        value_cases="\n".join(value_cases),
        option_cases="\n".join(option_cases),
        word_cases="\n".join(word_cases),
    )


BASH_TEMPLATE = """\
# bash completion for kiln; generated by `kiln completion bash`.
# Install: kiln completion bash > ~/.local/share/bash-completion/completions/kiln

_kiln() {{
    local cur prev cmd="" sub="" key opts="" i word
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        case "$word" in
            -f|--file) ((i++)) ;;
            -*) ;;
            *)
                if [[ -z $cmd ]]; then
                    cmd="$word"
                elif [[ -z $sub ]]; then
                    sub="$word"
                fi
                ;;
        esac
    done
    if [[ -z $cmd ]]; then
        case " $prev" in
{top_value_cases}
        esac
        COMPREPLY=($(compgen -W "{commands} {top_words}" -- "$cur"))
        return
    fi
    key="$cmd"
    if [[ " {nested} " == *" $cmd "* && -n $sub ]]; then
        key="$cmd $sub"
    fi
    case "$key $prev" in
{value_cases}
    esac
    if [[ $cur == -* ]]; then
        case "$key" in
{option_cases}
        esac
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        return
    fi
    case "$key" in
{word_cases}
    esac
}}

complete -o default -F _kiln kiln
"""


# -- zsh -------------------------------------------------------------------------


def _zq(text: str) -> str:
    """``text`` inside a zsh single-quoted _arguments description."""
    text = re.sub(r"\s+", " ", text).replace("[", "(").replace("]", ")")
    return text.replace("'", "'\\''")


def _zsh_spec(opt: Option) -> list[str]:
    specs = []
    for name in opt.names:
        spec = f"{'*' if opt.repeat else ''}{name}[{_zq(opt.help)}]"
        if opt.takes_value:
            label = _zq(opt.metavar)
            if opt.choices:
                spec += f":{label}:({' '.join(opt.choices)})"
            elif opt.path:
                spec += f":{label}:_files"
            else:
                spec += f":{label}: "
        specs.append(f"'{spec}'")
    return specs


def _zsh_name(cmd: Command) -> str:
    return "_kiln_" + re.sub(r"\W", "_", cmd.name)


def _zsh_function(cmd: Command) -> str:
    fname = _zsh_name(cmd)
    specs = [s for opt in cmd.options for s in _zsh_spec(opt)]
    if cmd.children:
        items = " ".join(f"'{c.name.split()[-1]}:{_zq(c.help)}'" for c in cmd.children)
        body = [
            "  local curcontext=$curcontext state line",
            "  local -a subcommands",
            f"  subcommands=({items})",
            "  _arguments -C \\",
            *[f"    {s} \\" for s in specs],
            "    '1: :->sub' '*:: :->args'",
            "  case $state in",
            "    sub) _describe -t commands 'subcommand' subcommands ;;",
            "    args)",
            "      case $words[1] in",
            *[
                f"        {c.name.split()[-1]}) {fname}_{c.name.split()[-1]} ;;"
                for c in cmd.children
            ],
            "      esac ;;",
            "  esac",
        ]
    else:
        if cmd.words:
            specs.append(f"'*:ARG:({' '.join(cmd.words)})'")
        elif cmd.path_arg:
            specs.append("'*:PATH:_files'")
        else:
            specs.append("'*:ARG: '")
        body = ["  _arguments -s \\", *[f"    {s} \\" for s in specs[:-1]], f"    {specs[-1]}"]
    return "\n".join([f"{fname}() {{", *body, "}"])


def zsh(top: list[Option], commands: list[Command]) -> str:
    functions = [_zsh_function(c) for c in _all(commands)]
    items = " ".join(f"'{c.name}:{_zq(c.help)}'" for c in commands)
    specs = [s for opt in top for s in _zsh_spec(opt)]
    main = [
        "_kiln() {",
        "  local curcontext=$curcontext state line",
        "  local -a commands",
        f"  commands=({items})",
        "  _arguments -C \\",
        *[f"    {s} \\" for s in specs],
        "    '1: :->command' '*:: :->args'",
        "  case $state in",
        "    command) _describe -t commands 'kiln command' commands ;;",
        "    args)",
        "      case $words[1] in",
        *[f"        {c.name}) {_zsh_name(c)} ;;" for c in commands],
        "        *) _files ;;",
        "      esac ;;",
        "  esac",
        "}",
    ]
    header = [
        "#compdef kiln",
        "# zsh completion for kiln; generated by `kiln completion zsh`.",
        '# Install: kiln completion zsh > "${fpath[1]}/_kiln"',
        "",
    ]
    footer = [
        "",
        'if [[ $zsh_eval_context[-1] == loadautofunc ]]; then _kiln "$@"; '
        "else compdef _kiln kiln; fi",
    ]
    return "\n".join([*header, *functions, "", *main, *footer]) + "\n"


# -- fish ------------------------------------------------------------------------


def _fq(text: str) -> str:
    return "'" + re.sub(r"\s+", " ", text).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_option(opt: Option, condition: str) -> str:
    parts = ["complete -c kiln", f"-n {_fq(condition)}"]
    for name in opt.names:
        parts.append(f"-l {name[2:]}" if name.startswith("--") else f"-s {name[1:]}")
    if opt.takes_value:
        parts.append("-r" if opt.path else "-x")
        if opt.choices:
            parts.append(f"-a {_fq(' '.join(opt.choices))}")
        elif opt.path:
            parts.append("-F")
    parts.append(f"-d {_fq(opt.help)}")
    return " ".join(parts)


def fish(top: list[Option], commands: list[Command]) -> str:
    lines = [
        "# fish completion for kiln; generated by `kiln completion fish`.",
        "# Install: kiln completion fish > ~/.config/fish/completions/kiln.fish",
        "complete -c kiln -f",
    ]
    lines += [_fish_option(o, "__fish_use_subcommand") for o in top]
    for cmd in commands:
        lines.append(
            f"complete -c kiln -n '__fish_use_subcommand' -a {cmd.name} -d {_fq(cmd.help)}"
        )
    for cmd in commands:
        seen = f"__fish_seen_subcommand_from {cmd.name}"
        if cmd.children:
            kids = " ".join(c.name.split()[-1] for c in cmd.children)
            for child in cmd.children:
                last = child.name.split()[-1]
                first = f"{seen}; and not __fish_seen_subcommand_from {kids}"
                lines.append(f"complete -c kiln -n {_fq(first)} -a {last} -d {_fq(child.help)}")
                child_seen = f"{seen}; and __fish_seen_subcommand_from {last}"
                lines += [_fish_option(o, child_seen) for o in child.options]
        lines += [_fish_option(o, seen) for o in cmd.options]
        if cmd.words and not cmd.children:
            lines.append(f"complete -c kiln -n {_fq(seen)} -a {_fq(' '.join(cmd.words))}")
        if cmd.path_arg:
            lines.append(f"complete -c kiln -n {_fq(seen)} -F")
    return "\n".join(lines) + "\n"
