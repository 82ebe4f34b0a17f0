#!/usr/bin/env python3
"""Split ``ror_annotate/store.py`` into the package ``ror_annotate/store/`` (a codemod, stdlib only).

The store module grew to ~2,000 lines while several people appended methods to its ``Store``
class. This script turns it into a package mechanically, so it can be re-run after those branches
are merged:

* every top-level definition moves, with the comments above it and its docstring, to the module
  named in :data:`TOPLEVEL` (an unknown one goes to :data:`DEFAULT_MODULE`, and is printed);
* every ``Store`` method moves to the mixin class named in :data:`METHODS` (an unknown one goes to
  the default mixin :data:`DEFAULT_MIXIN`, and is printed), keeping its source order; ``class
  Store`` in ``core.py`` keeps its docstring and ``__init__`` and inherits the mixins;
* each module imports exactly the names its code uses (relative imports gain one dot), and
  ``store/__init__.py`` re-exports every public name ``ror_annotate.store`` had.

Source text is copied as it is (source segments located with :mod:`ast`), with two edits only:
relative imports inside function bodies gain one dot, and a method leaving ``Store`` whose return
annotation names ``"Store"`` takes a self-type (``self: _S`` bound to its mixin) so the type stays
exact. The output depends on the input alone (deterministic); a package already split is left
alone (``--replace`` regenerates it from a ``store.py`` put back by a merge).

Usage::

    python scripts/split_store.py [--root REPO] [--replace]

After a merge that brings back a ``store.py`` edited on another branch (git reports a modify/delete
conflict on it): keep that branch's ``store.py`` (``git checkout --theirs ror_annotate/store.py``,
or the text merged with main's last ``store.py``), run this script with ``--replace``, and
``git add -A ror_annotate/store ror_annotate/store.py``. Methods it prints as not in the mapping
landed in ``store/other.py``: add them to :data:`MIXINS` (or move them by hand) and run it again.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

#: Module -> its docstring (the first line says what it holds).
MODULES: dict[str, str] = {
    "schema": "The store's schema: DDL of the core tables, their migrations and schema versions, the timestamp convention.",
    "connection": "Opening a store file: one DuckDB connection per file and process, locking and retries, threads, interrupts, DuckDB errors.",
    "progress": "The progress file beside a store (``<db>.progress.json``) that ``ror status`` reads while the store is locked.",
    "access": "Generic access for stages: SQL on a stage's own tables, Arrow inserts, reads of the rows of some traces.",
    "traces": "Store methods on the ``traces`` table.",
    "segments": "Store methods on the ``segmentations`` and ``segments`` tables, and the stage tables that depend on them.",
    "labels": "Store methods on the ``labels`` table, and :class:`RaterLabels` (one rater's labels as columns).",
    "annotators": "Store methods on the ``annotators`` table (declared raters) and the raters seen in ``labels``.",
    "runs": "Store methods on the ``runs`` table: how every command records itself.",
    "other": "Store methods and helpers not yet sorted into a module by ``scripts/split_store.py`` (move each to its table's module).",
    "core": "The :class:`Store` facade: opening a store (with its migrations) and the mixins of every table.",
}

#: Top-level name of store.py -> module.
TOPLEVEL: dict[str, str] = {
    "DEFAULT_DB": "core",
    "CORE_MIGRATIONS": "schema", "CORE_TABLES": "schema", "DependentPolicy": "schema", "LABEL_TABLE_SCHEMA": "schema",
    "to_naive_utc": "schema", "_to_aware": "schema", "_split_sql": "schema",
    "_IDS_FILTER": "access", "ROWID_BUCKET": "access", "MAX_ROWID_RANGES": "access", "_IDENTIFIER": "access",
    "rowid_ranges": "access", "_arrow_of": "access", "_drop_pending_result": "access",
    "WRONG_THREAD": "connection", "_wrong_thread": "connection", "_Shared": "connection", "_OPEN": "connection",
    "_OPEN_LOCK": "connection", "_is_lock_error": "connection", "_signals_held": "connection", "is_interrupt": "connection",
    "translate_duckdb_error": "connection", "duckdb_errors": "connection", "MEMORY_LIMIT_ENV": "connection",
    "CACHE_KEEP_BYTES": "connection", "CACHE_CHECK_SECONDS": "connection", "_duckdb_config": "connection",
    "DAMAGED_WAL": "connection", "UNREADABLE_STORE": "connection", "_open_error": "connection",
    "_process_command": "connection", "_connect_with_retry": "connection",
    "ProgressFile": "progress",
    "SegmentLength": "segments",
    "RaterLabels": "labels",
    "LabelCodes": "labels",  # (branch viewscale)
}
DEFAULT_MODULE = "other"


@dataclass
class Mixin:
    name: str
    module: str
    base: str | None
    doc: str
    methods: tuple[str, ...]
    members: list[str] = field(default_factory=list)  # source chunks, filled in source order


#: The mixins, in the order ``Store`` lists them (bases first in this table).
MIXINS: tuple[Mixin, ...] = (
    Mixin("ConnectionMixin", "connection", None, "A store handle's connection: lifecycle, transactions, DuckDB's cache, checkpoints.", (
        "con", "close", "_require_writable", "transaction", "release_cache", "checkpoint", "_abandon_transaction", "_count",
        "in_transaction",
        # the commit journal (branch harden2): called from transaction/checkpoint/close
        "journal_note", "_journal_count_commit", "_journal_committed", "_journal_checkpointed", "_journal_close",
    )),
    Mixin("SchemaMixin", "schema", "ConnectionMixin", "Schema versions and migrations of the core tables and of each stage's own tables.", (
        "_check_readable", "_ensure_versions_table", "schema_version", "migrate",
        "_journal_open",  # (branch harden2) migrates the journal's table when a store opens
    )),
    Mixin("AccessMixin", "access", "ConnectionMixin", "SQL for a stage's own tables, Arrow inserts, and reads of the rows of some traces.", (
        "execute", "_register", "_unregister", "insert_arrow", "trace_filter", "rows_of_traces", "arrow_of_traces",
    )),
    Mixin("TracesMixin", "traces", "AccessMixin", "The ``traces`` table.", (
        "upsert_traces", "check_traces", "trace_ids", "get_trace", "iter_traces",
    )),
    Mixin("SegmentsMixin", "segments", "AccessMixin", "The ``segmentations`` and ``segments`` tables, and the stage tables that depend on them.", (
        "segmentation_of", "segmentations", "register_trace_dependent", "_trace_dependents", "replace_segments",
        "replace_segments_many", "_clear_dependents", "segments", "segments_by_trace", "segmented_trace_overview",
        "segment_lengths",
    )),
    Mixin("LabelsMixin", "labels", "AccessMixin", "The ``labels`` table.", (
        "upsert_labels", "upsert_label_table", "_write_label_table", "delete_labels", "labels", "label_sources",
        "labelled_segment_indices", "count_unlabelled_segments", "label_counts", "latest_label_times",
        "latest_rater_labels", "rater_codebook_versions", "replace_rater_labels",
        "labelled_indices_by_trace", "label_codes",  # (branches judgespeed, viewscale)
    )),
    Mixin("AnnotatorsMixin", "annotators", "AccessMixin", "The ``annotators`` table and the raters seen in ``labels``.", (
        "annotators", "upsert_annotators", "declared_annotators", "rater_kinds",
    )),
    Mixin("RunsMixin", "runs", "AccessMixin", "The ``runs`` table and the progress file of a running command.", (
        "start_run", "detached_run", "finish_run", "update_run_counts", "run", "report_progress", "runs", "run_ids_with_status",
    )),
    Mixin("OtherMixin", "other", "AccessMixin", "Methods ``scripts/split_store.py`` did not know: move each to its table's mixin.", ()),
)
DEFAULT_MIXIN = "OtherMixin"
#: Methods that stay on ``Store`` itself (``core.py``).
STORE_METHODS = ("__init__", "__enter__", "__exit__", "counts")
#: Instance attributes ``Store.__init__`` sets, declared with their types on the base mixin for the others to use.
ATTRIBUTES: dict[str, str] = {
    "path": "str", "read_only": "bool", "_closed": "bool", "_progress": "ProgressFile | None", "_shared": "_Shared",
}
BASE_MIXIN = "ConnectionMixin"
PACKAGE = "ror_annotate"


class SplitError(Exception):
    pass


def _names_in(node: ast.AST) -> set[str]:
    """Names a piece of code reads, including those inside string annotations; minus names it imports locally."""
    used: set[str] = set()
    local_imports: set[str] = set()
    annotations: list[ast.AST] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            used.add(sub.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)) and sub is not node:
            local_imports.update((a.asname or a.name).split(".")[0] for a in sub.names)
        elif isinstance(sub, ast.arg) and sub.annotation is not None:
            annotations.append(sub.annotation)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.returns is not None:
            annotations.append(sub.returns)
        elif isinstance(sub, ast.AnnAssign):
            annotations.append(sub.annotation)
    for ann in annotations:
        for sub in ast.walk(ann):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                try:
                    used |= {n.id for n in ast.walk(ast.parse(sub.value, mode="eval")) if isinstance(n, ast.Name)}
                except SyntaxError:
                    pass
    return used - local_imports


def _isort_key(name: str) -> tuple[int, str]:
    """isort's order within one import: CONSTANTS, then Classes, then functions (case-insensitive)."""
    bare = name.lstrip("_")
    return (0 if bare.isupper() else 1 if bare[:1].isupper() else 2, name.lower())


def _defined_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


@dataclass
class Piece:
    name: str
    text: str
    uses: set[str]


@dataclass
class Module:
    name: str
    pieces: list[Piece] = field(default_factory=list)
    mixins: list[Mixin] = field(default_factory=list)
    typevars: list[str] = field(default_factory=list)  # mixin names that need a self-type TypeVar
    extra_uses: set[str] = field(default_factory=set)


class Splitter:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tree = ast.parse(source)
        self.lines = source.splitlines(keepends=True)
        self.unmapped: list[str] = []
        self.retyped: list[str] = []
        self.imports: dict[str, tuple[ast.stmt, ast.alias]] = {}  # bound name -> (statement, alias)
        self.import_order: list[ast.stmt] = []
        self.placed: dict[str, str] = {}  # top-level name -> module
        self.modules: dict[str, Module] = {name: Module(name) for name in MODULES}
        self.mixins = {m.name: Mixin(m.name, m.module, m.base, m.doc, m.methods) for m in MIXINS}
        self.method_home = {method: m.name for m in MIXINS for method in m.methods}
        self.doc = ""
        self.store_doc = ""
        self.store_members: list[str] = []
        self.store_uses: set[str] = set()
        self.attributes: dict[str, str] = {}  # attribute Store.__init__ sets -> its type
        self._deepen_nested_relative_imports()

    # ------------------------------------------------------------------ source segments
    def _deepen_nested_relative_imports(self) -> None:
        top = set(map(id, self.tree.body))
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0 and id(node) not in top:
                line = self.lines[node.lineno - 1]
                self.lines[node.lineno - 1] = line[: node.col_offset] + line[node.col_offset :].replace("from .", "from ..", 1)

    def _chunks(self, body: list[ast.stmt], start: int) -> list[tuple[ast.stmt, str]]:
        """Each statement with the comments and blank lines above it (leading blank lines dropped)."""
        out = []
        prev = start
        for node in body:
            chunk = self.lines[prev : node.end_lineno]
            while chunk and not chunk[0].strip():
                chunk.pop(0)
            out.append((node, "".join(chunk).rstrip() + "\n"))
            prev = node.end_lineno or prev
        return out

    # ------------------------------------------------------------------ reading
    def read(self) -> None:
        body = self.tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            self.doc = body[0].value.value
        for node, text in self._chunks(body, 0):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                    continue
                self.import_order.append(node)
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    self.imports[bound] = (node, alias)
                continue
            if node is body[0] and self.doc:
                continue
            name = _defined_name(node)
            if name == "Store" and isinstance(node, ast.ClassDef):
                self._read_store(node)
                continue
            if name is None or name not in TOPLEVEL:
                self.unmapped.append(f"top-level {name or ast.dump(node)[:40]!s} -> {DEFAULT_MODULE}")
            module = TOPLEVEL.get(name or "", DEFAULT_MODULE)
            if name is not None:
                self.placed[name] = module
            self.modules[module].pieces.append(Piece(name or "", text, _names_in(node)))
        for m in self.mixins.values():
            self.placed[m.name] = m.module
        self.placed["Store"] = "core"
        self.emitted = {BASE_MIXIN}  # mixins written: those with methods, and their bases
        for m in self.mixins.values():
            base: str | None = m.name if m.members else None
            while base is not None:
                self.emitted.add(base)
                base = self.mixins[base].base

    def _read_store(self, cls: ast.ClassDef) -> None:
        if cls.decorator_list or cls.bases or cls.keywords:
            raise SplitError("class Store has decorators or bases: this script expects a plain class")
        for node, text in self._chunks(cls.body, cls.lineno):
            if node is cls.body[0] and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                self.store_doc = text
                continue
            name = _defined_name(node)
            uses = _names_in(node)
            if name == "__init__":
                self._read_attributes(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name not in STORE_METHODS:
                home = self.method_home.get(node.name)
                if home is None:
                    home = DEFAULT_MIXIN
                    self.unmapped.append(f"method Store.{node.name} -> {DEFAULT_MIXIN} (store/{self.mixins[home].module}.py)")
                mixin = self.mixins[home]
                text = self._retype_self(node, text, mixin)
                uses = _names_in(ast.parse(textwrap.dedent(text)))  # of the text as written (retyped)
                mixin.members.append(text)
                self.modules[mixin.module].extra_uses |= uses
            else:
                self.store_members.append(text)
                self.store_uses |= uses

    def _read_attributes(self, init: ast.stmt) -> None:
        """The ``self.x`` that ``__init__`` assigns, typed from :data:`ATTRIBUTES`, its annotation, else ``Any``."""
        for sub in ast.walk(init):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(sub, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    known = ATTRIBUTES.get(target.attr)
                    if known is None and isinstance(sub, ast.AnnAssign):
                        known = ast.get_source_segment(self.source, sub.annotation)
                    self.attributes.setdefault(target.attr, known or "Any")

    def _retype_self(self, node: ast.FunctionDef | ast.AsyncFunctionDef, text: str, mixin: Mixin) -> str:
        """``-> ...["Store"]`` on a method leaving Store: take a self-type bound to its mixin instead."""
        returns = ast.get_source_segment(self.source, node.returns) if node.returns is not None else None
        if not returns or '"Store"' not in returns:
            return text
        start = text.index(f"def {node.name}(")
        end = text.index(":\n", text.index(")", start))  # the signature ends at the colon before the body
        signature = text[start:end]
        new = signature.replace(f"def {node.name}(self", f"def {node.name}(self: _S", 1).replace('"Store"', "_S")
        module = self.modules[mixin.module]
        if mixin.name not in module.typevars:
            module.typevars.append(mixin.name)
        self.retyped.append(f"Store.{node.name} -> {mixin.name}: self-type _S")
        return text[:start] + new + text[end:]

    # ------------------------------------------------------------------ writing
    def _import_lines(self, module: str, uses: set[str], local: set[str], typing_extra: set[str]) -> tuple[list[str], list[str]]:
        """``(runtime import lines, TYPE_CHECKING import lines)`` for the names ``module`` uses."""
        wanted = {n for n in uses - local if n in self.imports}
        lines: list[str] = []
        previous: ast.stmt | None = None
        for stmt in self.import_order:
            names = [a for a in stmt.names if (a.asname or a.name.split(".")[0]) in wanted]
            extra = sorted(typing_extra) if isinstance(stmt, ast.ImportFrom) and stmt.module == "typing" else []
            if not names and not extra:
                continue
            if previous is not None and lines and self._gap(previous, stmt):
                lines.append("")  # the original's blank line between import groups
            previous = stmt
            if isinstance(stmt, ast.Import):
                lines += [f"import {a.name}" + (f" as {a.asname}" if a.asname else "") for a in names]
                continue
            parts = sorted({a.name + (f" as {a.asname}" if a.asname else "") for a in names} | set(extra), key=_isort_key)
            lines.append(f"from {'.' * (stmt.level + 1) if stmt.level else ''}{stmt.module or ''} import {', '.join(parts)}")
        if typing_extra and not any(isinstance(s, ast.ImportFrom) and s.module == "typing" for s in self.import_order):
            lines.insert(0, f"from typing import {', '.join(sorted(typing_extra))}")
        sibling: dict[str, list[str]] = {}
        for name in sorted(uses - local - wanted):
            home = self.placed.get(name)
            if home is not None and home != module:
                sibling.setdefault(home, []).append(name)
        runtime, checking = [], []
        for home in MODULES:  # a fixed order: deterministic output
            if home in sibling:
                line = f"from .{home} import {', '.join(sorted(sibling[home], key=_isort_key))}"
                (checking if home == "core" else runtime).append(line)
        return lines + ([""] if lines and runtime else []) + runtime, checking

    def _gap(self, before: ast.stmt, after: ast.stmt) -> bool:
        between = self.lines[(before.end_lineno or before.lineno) : after.lineno - 1]
        return any(not line.strip() for line in between)

    def render(self, module: str) -> str | None:
        mod = self.modules[module]
        mixins = [m for m in self.mixins.values() if m.module == module and m.name in self.emitted and module != "core"]
        if not mod.pieces and not mixins and module != "core":
            return None
        local = {p.name for p in mod.pieces} | {m.name for m in mixins} | {"_S"}
        uses = set().union(*(p.uses for p in mod.pieces)) | mod.extra_uses
        typing_extra: set[str] = set()
        body: list[str] = [p.text for p in mod.pieces]
        for m in mixins:
            if m.base:
                uses.add(m.base)
            head = [f"class {m.name}{'(' + m.base + ')' if m.base else ''}:", f'    """{m.doc}', "", "    Mixed into :class:`~ror_annotate.store.Store`.", '    """', ""]
            if m.name == BASE_MIXIN:
                head += ["    # set by Store.__init__"] + [f"    {a}: {t}" for a, t in self.attributes.items()] + [""]
                for t in self.attributes.values():
                    uses |= {n.id for n in ast.walk(ast.parse(t, mode="eval")) if isinstance(n, ast.Name)}
            if m.name in mod.typevars:
                body.append(f'_S = TypeVar("_S", bound="{m.name}")\n')
                typing_extra.add("TypeVar")
            body.append("\n".join(head) + "\n" + "\n".join(m.members))
        if module == "core":
            bases = [m.name for m in self.mixins.values() if m.members and m.module not in ("connection", "access")]
            uses |= set(bases) | self.store_uses
            body.append(f"class Store({', '.join(bases)}):\n" + self.store_doc + "\n" + "\n".join(self.store_members))
        runtime, checking = self._import_lines(module, uses, local, typing_extra)
        if checking:
            runtime, checking = self._import_lines(module, uses, local, typing_extra | {"TYPE_CHECKING"})
        out = [f'"""{MODULES[module]}\n\nGenerated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.\n"""', "",
               "from __future__ import annotations", ""]
        out += runtime + [""] if runtime else []
        if checking:
            out += ["if TYPE_CHECKING:"] + [f"    {line}" for line in checking] + [""]
        text = "\n".join(out) + "\n\n" + "\n\n".join(body)
        return re.sub(r"\n{4,}", "\n\n\n", text).rstrip() + "\n"

    def render_init(self, written: list[str]) -> str:
        public: dict[str, list[str]] = {}
        for name, module in self.placed.items():
            if not name.startswith("_") and module in written and not name.endswith("Mixin"):
                public.setdefault(module, []).append(name)
        # names store.py imported from the package (scrub_url, Trace, StoreError, ...): importable from here as before
        again: dict[str, list[str]] = {}
        for bound, (stmt, _alias) in self.imports.items():
            if isinstance(stmt, ast.ImportFrom) and stmt.level and not bound.startswith("_"):
                again.setdefault(f"{'.' * (stmt.level + 1)}{stmt.module or ''}", []).append(bound)
        layout = "\n".join(f"* ``{m}``: {MODULES[m]}" for m in MODULES if m in written)
        lines = [f'"""{self.doc.rstrip()}\n\nThe package (generated from ``store.py`` by ``scripts/split_store.py``):\n\n{layout}\n"""', "",
                 "from __future__ import annotations", ""]
        for source in sorted(again):
            lines.append(f"from {source} import {', '.join(sorted(again[source], key=_isort_key))}")
        lines.append("")
        for module in MODULES:
            if module in public:
                lines.append(f"from .{module} import {', '.join(sorted(public[module], key=_isort_key))}")
        names = sorted({n for v in public.values() for n in v} | {n for v in again.values() for n in v})
        lines += ["", "__all__ = [", *[f'    "{n}",' for n in names], "]", ""]
        return "\n".join(lines)

    def split(self) -> dict[str, str]:
        self.read()
        files: dict[str, str] = {}
        for module in MODULES:
            text = self.render(module)
            if text is not None:
                files[f"{module}.py"] = text
        files["__init__.py"] = self.render_init([f[:-3] for f in files])
        for name, text in files.items():
            compile(text, f"store/{name}", "exec")  # a syntax error here is a bug of this script
        return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="repository root")
    parser.add_argument("--replace", action="store_true", help="regenerate an existing store/ package from store.py")
    args = parser.parse_args(argv)
    source = args.root / PACKAGE / "store.py"
    target = args.root / PACKAGE / "store"
    if not source.is_file():
        if (target / "__init__.py").is_file():
            print(f"{target} is already a package and there is no {source.name}: nothing to do")
            return 0
        print(f"error: no {source}", file=sys.stderr)
        return 1
    if target.exists() and not args.replace:
        print(f"error: both {source} and {target}/ exist (a merge put store.py back?); pass --replace to regenerate "
              f"{target}/ from {source.name}", file=sys.stderr)
        return 1
    try:
        splitter = Splitter(source.read_text(encoding="utf-8"))
        files = splitter.split()
    except (SplitError, SyntaxError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    target.mkdir(exist_ok=True)
    for old in sorted(target.glob("*.py")):
        if old.name not in files:
            old.unlink()
    for name, text in files.items():
        (target / name).write_text(text, encoding="utf-8")
    source.unlink()
    for m in MIXINS:
        got = splitter.mixins[m.name].members
        if got:
            print(f"store/{m.module}.py: {m.name} ({len(got)} methods)")
    print(f"wrote {len(files)} modules into {target}; removed {source.name}")
    for line in splitter.retyped:
        print(f"retyped: {line}")
    for line in splitter.unmapped:
        print(f"NOT IN THE MAPPING: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
