"""Validation errors described for users: :func:`describe_validation_error` names each invalid field
and why, in one line, without ever quoting record contents (the line may reach workflow history, the
report or logs). Pure Python (pydantic only): the workflow sandbox imports it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core.core_schema import ErrorType

INPUT_ERROR = "s3batch_input"
"""Error type of the job input's own validators (:class:`S3BatchInput`): their messages name the
fields they check and are kept by :func:`describe_validation_error`."""

# Built-in pydantic error types whose messages may carry something of the input (an attribute or tag
# read from it, a character of a UUID, an exception's text) or are written by a custom validator.
_QUOTING_TYPES = frozenset(
    {
        "value_error",
        "assertion_error",
        "no_such_attribute",
        "get_attribute_error",
        "iteration_error",
        "union_tag_invalid",
        "uuid_parsing",
        "bytes_invalid_encoding",
        "url_parsing",
        "url_syntax_violation",
        "datetime_object_invalid",
        "invalid_key",
    }
)
_SAFE_TYPES = frozenset(get_args(ErrorType)) - _QUOTING_TYPES
"""Error types whose message is made from the schema alone (its constraints, expected values)."""
_HIDDEN = "*"


def describe_validation_error(err: ValidationError, *, what: str = "record") -> str:
    """One line naming each invalid field and why, e.g. ``chunk_records: Input should be ...``: the
    :func:`validation_problems` joined with ``; ``."""
    return "; ".join(validation_problems(err, what=what))


def validation_problems(err: ValidationError, *, what: str = "record") -> list[str]:
    """Each invalid field and why, e.g. ``chunk_records: Input should be ...``, one per problem.

    ``what`` names the root (``input``, ``state``: the job's own inputs, described as pydantic
    describes them). For ``record`` (the default: data read from a file, or a handler's model of it)
    the description never carries record contents, since it may reach workflow history, the report
    or logs: a location names only the fields the model declares (``*`` stands for a dict key, an
    undeclared field or anything the model does not name), and a message is pydantic's own only when
    made from the schema alone; a custom validator's message (it may quote the value) is replaced by
    its error type.
    """
    records = what == "record"
    model = _model_named(err.title) if records else None
    parts = []
    for item in err.errors(include_url=False, include_input=False, include_context=False):
        if not records:
            loc = ".".join(str(p) for p in item["loc"]) or what
            parts.append(f"{loc}: {item['msg']}")
            continue
        loc = _declared_loc(model, item["loc"]) or what
        kind = item["type"]
        msg = item["msg"] if kind in _SAFE_TYPES or kind == INPUT_ERROR else f"invalid value ({kind}; message withheld)"
        parts.append(f"{loc}: {msg}")
    return parts


def _model_named(title: str) -> type[BaseModel] | None:
    """The one pydantic model class called ``title`` (a ValidationError names its model), or None."""
    found: set[type[BaseModel]] = set()
    todo = list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        if cls.__name__ == title:
            found.add(cls)
        todo.extend(cls.__subclasses__())
    return next(iter(found)) if len(found) == 1 else None


def _declared_loc(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    """``loc`` with every name that is not a declared field of ``model`` (or its nested models)
    replaced by ``*``; list positions are kept."""
    current: Any = model
    out: list[str] = []
    for part in loc:
        current = _unwrap(current)
        if isinstance(part, int):
            out.append(str(part))
            current = _item_type(current)
        elif isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            out.append(part)
            current = current.model_fields[part].annotation
        else:
            out.append(_HIDDEN)
            origin = get_origin(current)
            current = get_args(current)[1] if origin in (dict, Mapping) and len(get_args(current)) == 2 else None
    return ".".join(out)


def _unwrap(tp: Any) -> Any:
    """``X`` of ``X | None``, ``Optional[X]`` and ``Annotated[X, ...]``; anything else unchanged."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, UnionType):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return None  # a real union: pydantic names its members in the location
            tp = members[0]
        else:
            return tp


def _item_type(tp: Any) -> Any:
    args = get_args(tp)
    if get_origin(tp) in (list, tuple, set, frozenset, Sequence) and args:
        return args[0]
    return None
