"""The reference pages of the documentation site, generated from the code (``make docs``): the job input from
the pydantic models, the command lines from their argparse parsers, the environment from ``Settings``, the
errors from :mod:`s3batch.errors`, the report from :mod:`s3batch.messages`. A page holds a marker such as
``<!-- generated: job-input -->``; the site's build hook (``scripts/mkdocs_hooks.py``) puts the Markdown of
:data:`GENERATORS` in its place, so a page can never drift from the code it describes.

Dev tooling: nothing of s3batch's runtime imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import io
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args, get_origin

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"<!-- generated: ([a-z0-9-]+) -->")
"""A page's placeholder for generated Markdown: ``<!-- generated: NAME -->`` on a line of its own."""

_UNIONS = (typing.Union, types.UnionType)
_SIZES = ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB"))


def table_text(doc: str | None) -> str:
    """A docstring as one Markdown table cell: reST literals as code, roles dropped, one line, no pipes."""
    text = " ".join((doc or "").split())
    text = re.sub(r":(?:class|mod|func|meth|data|attr|exc):`~?([^`]+)`", r"``\1``", text)
    text = text.replace("``", "`")
    # A pipe inside a code span would end the table cell, and an escaped one shows its backslash: HTML code.
    text = re.sub(r"`([^`]*\|[^`]*)`", lambda m: "<code>" + html.escape(m[1]).replace("|", "&#124;") + "</code>", text)
    return text.replace("|", "\\|")


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it in JSON terms: ``int | None``, ``list[str]``, ``"a" | "b"``."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return type_name(get_args(annotation)[0])
    if origin is Literal:
        return " \\| ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in get_args(annotation))
    if origin in _UNIONS:
        return " \\| ".join(type_name(a) for a in get_args(annotation))
    if origin in (list, tuple, set, frozenset):
        return f"list[{', '.join(type_name(a) for a in get_args(annotation) if a is not Ellipsis)}]"
    if origin is dict:
        key, value = get_args(annotation)
        return f"object of {type_name(key)}: {type_name(value)}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def _size(value: int) -> str:
    for unit, name in _SIZES:
        if value >= unit and value % unit == 0:
            return f"{value // unit} {name}"
    return f"{value:,}"


def default_of(info: FieldInfo) -> str:
    """A field's default as the table shows it: ``required``, ``none``, a size in KiB/MiB/GiB, or JSON-ish."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True) if info.default is PydanticUndefined else info.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return _size(value)
    if isinstance(value, int) and value >= 10_000:
        return f"`{value:,}`"
    if isinstance(value, str | int | float):
        return f"`{value!r}`".replace("'", '"') if isinstance(value, str) else f"`{value}`"
    secret = getattr(value, "get_secret_value", None)
    if secret is not None:
        return '`""`' if not secret() else "(secret)"
    return f"`{value!r}`"


def bounds(info: FieldInfo) -> str:
    """A field's constraints (``ge``, ``le``, lengths, a pattern) in words, or ""."""
    words = []
    for item in info.metadata:
        for attr, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None:
                words.append(f"{word} {_size(value) if isinstance(value, int) and value >= 65536 else value}")
        for attr, word in (("min_length", "at least {} long"), ("max_length", "at most {} long")):
            value = getattr(item, attr, None)
            if value is not None:
                words.append(word.format(value))
        pattern = getattr(item, "pattern", None)
        if pattern:
            words.append(f"matches `{pattern}`")
    return "; ".join(words)


def model_table(model: type[BaseModel], *, skip: frozenset[str] = frozenset()) -> str:
    """A Markdown table of a model's fields: name, type, default, bounds and docstring."""
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        limits = bounds(info)
        meaning = table_text(info.description) + (f" ({limits})" if limits else "")
        rows.append(f"| `{name}` | {type_name(info.annotation)} | {default_of(info)} | {meaning} |")
    return "\n".join(rows)


def job_input() -> str:
    """The job input: every field of ``S3BatchInput``, then the objects its fields take."""
    from s3batch.after_success import Archive, Delete, Tag
    from s3batch.incremental import Incremental
    from s3batch.models import S3BatchInput
    from s3batch.sinks.spec import PostgresSink, S3Sink

    parts = [model_table(S3BatchInput)]
    for title, models in (
        ("`sink`", (S3Sink, PostgresSink)),
        ("`incremental`", (Incremental,)),
        ("`after_success`", (Archive, Delete, Tag)),
    ):
        for model in models:
            parts.append(f"#### {title}: `{model.__name__}`\n\n{table_text(model.__doc__)}\n\n{model_table(model)}")
    return "\n\n".join(parts)


def report_models() -> str:
    """The workflow result and the report's parts, from :mod:`s3batch.messages`."""
    from s3batch.after_success import Outcome
    from s3batch.messages import FileResult, Progress, ReasonCount, S3BatchResult, Totals

    parts = []
    for model in (S3BatchResult, Totals, FileResult, ReasonCount, Outcome, Progress):
        parts.append(f"#### `{model.__name__}`\n\n{table_text(model.__doc__)}\n\n{model_table(model)}")
    return "\n\n".join(parts)


def checkpoint_model() -> str:
    """The checkpoint's fields (heartbeat details and part metadata)."""
    from s3batch.checkpoint import Checkpoint

    return f"{table_text(Checkpoint.__doc__)}\n\n{model_table(Checkpoint)}"


# ---------------------------------------------------------------------------------------------- environment


def env_names(name: str, info: FieldInfo) -> list[str]:
    """The variables a ``Settings`` field is read from (its aliases, else ``S3BATCH_`` + its name)."""
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    if isinstance(alias, str):
        return [alias]
    return [f"S3BATCH_{name.upper()}"]


def environment() -> str:
    """Every ``S3BATCH_*`` variable ``Settings`` reads, with its default and docstring."""
    from s3batch.config import Settings

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        if name in ("postgres_dsns", "postgres_connections"):
            continue  # per connection: the table below
        limits = bounds(info)
        names = " or ".join(f"`{n}`" for n in env_names(name, info))
        meaning = table_text(info.description) + (f" ({limits})" if limits else "")
        rows.append(f"| {names} | {default_of(info)} | {meaning} |")
    return "\n".join(rows)


def postgres_environment() -> str:
    """The variables of one PostgreSQL connection (``warehouse`` as the example)."""
    from s3batch.config import PostgresConnection

    rows = [
        "| variable (connection `warehouse`) | default | meaning |",
        "|---|---|---|",
        "| `S3BATCH_POSTGRES_WAREHOUSE_DSN` | none | the connection's DSN (`postgresql://user@host/db`); never in a "
        "job's input, history or heartbeats |",
        "| `S3BATCH_POSTGRES_WAREHOUSE_DSN_FILE` | none | a file holding the DSN (a mounted secret), read when "
        "`..._DSN` is unset |",
    ]
    for name, info in PostgresConnection.model_fields.items():
        default = "any" if name == "tables" else default_of(info)
        rows.append(f"| `S3BATCH_POSTGRES_WAREHOUSE_{name.upper()}` | {default} | {table_text(info.description)} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------- errors


def error_types() -> list[type[Any]]:
    """The error classes of :mod:`s3batch.errors` with a type name of their own, in the module's order."""
    from s3batch import errors

    found = []
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.S3BatchError) and value is not errors.S3BatchError:
            own = value.__dict__.get("type_name")
            if own is not None:
                found.append(value)
    return found


def errors_table() -> str:
    """The error types users and retry policies match on: retried or not, and what each means."""
    rows = ["| type | retried | meaning |", "|---|---|---|"]
    for cls in error_types():
        retried = "yes (benign hand-over)" if cls.benign else ("yes" if cls.retryable else "no")
        rows.append(f"| [`{cls.type_name}`](#{cls.type_name.lower()}) | {retried} | {table_text(cls.__doc__)} |")
    return "\n".join(rows)


def client_errors_table() -> str:
    """The errors of the client API (:mod:`s3batch.client.errors`), which ``s3batch`` turns into exit codes."""
    from s3batch.client import errors

    rows = ["| error | is a | meaning |", "|---|---|---|"]
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.ClientError) and value.__module__ == errors.__name__:
            base = value.__mro__[1].__name__
            rows.append(f"| `{value.__name__}` | `{base}` | {table_text(value.__doc__)} |")
    return "\n".join(rows)


def exit_codes() -> str:
    """The paragraph of the ``s3batch`` module docstring that gives its exit codes."""
    from s3batch import cli

    for paragraph in (cli.__doc__ or "").split("\n\n"):
        if paragraph.lstrip().startswith("Exit codes"):
            return table_text(paragraph)
    raise LookupError("s3batch.cli's docstring has no paragraph on its exit codes")


def metrics() -> str:
    """s3batch's own metrics: the ``create_counter`` / ``create_histogram*`` calls of the file activity's setup."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("s3batch.activities.file_setup")
    if spec is None or spec.origin is None:
        raise LookupError("s3batch.activities.file_setup not found")
    with open(spec.origin) as source:
        tree = ast.parse(source.read())
    rows = ["| metric | kind | unit | meaning |", "|---|---|---|---|"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            kind = node.func.attr.removeprefix("create_")
            if kind != node.func.attr and kind.startswith(("counter", "histogram", "gauge")):
                name, text, *unit = (str(a.value) for a in node.args if isinstance(a, ast.Constant))
                rows.append(f"| `{name}` | {kind.split('_')[0]} | {unit[0] if unit else ''} | {text} |")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------- command lines


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def _help_of(main: Callable[[list[str]], Any], argv: list[str]) -> str:
    """What ``main(argv + ["--help"])`` prints (argparse exits after printing it)."""
    buffer = io.StringIO()
    with _columns(100), contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    return buffer.getvalue().rstrip()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parser_help(parser: argparse.ArgumentParser) -> str:
    with _columns(100):
        return parser.format_help().rstrip()


def _command_sections(parser: argparse.ArgumentParser, path: list[str], level: int) -> list[str]:
    sections = [f"{'#' * level} `{' '.join(path)}`\n\n```text\n{_parser_help(parser)}\n```"]
    for name, sub in _subcommands(parser).items():
        sections += _command_sections(sub, [*path, name], min(level + 1, 4))
    return sections


def cli() -> str:
    """``s3batch`` and every subcommand's ``--help``, from its parser."""
    import importlib

    try:  # where the command line's parser lives (s3batch.cli imports its commands lazily)
        build_parser = importlib.import_module("s3batch.cli.parser").build_parser
    except ModuleNotFoundError:
        build_parser = importlib.import_module("s3batch.cli").build_parser
    return "\n\n".join(_command_sections(build_parser(), ["s3batch"], 3))


def other_programs() -> str:
    """The other programs' ``--help``: the worker, the local stack, the codec, health and search attributes."""
    from s3batch import codec, health, search_attributes, worker
    from s3batch.dev import stack_cli

    programs: list[tuple[str, Callable[[list[str]], Any], list[str]]] = [
        ("s3batch-worker", worker.main, []),
        ("s3batch-stack", stack_cli.main, []),
        ("python -m s3batch.codec", codec.main, []),
        ("python -m s3batch.codec serve", codec.main, ["serve"]),
        ("python -m s3batch.health", health.main, []),
        ("python -m s3batch.search_attributes", search_attributes.main, []),
    ]
    return "\n\n".join(f"### `{name}`\n\n```text\n{_help_of(main, argv)}\n```" for name, main, argv in programs)


def _args_of(doc: str) -> dict[str, str]:
    """The ``Args:`` section of a Google-style docstring: each argument's text, by name."""
    found: dict[str, str] = {}
    lines = doc.split("Args:", 1)[1].splitlines() if "Args:" in doc else []
    for line in lines[1:]:
        if not line.strip():
            break
        name, _, text = line.strip().partition(":")
        found[name] = text.strip()
    return found


def workflow_interface() -> str:
    """What a client can do with ``S3BatchWorkflow``, read from its Temporal definition: its run, queries, updates
    and signals, what each takes (annotations, or the docstring's ``Args`` where the annotation is ``Any``), returns
    and does (the docstring's first paragraph), and the bounds its update validators check."""
    import inspect

    from temporalio import workflow

    from s3batch.workflows.batch import MAX_CONCURRENCY, S3BatchWorkflow

    defn = workflow._Definition.must_from_class(S3BatchWorkflow)
    rows = ["| kind | name | takes | returns | what it does |", "|---|---|---|---|---|"]
    entries: list[tuple[str, str, Callable[..., Any]]] = []
    if defn.run_fn is not None:
        entries.append(("run", "run", defn.run_fn))
    entries += [("query", name, q.fn) for name, q in sorted(defn.queries.items()) if name]
    entries += [("update", name, u.fn) for name, u in sorted(defn.updates.items()) if name]
    entries += [("signal", name, sig.fn) for name, sig in sorted(defn.signals.items()) if name]
    for kind, name, fn in entries:
        doc = inspect.getdoc(fn) or ""
        described = _args_of(doc)
        hints = typing.get_type_hints(fn)
        takes = []
        for param in list(inspect.signature(fn).parameters.values())[1:]:
            hint = hints.get(param.name, Any)
            text = described.get(param.name, "") if hint is Any else type_name(hint)
            takes.append(f"`{param.name}`: {table_text(text).rstrip('.')}" if text else f"`{param.name}`")
        if name == "set_concurrency":
            takes[-1] += f", 1-{MAX_CONCURRENCY:,} (checked before the update reaches the job's history)"
        returned = hints.get("return")
        rows.append(
            f"| {kind} | `{name}` | {'; '.join(takes)} | {type_name(returned) if returned else ''} "
            f"| {table_text(doc.split(chr(10) + chr(10), 1)[0])} |"
        )
    return "\n".join(rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "job-input": job_input,
    "report-models": report_models,
    "checkpoint": checkpoint_model,
    "environment": environment,
    "postgres-environment": postgres_environment,
    "errors": errors_table,
    "client-errors": client_errors_table,
    "exit-codes": exit_codes,
    "metrics": metrics,
    "cli": cli,
    "other-programs": other_programs,
    "workflow": workflow_interface,
}
"""The generated sections, by the name their marker gives."""


def expand(markdown: str) -> str:
    """``markdown`` with every marker replaced by its generated Markdown.

    Raises:
        KeyError: A marker names no generator.
    """
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
