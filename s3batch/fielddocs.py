"""Attribute docstrings as the descriptions of pydantic fields, each module's source read once.

A field of a data contract is documented by the string literal that follows it::

    chunk_records: int = 10_000
    \"\"\"Records per chunk: one output part and one checkpoint per chunk.\"\"\"

and that text is the field's pydantic description, which the CLI's ``--help``, the JSON schema and the reference
pages show. pydantic's ``use_attribute_docstrings`` finds the same strings, but finds each class's source by walking
the importing frames and scanning ``sys.modules`` at each frame: about 0.16 s of CPU in every process that imports
the contracts (a sixth of what a CLI command spends starting). :class:`Documented` parses each module once and gives
the descriptions to the class before pydantic builds it (``tests/test_model_docs.py`` checks they are pydantic's).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from typing import Any

from pydantic import Field
from pydantic.fields import FieldInfo

_DOCS: dict[str, dict[str, dict[str, str]]] = {}
"""Per module: per class (qualified name), each attribute's docstring."""


def attribute_docstrings(module: str) -> dict[str, dict[str, str]]:
    """The attribute docstrings of every class of ``module`` (imported), by qualified class name."""
    docs = _DOCS.get(module)
    if docs is None:
        docs = _DOCS[module] = {}
        try:
            source = inspect.getsource(sys.modules[module])
        except (KeyError, OSError, TypeError):  # no source to read (a frozen or built module)
            return docs
        _collect(ast.parse(source).body, "", docs)
    return docs


def _collect(body: list[ast.stmt], prefix: str, docs: dict[str, dict[str, str]]) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef):
            name = prefix + node.name
            docs[name] = _class_docs(node.body)
            _collect(node.body, name + ".", docs)


def _class_docs(body: list[ast.stmt]) -> dict[str, str]:
    """``name: type`` (with or without a value) directly followed by a string literal, as pydantic reads it."""
    found: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[node.target.id] = inspect.cleandoc(after.value.value)
    return found


class Documented:
    """A pydantic model whose fields' docstrings are their descriptions (put it before ``BaseModel`` or
    ``BaseSettings`` in the bases). A description given with ``Field(description=...)`` is kept."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Called by type.__new__, before pydantic collects the fields from the class's attributes.
        super().__init_subclass__(**kwargs)
        own = inspect.get_annotations(cls)
        for name, doc in attribute_docstrings(cls.__module__).get(cls.__qualname__, {}).items():
            if name not in own:
                continue
            value = cls.__dict__.get(name, ...)
            if isinstance(value, FieldInfo):
                if value.description is None:  # a copy: pydantic reads the attributes a FieldInfo was given
                    setattr(cls, name, FieldInfo.merge_field_infos(value, description=doc))
            elif value is ...:
                setattr(cls, name, Field(description=doc))
            else:
                setattr(cls, name, Field(value, description=doc))
