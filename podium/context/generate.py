"""Questions generated from the documents' own structure, with gold spans in file coordinates.

Five families, each a small pure function of ``(source, text)`` (``text`` is the decoded
document, :func:`podium.context.corpus.read_document`, so every offset is a
:class:`~podium.context.corpus.Chunk` offset):

* ``versionadded`` / ``versionchanged`` (reST): a ``.. versionadded:: 3.x`` nested under an
  object directive (``.. function::``, ``.. class::``, ``.. method::``, ``.. c:function::``
  ...) asks "In which Python version was os.cpu_count() added?"; a ``versionchanged`` asks what
  changed in that version. Gold: the version directive with its indented body.
* ``faq`` (reST under a ``faq`` directory): the FAQ's own question headings; gold: the answer
  from the heading's underline to the end of its first substantial paragraph.
* ``header`` (man pages): a SYNOPSIS ``#include <h>`` followed by the prototype of a function
  named in NAME asks "Which header declares f()?"; gold: from the include line to the end of
  that prototype.
* ``errno`` (man pages): each ERRORS item asks "What does the error EACCES mean for open(2)?";
  a short one also asks the other way round ("Which error does open(2) fail with when ...?").
  Gold: the item (every item of that errno for the first form).
* ``seealso`` (man pages, two-hop): "Which page listed under SEE ALSO in open(2) is about
  'reposition read/write file offset'?"; gold: the link in the first page and the NAME line of
  the second, so finding both takes two searches.

Why structure and not a language model: the gold is exact by construction, generation is
deterministic and offline, and the families differ in what retrieval they need (identifier
lookup, paraphrase, two hops), which is what a pruning agent must learn to tell apart.

Splits are by document (a stable hash of the first gold span's source), so no document's
questions are both trained on and held out. ``max_per_document`` caps each family per
document, choosing by hash rather than position, so long pages (os.rst, open(2)) do not drown
the rest.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from podium.context.corpus import iter_documents, read_document, troff_text
from podium.context.questions import GoldSpan, Question, write_questions
from podium.errors import ConfigError

KINDS: tuple[str, ...] = ("versionadded", "versionchanged", "faq", "header", "errno", "seealso")
"""Every question family, in report order."""

SPLITS: tuple[str, ...] = ("train", "validation", "held-out")
"""Split names; each is written as ``<split>.jsonl``."""


@dataclass(frozen=True, slots=True)
class GenerateConfig:
    """How many questions of which kinds, and how they are split."""

    kinds: tuple[str, ...] = KINDS
    """Families to generate (a subset of :data:`KINDS`)."""
    max_per_document: int = 5
    """At most this many questions of one generated family per document (0: no cap; the
    FAQ's real questions are never capped)."""
    validation_percent: int = 10
    """Share of documents whose questions go to ``validation``."""
    held_out_percent: int = 10
    """Share of documents whose questions go to ``held-out``."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(KINDS))
        if unknown:
            raise ConfigError(f"question kinds {unknown} unknown (known: {', '.join(KINDS)})")
        if self.max_per_document < 0:
            raise ConfigError(f"max_per_document must be >= 0, got {self.max_per_document}")
        shares = (self.validation_percent, self.held_out_percent)
        if min(shares) < 0 or sum(shares) > 100:
            raise ConfigError(
                "validation_percent and held_out_percent must be >= 0 and sum to <= 100, "
                f"got {shares}"
            )


# ---------------------------------------------------------------- lines and ids


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a document with its offsets (``end`` excludes the newline)."""

    start: int
    end: int
    text: str


def split_lines(text: str) -> list[Line]:
    """Every line of ``text`` with its character offsets."""
    out: list[Line] = []
    pos = 0
    for raw in text.splitlines(keepends=True):
        body = raw.rstrip("\r\n")
        out.append(Line(pos, pos + len(body), body))
        pos += len(raw)
    return out


def stable_hash(text: str) -> int:
    """A process-independent hash (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def make_question(kind: str, question: str, gold: Sequence[GoldSpan], answer: str) -> Question:
    """A question whose id is a stable digest of its kind, text and gold."""
    key = "|".join([kind, question, *(f"{g.source}:{g.start}:{g.end}" for g in gold)])
    return Question(
        id=f"{kind}-{stable_hash(key):016x}",
        question=question,
        gold=tuple(gold),
        kind=kind,
        answer=answer,
    )


def cap(questions: list[Question], limit: int) -> list[Question]:
    """At most ``limit`` of ``questions`` (0: all), chosen by id hash, kept in document order."""
    if limit == 0 or len(questions) <= limit:
        return questions
    chosen = set(sorted(q.id for q in questions)[:limit])
    return [q for q in questions if q.id in chosen]


# ---------------------------------------------------------------- reST

_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:]+)::\s*(.*)$")
OBJECT_DIRECTIVES = frozenset(
    {
        "function", "method", "class", "exception", "attribute", "data", "decorator",
        "classmethod", "staticmethod", "abstractmethod", "coroutinefunction",
        "coroutinemethod", "property", "decoratormethod", "opcode", "envvar", "cmdoption",
        "c:function", "c:macro", "c:type", "c:member", "c:var", "c:data", "c:struct",
    }
)  # fmt: skip
"""Directives that document one named object (what a version directive can be about)."""
CALLABLE_DIRECTIVES = frozenset(
    {"function", "method", "classmethod", "staticmethod", "abstractmethod",
     "coroutinefunction", "coroutinemethod", "decorator", "decoratormethod",
     "c:function", "c:macro"}
)  # fmt: skip
"""Object directives whose name is written with ``()``."""
_C_NAME = re.compile(r"([A-Za-z_]\w*)\s*(?:\(|$)")


def indent_of(text: str) -> int:
    """Leading spaces (tabs count as 8, as docutils reads them)."""
    expanded = text.expandtabs(8)
    return len(expanded) - len(expanded.lstrip(" "))


def object_name(directive: str, argument: str) -> str:
    """The object a directive documents: ``os.fsencode`` from ``fsencode(filename)``,
    ``PyList_New`` from ``PyObject* PyList_New(Py_ssize_t len)``; "" when none."""
    argument = argument.strip()
    if not argument:
        return ""
    if directive.startswith("c:"):
        head = argument.split("(", 1)[0] if "(" in argument else argument
        match = _C_NAME.search(head.strip() + ("(" if "(" in argument else ""))
        return match.group(1) if match else ""
    return re.split(r"[\s(\[]", argument, maxsplit=1)[0]


@dataclass(frozen=True, slots=True)
class _Scope:
    """An enclosing object directive during the scan."""

    indent: int
    directive: str
    name: str


def block_end(lines: Sequence[Line], i: int) -> int:
    """Index one past the indented body of the directive on line ``i`` (blank lines inside
    the body belong to it; trailing blank lines do not)."""
    base = indent_of(lines[i].text)
    last = i
    j = i + 1
    while j < len(lines):
        text = lines[j].text
        if text.strip():
            if indent_of(text) <= base:
                break
            last = j
        j += 1
    return last + 1


def _qualified(scopes: Sequence[_Scope], module: str, name: str) -> str:
    # As Sphinx resolves it: a dotted name (``HMAC.update``) is relative to the module,
    # not to the enclosing class; a name already under the module stays as written.
    if module and name.startswith(module + "."):
        return name
    parents = [] if "." in name else [s.name for s in scopes]
    return ".".join(p for p in [module, *parents, name] if p)


def version_questions(source: str, text: str) -> list[Question]:
    """``versionadded`` and ``versionchanged`` questions of one reST document."""
    lines = split_lines(text)
    module = ""
    scopes: list[_Scope] = []  # enclosing object directives, outermost first
    out: list[Question] = []
    for i, line in enumerate(lines):
        match = _DIRECTIVE.match(line.text)
        if not match:
            continue
        indent = indent_of(match.group(1))
        directive, argument = match.group(2), match.group(3)
        while scopes and scopes[-1].indent >= indent:
            scopes.pop()
        if directive in ("module", "currentmodule", "py:module", "py:currentmodule"):
            module = "" if argument.strip() == "None" else argument.strip()
            scopes.clear()
        elif directive in OBJECT_DIRECTIVES:
            name = object_name(directive, argument)
            if name:
                scopes.append(_Scope(indent, directive, name))
        elif directive in ("versionadded", "versionchanged") and scopes:
            out.extend(_version_question(source, lines, i, directive, argument, module, scopes))
    return out


def _version_question(
    source: str,
    lines: Sequence[Line],
    i: int,
    directive: str,
    argument: str,
    module: str,
    scopes: Sequence[_Scope],
) -> list[Question]:
    """The question of the version directive on line ``i`` about the innermost object of
    ``scopes`` (none when its argument is not a version number)."""
    version = argument.split()[0] if argument.split() else ""
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        return []
    inner = scopes[-1]
    # C names are global; Python ones read best qualified by module and class.
    name = (
        inner.name
        if inner.directive.startswith("c:")
        else _qualified(scopes[:-1], module, inner.name)
    )
    shown = f"{name}()" if inner.directive in CALLABLE_DIRECTIVES else name
    end = lines[block_end(lines, i) - 1].end
    gold = [GoldSpan(source, lines[i].start + indent_of(lines[i].text), end)]
    if directive == "versionadded":
        return [
            make_question(
                "versionadded", f"In which Python version was {shown} added?", gold, version
            )
        ]
    return [
        make_question(
            "versionchanged", f"What changed in {shown} in Python {version}?", gold, version
        )
    ]


_COMMENT = re.compile(r"^\s*\.\.(\s+_|\s+(?!\S+::)|$)")
"""A reST comment or label (``.. XXX ...``, ``.. _target:``): never part of an answer."""
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")


def faq_questions(source: str, text: str) -> list[Question]:
    """The real questions of a reST FAQ: headings ending in ``?``; gold: their answer."""
    lines = split_lines(text)
    out: list[Question] = []
    for i in range(len(lines) - 1):
        heading, under = lines[i].text.strip(), lines[i + 1].text
        if not heading.endswith("?") or not _UNDERLINE.match(under):
            continue
        if len(under.strip()) < len(heading) - 2:
            continue
        span = answer_span(lines, i + 2)
        if span is not None:
            out.append(make_question("faq", heading, [GoldSpan(source, *span)], ""))
    return out


def answer_span(lines: Sequence[Line], first: int, min_words: int = 8) -> tuple[int, int] | None:
    """From the first text line at or after ``first`` to the end of the first paragraph of at
    least ``min_words`` words ("Yes." alone answers nothing), stopping at the next heading."""
    start: int | None = None
    words = 0
    i = first
    while i < len(lines):
        text = lines[i].text
        if i + 1 < len(lines) and text.strip() and _UNDERLINE.match(lines[i + 1].text):
            break  # the next heading
        if text.strip() and not _COMMENT.match(text):
            start = lines[i].start if start is None else start
            words += len(text.split())
        elif start is not None and words >= min_words:
            return start, lines[i - 1].end
        i += 1
    if start is not None and words:
        return start, lines[i - 1].end
    return None


# ---------------------------------------------------------------- man pages


def man_sections(lines: Sequence[Line]) -> dict[str, tuple[int, int]]:
    """Section name → (first line index after ``.SH``, index of the next ``.SH``)."""
    heads = [
        (i, line.text[3:].strip().strip('"').upper())
        for i, line in enumerate(lines)
        if line.text.startswith(".SH")
    ]
    out: dict[str, tuple[int, int]] = {}
    for n, (i, name) in enumerate(heads):
        end = heads[n + 1][0] if n + 1 < len(heads) else len(lines)
        out.setdefault(name, (i + 1, end))
    return out


@dataclass(frozen=True, slots=True)
class ManPage:
    """What the man-page families need of one page."""

    source: str
    """The page's document (relative to its docs root)."""
    names: tuple[str, ...]
    """The names the NAME section lists (``open``, ``openat``, ``creat``)."""
    section: str
    """The manual section of ``.TH`` (``2``)."""
    description: str
    """NAME's words after ``\\-``."""
    name_span: tuple[int, int]
    """Offsets of the NAME section's text."""
    lines: tuple[Line, ...] = field(repr=False)
    """Every line of the page with its offsets."""
    sections: Mapping[str, tuple[int, int]] = field(repr=False)
    """Section name → line range (:func:`man_sections`)."""

    @property
    def title(self) -> str:
        """``open(2)``: how man pages name each other."""
        return f"{self.names[0]}({self.section})"


def parse_man(source: str, text: str) -> ManPage | None:
    """A man page's NAME and sections, or None for text that is not one (or a ``.so`` stub)."""
    lines = split_lines(text)
    th = next((line for line in lines if line.text.startswith(".TH ")), None)
    sections = man_sections(lines)
    if th is None or "NAME" not in sections:
        return None
    first, end = sections["NAME"]
    body = [
        line for line in lines[first:end] if line.text.strip() and not is_troff_comment(line.text)
    ]
    if not body:
        return None
    joined = " ".join(troff_text(line.text) for line in body)
    names_part, sep, description = joined.partition(" - ")
    names = tuple(n.strip() for n in names_part.split(",") if n.strip())
    th_args = re.findall(r'"[^"]*"|\S+', th.text[4:])
    if not sep or not names or len(th_args) < 2:
        return None
    return ManPage(
        source=source,
        names=names,
        section=th_args[1].strip('"'),
        description=description.strip(),
        name_span=(body[0].start, body[-1].end),
        lines=tuple(lines),
        sections=sections,
    )


def is_troff_comment(line: str) -> bool:
    """A troff comment line (``.\\"`` or ``\\"``): the page's source notes, not its text."""
    return line.startswith(('.\\"', '\\"', "'\\\""))


_PROTOTYPE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_C_KEYWORDS = frozenset({"sizeof", "typeof", "return", "if", "while", "for", "switch"})


def header_questions(page: ManPage) -> list[Question]:
    """ "Which header declares f()?" for each NAME function whose SYNOPSIS prototype follows an
    ``#include``; gold: the include line through the prototype."""
    if "SYNOPSIS" not in page.sections:
        return []
    first, end = page.sections["SYNOPSIS"]
    include: tuple[Line, str] | None = None
    asked: set[str] = set()
    out: list[Question] = []
    for line in page.lines[first:end]:
        plain = troff_text(line.text)
        found = re.match(r"#include\s*<([^>]+)>", plain)
        if found:
            include = (line, f"<{found.group(1)}>")
            continue
        called = _PROTOTYPE.search(plain)
        if include is None or called is None or called.group(1) in _C_KEYWORDS:
            continue
        name = called.group(1)
        if name in page.names and name not in asked:
            asked.add(name)
            gold = [GoldSpan(page.source, include[0].start, line.end)]
            out.append(
                make_question("header", f"Which header declares {name}()?", gold, include[1])
            )
    return out


_ERRNO = re.compile(r"^E[A-Z0-9]{2,}$")


def errno_items(page: ManPage) -> list[tuple[str, int, int, str]]:
    """ERRORS items as (errno, start, end, description words): a ``.TP`` whose tag is one
    errno, up to the next ``.TP``/``.SH``."""
    if "ERRORS" not in page.sections:
        return []
    first, end = page.sections["ERRORS"]
    lines = page.lines
    items: list[tuple[str, int, int, str]] = []
    i = first
    while i < end:
        if lines[i].text.startswith(".TP") and i + 1 < end:
            tag = troff_text(lines[i + 1].text).strip()
            j = i + 2
            while j < end and not lines[j].text.startswith((".TP", ".SH", ".SS")):
                j += 1
            if _ERRNO.match(tag) and j > i + 2:
                words = " ".join(
                    troff_text(x.text) for x in lines[i + 2 : j] if not is_troff_comment(x.text)
                )
                items.append((tag, lines[i + 1].start, lines[j - 1].end, " ".join(words.split())))
            i = j
        else:
            i += 1
    return items


def errno_questions(page: ManPage) -> list[Question]:
    """ "What does the error E… mean for f(n)?" (gold: every item of that errno) and, for a
    short unambiguous item, "Which error does f(n) fail with when …?"."""
    items = errno_items(page)
    by_errno: dict[str, list[GoldSpan]] = {}
    for errno, start, end, _words in items:
        by_errno.setdefault(errno, []).append(GoldSpan(page.source, start, end))
    out = [
        make_question("errno", f"What does the error {errno} mean for {page.title}?", gold, errno)
        for errno, gold in by_errno.items()
    ]
    for errno, start, end, words in items:
        sentence = words.split(". ")[0].rstrip(".")
        if (
            len(by_errno[errno]) == 1
            and 4 <= len(sentence.split()) <= 20
            and "(" not in sentence[:1]
        ):
            question = f"Which error does {page.title} fail with when: {sentence}?"
            out.append(make_question("errno", question, [GoldSpan(page.source, start, end)], errno))
    return out


_LINK = re.compile(r"([A-Za-z_][\w.+-]*)\((\d\w*)\)")


def seealso_questions(page: ManPage, pages: Mapping[str, ManPage]) -> list[Question]:
    """Two-hop: which page among this one's SEE ALSO links is about B's description; gold:
    the link line here and B's NAME text."""
    if "SEE ALSO" not in page.sections:
        return []
    first, end = page.sections["SEE ALSO"]
    out: list[Question] = []
    for line in page.lines[first:end]:
        if is_troff_comment(line.text):
            continue  # a maintainer's note ("FIXME: should list ppoll(2)") links nothing
        for name, section in _LINK.findall(troff_text(line.text)):
            other = pages.get(f"{name}({section})")
            if other is None or other.source == page.source or len(other.description.split()) < 3:
                continue
            question = (
                f"Which page listed under SEE ALSO in {page.title} is about '{other.description}'?"
            )
            gold = [
                GoldSpan(page.source, line.start, line.end),
                GoldSpan(other.source, *other.name_span),
            ]
            out.append(make_question("seealso", question, gold, f"{name}({section})"))
    return out


# ---------------------------------------------------------------- the corpus


@dataclass(frozen=True, slots=True)
class Generated:
    """Questions by split, and how many of each kind each split holds."""

    splits: Mapping[str, tuple[Question, ...]]
    """Split name (:data:`SPLITS`) → its questions, in corpus order."""
    documents: int
    """Documents read that hold their own text (``.so`` redirects not counted)."""

    def counts(self) -> dict[str, dict[str, int]]:
        """Kind → split → number of questions (every kind and split present)."""
        table = {k: dict.fromkeys(SPLITS, 0) for k in KINDS}
        for split, questions in self.splits.items():
            for q in questions:
                table[q.kind][split] += 1
        return table


def split_of(question: Question, config: GenerateConfig) -> str:
    """The split of a question: by a stable hash of its first gold span's document."""
    bucket = stable_hash(question.gold[0].source) % 100
    if bucket < config.held_out_percent:
        return "held-out"
    if bucket < config.held_out_percent + config.validation_percent:
        return "validation"
    return "train"


def is_redirect(text: str) -> bool:
    """A man page that only sources another (``.so man3/x.3``): its text is not its own."""
    body = [line for line in text.splitlines() if line.strip() and not is_troff_comment(line)]
    return len(body) <= 2 and any(line.startswith(".so ") for line in body)


def document_questions(
    source: str,
    text: str,
    config: GenerateConfig,
    page: ManPage | None,
    pages: Mapping[str, ManPage],
) -> list[Question]:
    """Every question family that applies to one document, each capped."""
    families: dict[str, Callable[[], list[Question]]] = {}
    if page is not None:
        families["header"] = lambda: header_questions(page)
        families["errno"] = lambda: errno_questions(page)
        families["seealso"] = lambda: seealso_questions(page, pages)
    elif ".. " in text:
        versions = version_questions(source, text)
        families["versionadded"] = lambda: [q for q in versions if q.kind == "versionadded"]
        families["versionchanged"] = lambda: [q for q in versions if q.kind == "versionchanged"]
        if "faq" in Path(source).parts[:-1] or Path(source).name.lower().startswith("faq"):
            families["faq"] = lambda: faq_questions(source, text)
    out: list[Question] = []
    for kind, make in families.items():
        if kind in config.kinds:
            # The FAQ's questions are real and few: all of them, uncapped.
            out.extend(make() if kind == "faq" else cap(make(), config.max_per_document))
    return out


def read_corpus(
    roots: Sequence[Path], on_document: Callable[[str], None] | None = None
) -> Iterator[tuple[str, str]]:
    """(source, decoded text) of every document under ``roots`` (symbolic links are not
    documents, :func:`~podium.context.corpus.iter_documents`) except ``.so`` redirects: a
    question's gold must be in the page that holds the words."""
    for source, path in iter_documents(roots):
        if on_document is not None:
            on_document(source)
        text = read_document(path)
        if not is_redirect(text):
            yield source, text


def register_page(pages: dict[str, ManPage], page: ManPage) -> None:
    """Make ``page`` what ``name(section)`` links resolve to, for each name it lists; the page
    whose file is named after the name wins (memset(3) is memset.3, not bstring.3, which
    also lists memset)."""
    stem = Path(page.source).name.split(".", 1)[0]
    for name in page.names:
        key = f"{name}({page.section})"
        if name == stem or key not in pages:
            pages[key] = page


def generate(
    roots: Sequence[Path],
    config: GenerateConfig = GenerateConfig(),
    on_document: Callable[[str], None] | None = None,
) -> Generated:
    """Questions from every document under ``roots``, split by document.

    Two passes over the text held in memory: man pages first (the two-hop family needs every
    page's NAME), then the families. ``on_document`` is called once per document read (a
    progress bar's advance).
    """
    documents = list(read_corpus(roots, on_document))
    pages: dict[str, ManPage] = {}
    parsed: dict[str, ManPage] = {}
    for source, text in documents:
        page = parse_man(source, text) if "\n.SH" in text else None
        if page is not None:
            parsed[source] = page
            register_page(pages, page)
    splits: dict[str, list[Question]] = {s: [] for s in SPLITS}
    seen: set[str] = set()
    for source, text in documents:
        for q in document_questions(source, text, config, parsed.get(source), pages):
            if q.id not in seen:
                seen.add(q.id)
                splits[split_of(q, config)].append(q)
    return Generated({s: tuple(qs) for s, qs in splits.items()}, len(documents))


def write_generated(out: Path, generated: Generated) -> dict[str, Path]:
    """Write each split as ``<out>/<split>.jsonl``; returns split → path."""
    paths: dict[str, Path] = {}
    for split in SPLITS:
        paths[split] = out / f"{split}.jsonl"
        write_questions(paths[split], generated.splits.get(split, ()))
    return paths


def all_questions(generated: Generated) -> Iterable[Question]:
    """Every generated question, train first."""
    for split in SPLITS:
        yield from generated.splits.get(split, ())
