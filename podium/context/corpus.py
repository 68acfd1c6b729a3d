"""The corpus: documents on disk turned into searchable, located chunks.

A *document* is one file under a docs root whose name says what it holds: reST or plain
text (``.rst``, ``.txt``, Sphinx's ``.rst.txt`` sources), Markdown (``.md``), HTML
(``.html``) or a man page (troff, ``.1`` … ``.9`` with an optional section suffix such as
``.3p``), each optionally gzip-compressed (``.gz``). Other files are not documents and are
passed over; symbolic links are not followed (the man pages' aliases would index the same
page dozens of times).

:func:`read_document` is the one place a file becomes text: gzip decompressed, UTF-8 decoded
with replacement characters. Every offset in Podium — a chunk's ``start``/``end``, a question
file's gold spans — counts characters of that text, so a span can be checked against a chunk
without any markup knowledge.

Chunking is deliberately simple. A format's reader turns the text into *units* (one per
source line or HTML text run, each with its character span and its markup-stripped text),
*headings* and *breaks* (blank lines, paragraph macros, block tags). Paragraphs (units
between breaks) are packed into chunks of at most ``max_tokens`` tokens; a heading always
starts a new chunk; a paragraph longer than the limit is split between its units; when a
chunk is full, the next one in the same section repeats its last paragraph if that is at
most ``overlap_tokens`` long, so an answer that straddles a cut is still whole in one chunk.
A chunk's searchable text starts with the document's title and its section's heading
(``"os — Miscellaneous operating system interfaces › Process Management"``) because a
paragraph alone often never names what it is about.
"""

from __future__ import annotations

import gzip
import html
import os
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Literal

from podium.config import env, from_env
from podium.errors import CorpusError
from podium.tokens import count_tokens


@dataclass(frozen=True)
class Chunk:
    """One searchable piece of one document."""

    id: str
    """Stable id, ``<source>#<n>`` (n counts the document's chunks from 0)."""
    source: str
    """The document's path relative to its docs root (posix separators)."""
    start: int
    """Character offset of the chunk's first character in :func:`read_document`'s text."""
    end: int
    """Character offset one past the chunk's last character (same coordinates)."""
    text: str
    """The searchable text: markup stripped, headed by the document and section titles."""


@dataclass(frozen=True)
class ChunkingConfig:
    """How documents are cut into chunks (recorded in each index's manifest)."""

    max_tokens: int = env("PODIUM_CONTEXT_CHUNK_TOKENS", default=200)
    """Most tokens (:func:`count_tokens`) of body text in one chunk; all-MiniLM-L6-v2 reads
    256 word pieces, so longer chunks would be embedded truncated."""
    overlap_tokens: int = env("PODIUM_CONTEXT_CHUNK_OVERLAP", default=40)
    """A full chunk's last paragraph is repeated at the start of the next one when it has at
    most this many tokens (0: no overlap)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise CorpusError(f"PODIUM_CONTEXT_CHUNK_TOKENS must be >= 1, got {self.max_tokens}")
        if not 0 <= self.overlap_tokens < self.max_tokens:
            raise CorpusError(
                "PODIUM_CONTEXT_CHUNK_OVERLAP must be >= 0 and below "
                f"PODIUM_CONTEXT_CHUNK_TOKENS ({self.max_tokens}), got {self.overlap_tokens}"
            )


Format = Literal["rst", "markdown", "html", "man"]

_MAN_SUFFIX = re.compile(r"\.(?:[1-9][a-z0-9]*|man|n|l)$")


def document_format(name: str) -> Format | None:
    """The format a file name declares, or None when it is not a document."""
    lower = name.lower()
    if lower.endswith(".gz"):
        lower = lower[:-3]
    if lower.endswith((".html", ".htm", ".xhtml")):
        return "html"
    if lower.endswith((".md", ".markdown")):
        return "markdown"
    if lower.endswith((".rst", ".txt", ".rest")):
        return "rst"
    if _MAN_SUFFIX.search(lower):
        return "man"
    return None


def read_document(path: Path) -> str:
    """The decoded text of one document: gz decompressed, UTF-8 with replacement.

    Raises :class:`CorpusError` naming the file when it cannot be read, is a corrupt gzip
    stream, or holds NUL bytes (a binary file is not a document, whatever its name says).
    """
    try:
        data = path.read_bytes()
        if path.name.lower().endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorpusError(f"cannot read document {path}: {exc}", path=str(path)) from exc
    if b"\x00" in data:
        raise CorpusError(
            f"cannot read document {path}: it holds NUL bytes (not a text file)", path=str(path)
        )
    return data.decode("utf-8", errors="replace")


def iter_documents(roots: Sequence[Path]) -> Iterator[tuple[str, Path]]:
    """Every document under ``roots`` as (source relative to its root, path).

    Walks each root in sorted order (deterministic chunk ids), skipping hidden directories,
    symbolic links and files that are not documents. A missing root, or two roots holding
    the same relative path (their chunks would share ids), raises :class:`CorpusError`.
    """
    seen: dict[str, Path] = {}
    for root in roots:
        if not root.is_dir():
            raise CorpusError(f"docs root {root} is not a directory", path=str(root))
        for source, path in _walk(root):
            if source in seen:
                raise CorpusError(
                    f"documents {seen[source]} and {path} share the source name {source!r}; "
                    "give roots whose relative paths differ",
                    path=str(path),
                )
            seen[source] = path
            yield source, path


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or document_format(name) is None:
                continue
            yield path.relative_to(root).as_posix(), path


# --- units: what every format reader produces ------------------------------------------


@dataclass(frozen=True)
class _Unit:
    """A located piece of a document: text, a heading, or a paragraph break."""

    kind: Literal["text", "heading", "break"]
    start: int = 0
    end: int = 0
    text: str = ""


_BREAK = _Unit("break")


def _lines(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, line) for each line, end excluding the newline."""
    pos = 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        yield pos, pos + len(body), body
        pos += len(line)


def _clean(text: str) -> str:
    return " ".join(text.split())


# --- reST / plain text -------------------------------------------------------------------

_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+<>_:.])\1{2,}\s*$")
_DIRECTIVE = re.compile(r"^\s*\.\.\s+([\w:-]+)::\s*(.*)$")
_COMMENT = re.compile(r"^\s*\.\.(\s|$)")
_FIELD = re.compile(r"^\s*:[\w -]+:\s*")
_ROLE = re.compile(r":[\w:+-]+:`([^`]*?)(?:\s*<[^`>]*>)?`")
_LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`_{1,2}")
_LITERAL = re.compile(r"``(.+?)``")
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_EMPH = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")
_INTERPRETED = re.compile(r"`([^`]+)`_{0,2}")
_VERSION_DIRECTIVES = {
    "versionadded": "Added in version",
    "versionchanged": "Changed in version",
    "deprecated": "Deprecated since version",
    "deprecated-removed": "Deprecated since version",
}
_SILENT_DIRECTIVES = {
    "index", "toctree", "highlight", "include", "literalinclude", "moduleauthor", "sectionauthor",
    "testsetup", "testcleanup",
}  # fmt: skip


def _rst_inline(text: str) -> str:
    """reST inline markup removed: roles keep their text, links their title."""
    text = _ROLE.sub(lambda m: m.group(1).lstrip("~!"), text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPH.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    return _clean(text)


def _rst_directive(name: str, argument: str) -> str:
    """What a directive line contributes to the searchable text."""
    if name in _VERSION_DIRECTIVES:
        return f"{_VERSION_DIRECTIVES[name]} {argument}".strip() + "."
    if name in _SILENT_DIRECTIVES:
        return ""
    if name in {"note", "warning", "seealso", "important", "tip", "caution", "attention"}:
        label = "See also" if name == "seealso" else name.capitalize()
        return f"{label}: {_rst_inline(argument)}".strip()
    return _rst_inline(argument)


def _rst_units(text: str) -> list[_Unit]:
    lines = list(_lines(text))
    units: list[_Unit] = []
    skip: set[int] = set()
    for i, (start, end, line) in enumerate(lines):
        if i in skip:
            continue
        following = lines[i + 1][2] if i + 1 < len(lines) else ""
        overlined = i > 0 and bool(_ADORNMENT.match(lines[i - 1][2]))
        if _is_heading(line, following, overlined):
            units.append(_Unit("heading", start, end, _rst_inline(line)))
            skip.add(i + 1)
            continue
        directive = _DIRECTIVE.match(line)
        if directive and directive.group(1).lower() in _SILENT_DIRECTIVES:
            skip.update(_directive_body(lines, i))
        units.append(_rst_line_unit(start, end, line))
    return units


def _directive_body(lines: Sequence[tuple[int, int, str]], at: int) -> Iterator[int]:
    """Line numbers of the body (blank lines included) of the directive on line ``at``: the
    lines indented deeper than the directive itself. An indented directive (``.. index::``
    inside a function's description) ends at the next line of its own indentation, so the
    rest of the enclosing block stays text."""
    own = _indent(lines[at][2])
    for i in range(at + 1, len(lines)):
        body = lines[i][2]
        if body.strip() and _indent(body) <= own:
            return
        yield i


def _indent(line: str) -> int:
    """Columns of leading whitespace (tabs to multiples of 8, as reST reads them)."""
    expanded = line.expandtabs()
    return len(expanded) - len(expanded.lstrip())


def _is_heading(line: str, following: str, overlined: bool) -> bool:
    """A title line: underlined by an adornment at least as long (indented if overlined)."""
    stripped = line.strip()
    return (
        bool(stripped)
        and not _ADORNMENT.match(line)
        and (overlined or not line[:1].isspace())
        and bool(_ADORNMENT.match(following))
        and len(following.rstrip()) >= len(stripped)
    )


def _rst_line_unit(start: int, end: int, line: str) -> _Unit:
    if not line.strip() or _ADORNMENT.match(line):
        return _BREAK
    directive = _DIRECTIVE.match(line)
    if directive:
        words = _rst_directive(directive.group(1).lower(), directive.group(2))
        return _Unit("text", start, end, words) if words else _BREAK
    if _COMMENT.match(line):
        return _BREAK
    # Inline markup may span lines (a role broken after its first word), so it is removed
    # from the joined chunk body (_FINISH), not here; a signature's line continuation goes.
    body = _FIELD.sub("", line, count=1).rstrip().removesuffix("\\")
    return _Unit("text", start, end, body.strip())


# --- Markdown ----------------------------------------------------------------------------

_MD_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_MD_FENCE = re.compile(r"^\s*(```|~~~)")
_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MD_CODE = re.compile(r"`([^`]*)`")
_MD_EMPH = re.compile(r"(\*\*|__|\*|_)(?=\S)(.+?)(?<=\S)\1")


def _md_inline(text: str) -> str:
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_CODE.sub(r"\1", text)
    text = _MD_EMPH.sub(r"\2", text)
    return _clean(re.sub(r"^\s*(>\s*)+", "", html.unescape(text)))


def _md_units(text: str) -> list[_Unit]:
    units: list[_Unit] = []
    lines = list(_lines(text))
    for i, (start, end, line) in enumerate(lines):
        heading = _MD_HEADING.match(line)
        if heading:
            units.append(_Unit("heading", start, end, _md_inline(heading.group(2))))
        elif i + 1 < len(lines) and line.strip() and re.match(r"^(=+|-+)\s*$", lines[i + 1][2]):
            units.append(_Unit("heading", start, end, _md_inline(line)))
        elif not line.strip() or _MD_FENCE.match(line) or re.match(r"^(=+|-+)\s*$", line):
            units.append(_BREAK)
        else:
            units.append(_Unit("text", start, end, _md_inline(line)))
    return units


# --- HTML --------------------------------------------------------------------------------

_BLOCK_TAGS = frozenset(
    [
        "p",
        "div",
        "li",
        "ul",
        "ol",
        "pre",
        "table",
        "tr",
        "td",
        "th",
        "section",
        "article",
        "header",
        "footer",
        "br",
        "dt",
        "dd",
        "dl",
        "blockquote",
        "title",
        "nav",
        "aside",
        "main",
        "figure",
        "figcaption",
        "hr",
        "form",
        "body",
    ]
)
_HEADING_TAGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
_HIDDEN_TAGS = frozenset({"script", "style", "noscript", "template", "head"})


class _HtmlReader(HTMLParser):
    """Collects located text runs, cut at block tags; headings become heading units."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.units: list[_Unit] = []
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self._hidden = 0
        self._runs: list[tuple[int, str]] = []
        self._heading = False

    def _offset(self) -> int:
        line, column = self.getpos()
        return self._line_starts[line - 1] + column

    def _flush(self) -> None:
        """Ends the current block at the tag being read."""
        end = self._offset()
        words = _clean(" ".join(run for _, run in self._runs).replace("¶", ""))
        if words:
            kind: Literal["heading", "text"] = "heading" if self._heading else "text"
            self.units.append(_Unit(kind, self._runs[0][0], end, words))
        self._runs = []
        self.units.append(_BREAK)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _HIDDEN_TAGS:
            self._hidden += 1
        elif tag in _BLOCK_TAGS or tag in _HEADING_TAGS:
            self._flush()
            self._heading = tag in _HEADING_TAGS

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN_TAGS:
            self._hidden = max(0, self._hidden - 1)
        elif tag in _BLOCK_TAGS or tag in _HEADING_TAGS:
            self._flush()
            self._heading = False

    def handle_data(self, data: str) -> None:
        if not self._hidden and data.strip():
            self._runs.append((self._offset(), data))


def _html_units(text: str) -> list[_Unit]:
    reader = _HtmlReader(text)
    reader.feed(text)
    reader.close()
    reader._flush()
    return reader.units


# --- man pages (troff) -------------------------------------------------------------------

_TROFF_CHARS = {
    "aq": "'", "dq": '"', "bu": "•", "em": "—", "en": "–", "lq": '"', "rq": '"', "oq": "'",
    "cq": "'", "co": "©", "ti": "~", "ha": "^", "rs": "\\", "mi": "-", "pl": "+", "eq": "=",
    ">=": ">=", "<=": "<=", "mu": "×", "de": "°", "hy": "-", "ga": "`", "at": "@", "sh": "#",
    "Fo": "«", "Fc": "»", "->": "->", "<-": "<-", "ba": "|", "br": "|", "lB": "[", "rB": "]",
}  # fmt: skip
_TROFF_ESCAPE = re.compile(
    r"\\(?:"
    r"f(?:\[[^\]]*\]|\(..|.)"  # font change
    r"|s[+-]?(?:\d|\(\d\d|\[\d+\])"  # size change
    r"|\((?P<two>..)|\[(?P<long>[^\]]*)\]"  # named characters
    r"|\*(?:\(..|\[[^\]]*\]|.)|n(?:\(..|\[[^\]]*\]|.)"  # strings, registers
    r"|(?P<single>.))"
)
_SINGLE_ESCAPES = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": " "}
_BREAK_MACROS = frozenset(
    [
        "PP",
        "P",
        "LP",
        "sp",
        "br",
        "TP",
        "TQ",
        "IP",
        "HP",
        "RS",
        "RE",
        "nf",
        "fi",
        "EX",
        "EE",
        "SY",
        "YS",
        "in",
        "ti",
        "bp",
        "ne",
        "TS",
        "TE",
    ]
)
_FONT_MACROS = {"B": " ", "I": " ", "SM": " ", "SB": " ", "BR": "", "BI": "", "IB": "", "IR": "", "RB": "", "RI": ""}  # fmt: skip
_MACRO_ARG = re.compile(r'"((?:[^"]|"")*)"?|((?:\\.|\S)+)')
"""One request argument: quoted (``""`` is a quote) or bare; an escaped space (``\\ ``) does
not end a bare one (``.B \\-s\\ \\fIservice`` is one argument, ``-s service``)."""


def _troff_escapes(text: str) -> str:
    """troff escapes replaced by the characters they print (or nothing)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("two") or match.group("long")
        if name is not None:
            return _TROFF_CHARS.get(name, "")
        single = match.group("single")
        if single is not None:
            return _SINGLE_ESCAPES.get(single, "")
        return ""

    comment = text.find('\\"')
    if comment >= 0:
        text = text[:comment]
    return _TROFF_ESCAPE.sub(replace, text)


def _macro_args(rest: str) -> list[str]:
    return [(quoted or "").replace('""', '"') or bare for quoted, bare in _MACRO_ARG.findall(rest)]


def troff_request(line: str) -> tuple[str, list[str]]:
    """A request line's (``.SH "SEE ALSO"``) name and arguments, escapes replaced
    (``("SH", ["SEE ALSO"])``); ``("", [])`` for a text or comment line."""
    if not line.startswith((".", "'")):
        return "", []
    body = line[1:]
    comment = body.find('\\"')
    if comment >= 0:  # a comment line, or a note after the arguments: it prints nothing
        body = body[:comment]
    name, _, rest = body.strip().partition(" ")
    return name, [_troff_escapes(arg) for arg in _macro_args(rest)]


def troff_text(line: str) -> str:
    """The words one troff source line prints, whitespace collapsed: escapes replaced by the
    characters they print, comments and tbl's ``T{``/``T}`` gone; a request's arguments (the
    alternating-font macros' joined as they print: ``.BR open (2),`` is ``open(2),``).

    The one troff reader: the chunker's man-page units and the question generator's man
    page families (:mod:`podium.context.generate`) both read lines through it.
    """
    if line.startswith((".", "'")):
        name, args = troff_request(line)
        return _clean(_FONT_MACROS.get(name, " ").join(args))
    return _clean(_troff_escapes(line).replace("T{", " ").replace("T}", " "))


def _man_units(text: str) -> list[_Unit]:
    units: list[_Unit] = []
    title = ""
    pending_heading = False
    table_format = False  # between .TS and the format line ending in "." (tbl's layout)
    for start, end, line in _lines(text):
        if table_format and not line.startswith((".", "'")):
            table_format = not line.rstrip().endswith(".")
            continue
        if line.startswith((".", "'")):
            name, args = troff_request(line)
            if name in {"SH", "SS"}:
                pending_heading = not args
                if args:
                    units.append(_Unit("heading", start, end, troff_text(line)))
            elif name == "TH" and args and not title:
                title = f"{args[0]}({args[1]})" if len(args) > 1 else args[0]
                units.append(_Unit("heading", start, end, title))
            elif name in _FONT_MACROS:
                words = troff_text(line)
                units.append(_Unit("text", start, end, words) if words else _BREAK)
            elif name in _BREAK_MACROS:
                table_format = name == "TS"
                units.append(_BREAK)
            continue
        words = troff_text(line)
        if pending_heading and words:
            units.append(_Unit("heading", start, end, words))
            pending_heading = False
        elif words:
            units.append(_Unit("text", start, end, words))
        else:
            units.append(_BREAK)
    return units


_READERS = {"rst": _rst_units, "markdown": _md_units, "html": _html_units, "man": _man_units}
_FINISH: dict[Format, Callable[[str], str]] = {"rst": _rst_inline}
"""Markup removed from a chunk's joined body, for formats whose inline markup spans lines."""


# --- packing units into chunks -----------------------------------------------------------


@dataclass
class _Packer:
    """Packs paragraphs into chunks for one document (mutable, local to one call)."""

    source: str
    config: ChunkingConfig
    finish: Callable[[str], str]
    title: str = ""
    section: str = ""
    chunks: list[Chunk] = field(default_factory=list)
    current: list[list[_Unit]] = field(default_factory=list)

    def heading(self, unit: _Unit) -> None:
        self.flush()
        if not self.title:
            self.title = unit.text
        self.section = "" if unit.text == self.title else unit.text

    def tokens(self, units: Sequence[_Unit]) -> int:
        """Tokens of the units' searchable text (markup removed as the chunk's body will be)."""
        return sum(count_tokens(self.finish(unit.text)) for unit in units)

    def paragraph(self, units: list[_Unit]) -> None:
        for piece in _split(units, self.config.max_tokens, self.tokens):
            self._add(piece)

    def _add(self, units: list[_Unit]) -> None:
        tokens = self.tokens(units)
        held = sum(self.tokens(paragraph) for paragraph in self.current)
        if self.current and held + tokens > self.config.max_tokens:
            last = self.current[-1]
            self.flush()
            if 0 < self.tokens(last) <= self.config.overlap_tokens:
                self.current.append(last)
        self.current.append(units)

    def flush(self) -> None:
        units = [unit for paragraph in self.current for unit in paragraph]
        self.current = []
        if not units:
            return
        header = " › ".join(part for part in (self.title, self.section) if part)
        body = self.finish(" ".join(unit.text for unit in units))
        self.chunks.append(
            Chunk(
                id=f"{self.source}#{len(self.chunks)}",
                source=self.source,
                start=units[0].start,
                end=units[-1].end,
                text=f"{header}\n{body}" if header else body,
            )
        )


def _split(
    units: list[_Unit], max_tokens: int, measure: Callable[[Sequence[_Unit]], int]
) -> Iterator[list[_Unit]]:
    """A long paragraph cut between units; a single unit over the limit stays whole."""
    piece: list[_Unit] = []
    for unit in units:
        if piece and measure(piece) + measure([unit]) > max_tokens:
            yield piece
            piece = []
        piece.append(unit)
    if piece:
        yield piece


def chunk_document(
    source: str, text: str, fmt: Format, config: ChunkingConfig | None = None
) -> list[Chunk]:
    """One document's decoded text cut into chunks (markup stripped, offsets kept).

    ``fmt`` is the document's format (:func:`document_format`). The chunks are in document
    order, their spans ascending (overlapping only where a paragraph is repeated).
    """
    packer = _Packer(source, config or from_env(ChunkingConfig), _FINISH.get(fmt, _clean))
    paragraph: list[_Unit] = []
    for unit in _READERS[fmt](text):
        if unit.kind == "text":
            paragraph.append(unit)
            continue
        if paragraph:
            packer.paragraph(paragraph)
            paragraph = []
        if unit.kind == "heading":
            packer.heading(unit)
    if paragraph:
        packer.paragraph(paragraph)
    packer.flush()
    return packer.chunks


def chunk_file(source: str, path: Path, config: ChunkingConfig | None = None) -> list[Chunk]:
    """The chunks of the document at ``path`` (:class:`CorpusError` if it is unreadable)."""
    fmt = document_format(path.name)
    if fmt is None:
        raise CorpusError(f"{path} is not a document Podium can read", path=str(path))
    return chunk_document(source, read_document(path), fmt, config)
