"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml; ``make docs``).

- A page's ``<!-- generated: NAME -->`` markers become the Markdown that ``s3batch.dev.docs`` generates from
  the code (the job input, the command lines, the environment, the errors, the report).
- Docstrings written for Sphinx-style readers (``:class:`~s3batch.x.Y``` roles) show as plain code in the
  Python API pages that mkdocstrings renders.
"""

from __future__ import annotations

import re
from typing import Any

from s3batch.dev.docs import expand

_ROLE = re.compile(r":(?:class|mod|func|meth|data|attr|exc|obj):<code>~?([^<]+)</code>")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return _ROLE.sub(r"<code>\1</code>", html)
