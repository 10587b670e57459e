"""A small Dockerfile reader: stages and instructions, for static checks (no engine runs here).

It understands what Kelvin's Dockerfile uses: comments, line continuations,
heredocs (`COPY <<'EOF' path`), global and stage ARGs with defaults, `${VAR}`
substitution, exec-form (JSON) arguments.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

_HEREDOC = re.compile(r"<<-?(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int
    heredoc: str = ""

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form CMD/ENTRYPOINT/RUN, or None for the shell form."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        value = json.loads(text)
        return [str(v) for v in value]

    def flags(self) -> dict[str, str]:
        """`--from=build`, `--chmod=0755`, ... of COPY/ADD/RUN."""
        return dict(re.findall(r"--([a-z-]+)=(\S+)", self.args))


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for inst in self.all("ENV"):
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|\S+)", inst.args):
                out[key] = value.strip('"')
        return out


def instructions(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [line.rstrip()]
        while parts[-1].endswith("\\") and i < len(lines):
            parts[-1] = parts[-1][:-1]
            while i < len(lines) and lines[i].lstrip().startswith("#"):
                i += 1  # comment lines inside a continuation are dropped
            if i < len(lines):
                parts.append(lines[i].rstrip())
                i += 1
        logical = " ".join(p.strip() for p in parts)
        keyword, _, args = logical.partition(" ")
        heredoc = ""
        m = _HEREDOC.search(args)
        if m:
            body = []
            while i < len(lines) and lines[i].strip() != m.group(2):
                body.append(lines[i])
                i += 1
            i += 1
            heredoc = "\n".join(body) + "\n"
        out.append(Instruction(keyword.upper(), args.strip(), start + 1, heredoc))
    return out


def substitute(text: str, variables: dict[str, str]) -> str:
    return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), text)


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages in order); FROM images have ARGs substituted."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for inst in instructions(path.read_text()):
        if inst.keyword == "ARG" and not stages:
            name, _, default = inst.args.partition("=")
            global_args[name] = default
        elif inst.keyword == "FROM":
            words = substitute(inst.args, global_args).split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(words[0], name))
        elif stages:
            stages[-1].instructions.append(inst)
    return global_args, stages


def resolve(stages: list[Stage], name: str) -> list[Stage]:
    """`name` and the stages it builds FROM, nearest first (what `--target name` includes)."""
    by_name = {s.name: s for s in stages}
    chain = [by_name[name]]
    while chain[-1].base in by_name:
        chain.append(by_name[chain[-1].base])
    return chain


def effective(stages: list[Stage], name: str, keyword: str) -> Instruction | None:
    """The last `keyword` (USER, ENTRYPOINT, CMD, WORKDIR) in effect for image `name`."""
    for stage in resolve(stages, name):
        found = stage.all(keyword)
        if found:
            return found[-1]
    return None
