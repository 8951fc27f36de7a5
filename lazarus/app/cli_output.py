"""How the CLI prints text it did not write: as it is, never as rich markup.

Most of what the CLI shows comes from outside: log lines, paths, node names, the
reasons a workflow recorded, a spec's commands and environment. Rich reads ``[...]``
in a printed string as a style tag, so such text was mangled or crashed the command:
a log line holding Llama's ``[/INST]`` raised ``MarkupError`` and ``[rank3]:`` vanished.
Every console the CLI prints with comes from here and reads no markup at all; styling
is given as a style argument or with :class:`~rich.text.Text`, never inside a string;
and untrusted values put into a table or panel go in through :func:`plain`, so they
stay literal whichever console draws them (tests draw with their own).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def console(*, stderr: bool = False) -> Console:
    """A console that prints strings as they are: no markup, no highlighting."""
    return Console(stderr=stderr, highlight=False, markup=False)


def say(text: str, *, stderr: bool = False, style: str = "") -> None:
    """Print ``text`` as it is, one line per line it holds: not wrapped into the
    terminal's width, so a long log line or path stays one line for ``grep``."""
    Console(stderr=stderr, highlight=False, markup=False, soft_wrap=True).print(
        plain(text, style=style)
    )


def plain(text: object, *, style: str = "") -> Text:
    """``text`` (anything: ``str()`` of it) as a renderable whose brackets stay brackets,
    for a table cell, a panel title or :func:`say`."""
    return Text(str(text), style=style)
