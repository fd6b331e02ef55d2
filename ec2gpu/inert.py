"""Text from outside this machine's control, made safe to print on a terminal (pure).

A job's log lines, its summary.json, a task file's values, what an instance or AWS answers: any of
it may carry terminal control sequences (``ESC[2J`` clears the screen, ``ESC]0;...BEL`` sets the
window title, ``ESC]52;c;...BEL`` writes the clipboard, ``ESC]8;;URL`` makes a hyperlink) or
characters that reorder or hide what is shown (bidi overrides, zero-width spaces). ``inert`` makes
every such character visible as its escape, so what the user reads is what was sent and the
terminal interprets none of it. The CLI prints the result as plain text, never as rich markup,
through its one helper ``cli/render.say`` (and ``render.plain`` for a table's cells): ``[link=...]`` in a
value stays those characters.
"""
from __future__ import annotations

import re

#: C0 controls but tab and newline, DEL, C1 controls; bidi, zero-width and other invisible
#: formatting characters (ALM, ZWSP..RLM, line/paragraph separators, LRE..RLO, word joiner and
#: invisible operators, LRI..PDI, BOM); lone surrogates (they cannot be written out as UTF-8)
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064"
                    "\u2066-\u2069\ufeff\ud800-\udfff]")
_LINE_END_CR = re.compile("\r+(?=\n|$)")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def inert(text: str) -> str:
    """``text`` with every character a terminal could act on, or that hides or reorders what is
    shown, written as its escape: ``\\xHH`` below U+0100 (ESC is ``\\x1b``, BEL ``\\x07``, CR
    ``\\x0d``, CSI ``\\x9b``), ``\\uHHHH`` above (U+202E ``\\u202e``). Kept as they are: tab (a
    terminal only moves to the next tab stop; rich expands it to spaces) and newline (a multi-line
    value, an error's tail, stays multi-line; a log line never holds one). Carriage returns that end
    a line (CRLF, a trailing CR) are dropped; any other CR is shown. Everything else, markup-like
    ``[...]`` included, is left alone: the caller prints the result as plain text."""
    if not UNSAFE.search(text):
        return text
    return UNSAFE.sub(_visible, _LINE_END_CR.sub("", text))
