"""The tutorials of the documentation site as steps a test runs (``tests/test_docs_tutorials.py``): the page
and the test are one text.

What a page's blocks become, in the page's order:

- a ```` ```console ```` block: each line starting with ``$ `` is a shell command (a line ending with ``\\``
  goes on on the next), run in one shell session per page (``cd``, ``export`` and ``eval`` carry over);
  the other lines are the output shown, and each must be in what the command printed;
- a ```` ```python ```` block: run with the page's ``python`` from its current folder (``python - < block``);
- a ```` ```python title="path/to/file.py" ```` block: written to that file (folders made), not run;
- a ```` ```text ```` block: output shown, each line of which must be in what the last step printed;
- any other block (``json``, ``sql``, ``yaml``...): shown, never run.

An HTML comment on the line before a block changes that (it is invisible on the page):

- ``<!-- test: skip (why) -->``: not run, and its output not compared (a server the test session already
  runs, Docker, a cluster); keep these few;
- ``<!-- test: background -->``: each command is started in the background, in a session of its own, and
  stopped with SIGTERM when the page ends (a worker a reader runs in a second terminal);
- ``<!-- test: not compared -->``: a ``text`` block shown but not compared (output that changes from run to
  run);
- ``<!-- test: exits N -->``: each command of the block must exit with N, not 0 (a failure the page shows).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_MARKER = re.compile(r"^<!--\s*test:\s*(skip|background|not compared|exits \d+)\b.*-->\s*$")
_FENCE = re.compile(r"^```([\w-]*)\s*(.*)$")
_TITLE = re.compile(r'title="([^"]+)"')


@dataclass
class Step:
    """One thing the test does for a page: ``run`` a command, ``python`` code, write a ``file``, or start a
    ``background`` command; ``expected``: lines its output must hold."""

    kind: str
    text: str
    path: str = ""
    expected: list[str] = field(default_factory=list)
    line: int = 0
    exits: int = 0


@dataclass
class Page:
    steps: list[Step]
    skipped: int


def _commands(block: list[str]) -> list[tuple[str, list[str]]]:
    """The ``$ `` commands of a console block, each with the output lines shown under it."""
    found: list[tuple[str, list[str]]] = []
    lines = iter(block)
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1].rstrip() + " " + next(lines).strip()
            found.append((command, []))
        elif found and line.strip():
            found[-1][1].append(line)
    return found


def parse(markdown: str) -> Page:
    """The steps of a tutorial page."""
    steps: list[Step] = []
    skipped = 0
    lines = markdown.splitlines()
    marker = ""
    n = 0
    while n < len(lines):
        line = lines[n]
        found = _MARKER.match(line.strip())
        if found:
            marker = found[1]
            n += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            if line.strip():
                marker = ""
            n += 1
            continue
        start, lang, info = n + 1, fence[1], fence[2]
        end = start
        while not lines[end].startswith("```"):
            end += 1
        block = lines[start:end]
        n = end + 1
        if marker == "skip":
            skipped += 1
        elif lang == "console":
            exits = int(marker.split()[1]) if marker.startswith("exits") else 0
            for command, shown in _commands(block):
                kind = "background" if marker == "background" else "run"
                steps.append(Step(kind, command, expected=shown, line=start, exits=exits))
        elif lang == "python":
            title = _TITLE.search(info)
            code = "\n".join(block) + "\n"
            steps.append(Step("file", code, path=title[1], line=start) if title else Step("python", code, line=start))
        elif lang == "text" and marker != "not compared":
            runs = [s for s in steps if s.kind in ("run", "python")]
            assert runs, f"line {start}: a text block with no step before it to compare with"
            runs[-1].expected += [x for x in block if x.strip()]
        marker = ""
    return Page(steps, skipped)


def script(page: Page, out: Path) -> str:
    """A bash script of the page's steps: each step's output in ``out/N.txt``, its exit code in ``out/N.rc``;
    the first step that exits otherwise than the page says ends it; background steps record their pid (a
    session leader) in ``out/pids``."""
    lines = ["set -u"]
    for n, step in enumerate(page.steps):
        log, rc = shlex.quote(str(out / f"{n}.txt")), shlex.quote(str(out / f"{n}.rc"))
        if step.kind == "file":
            lines.append(f"mkdir -p \"$(dirname {shlex.quote(step.path)})\"")
            lines.append(f"cat > {shlex.quote(step.path)} <<'S3BATCH_TUTORIAL_EOF'\n{step.text}S3BATCH_TUTORIAL_EOF")
            lines.append(f"echo 0 > {rc}")
            continue
        if step.kind == "python":
            code = out / f"{n}.py"
            code.write_text(step.text)
            command = f"python - < {shlex.quote(str(code))}"
        else:
            command = step.text
        if step.kind == "background":
            body = out / f"{n}.sh"
            body.write_text(command + "\n")
            lines.append(f"setsid bash {shlex.quote(str(body))} > {log} 2>&1 < /dev/null &")
            lines.append(f"echo $! >> {shlex.quote(str(out / 'pids'))}; echo 0 > {rc}")
            continue
        lines.append(f"{{ {command}\n}} > {log} 2>&1 < /dev/null; status=$?; echo $status > {rc}")
        lines.append(f'[ "$status" -eq {step.exits} ] || exit 1')
    return "\n".join(lines) + "\n"


def normalized(text: str) -> str:
    return " ".join(text.split())


def missing_lines(expected: list[str], output: str) -> list[str]:
    """The lines of ``expected`` that are not in ``output`` (white space runs compared as one space)."""
    seen = normalized(output)
    return [line for line in expected if normalized(line) not in seen]
