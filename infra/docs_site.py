"""The MkDocs hooks that let one set of Markdown pages read well on GitHub and build
strictly as a site (``mkdocs.yml``; ``mkdocs build --strict`` runs in ``make test``).

Two differences between the two readers, each settled here rather than in the pages:

- **Links into the repository.** A guide links the code it describes
  (``[shim.sh](../../activities/nodes/shim.sh)``). GitHub follows that link; MkDocs
  only knows the files under ``docs/`` and would warn. :func:`on_page_markdown`
  checks that each such target exists (a missing one is a warning, so the strict
  build fails) and renders it as the file's repository path in code.
- **Heading anchors.** Pages link headings by GitHub's anchors; :func:`github_slug`
  gives MkDocs the same ones (``toc.slugify`` in ``mkdocs.yml``), so an anchor that
  works on GitHub is the one the strict build checks.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.lazarus")

LINK = re.compile(
    r"(?P<bang>!?)\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<target>[^)\s#]*)(?P<anchor>#[^)\s]*)?\)"
)


def github_slug(value: str, separator: str = "-") -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to
    ``separator``. (tests/unit/test_docs.py checks links with the same rule.)"""
    text = re.sub(r"<[^>]+>", "", value)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", separator)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Links that leave ``docs/``: checked against the repository, shown as paths."""
    docs_dir = Path(config["docs_dir"]).resolve()
    repository = docs_dir.parent
    page_dir = posixpath.dirname(page.file.src_uri)

    def outside(match: re.Match[str]) -> str:
        target = match.group("target")
        if not target or "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        resolved = (docs_dir / page_dir / target).resolve()
        if resolved.is_relative_to(docs_dir):
            return match.group(0)
        if not resolved.exists():
            log.warning("%s links %s, which is not in the repository", page.file.src_uri, target)
            return match.group(0)
        path = resolved.relative_to(repository).as_posix()
        text = match.group("text")
        return f"{text} (`{path}`)" if text.strip("`") != path else f"`{path}`"

    return LINK.sub(outside, markdown)
