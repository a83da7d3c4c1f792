"""Prebuilt Core statements run without SQLAlchemy's per-execution work, on SQLite.

A hot transaction (a session's transition, a turn's first write) is a few statements built once as
Core. Executed through a SQLAlchemy connection, each costs 60-100 us of Python around 10-30 us of
SQLite (compile-cache lookup, parameter and result processing, events, an ORM session around them):
a transition took 240 us in process, 45 us on the driver (docs/performance.md, sixth pass). Here each
statement is compiled once for SQLite, and then runs on the pysqlite connection with the same type
conversions SQLAlchemy would apply (its own bind and result processors, looked up once). The same
transaction function runs unchanged on PostgreSQL through `CoreStatements`, so each statement has
one definition.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Connection, Table
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.schema import CallableColumnDefault, ScalarElementColumnDefault

Row = dict[str, Any]


class Statements(Protocol):
    """What a transaction function runs its statements through."""

    def rows(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Row]:
        """The rows `statement` returns (its SELECT columns or RETURNING), as dicts by column key."""
        ...

    def run(self, statement: ClauseElement, params: Mapping[str, Any]) -> None:
        """Execute `statement`; what it returns is not read."""
        ...

    def run_many(self, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute `statement` once per row of `rows` (each with the same keys), as one batch of
        the driver's: one round trip on PostgreSQL, not one per row."""
        ...


class CoreStatements:
    """Through a SQLAlchemy connection: PostgreSQL, or SQLite where no direct connection is at hand."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def rows(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Row]:
        return [dict(m) for m in self._conn.execute(statement, dict(params)).mappings()]  # type: ignore[call-overload]

    def run(self, statement: ClauseElement, params: Mapping[str, Any]) -> None:
        self._conn.execute(statement, dict(params))  # type: ignore[call-overload]

    def run_many(self, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            _same_keys(rows)
            self._conn.execute(statement, [dict(r) for r in rows])  # type: ignore[call-overload]


def _same_keys(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The keys every row of a `run_many` has (one compiled statement binds one set of keys)."""
    first = rows[0].keys()
    for row in rows:
        if row.keys() != first:  # a set comparison: no sort per row on a path every turn takes
            raise ValueError(f"run_many: every row needs the keys {tuple(sorted(first))}")
    return tuple(sorted(first))


def with_defaults(table: Table, values: Mapping[str, Any]) -> Row:
    """`values` with each missing column's Python-side default (a constant, or a function called now)
    filled in, and None for a nullable column with none: the row a Core insert or an ORM flush would
    store. The driver path needs every value given."""
    out = dict(values)
    for column in table.columns:
        default = column.default
        if column.key in out:
            continue
        if default is None:
            if column.nullable and column.server_default is None:
                out[column.key] = None
        elif isinstance(default, ScalarElementColumnDefault):
            out[column.key] = default.arg
        elif isinstance(default, CallableColumnDefault):
            out[column.key] = default.arg(None)  # type: ignore[arg-type] # our defaults take no context
    return out


_DIALECT = SQLiteDialect_pysqlite(paramstyle="named")
Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class _Compiled:
    sql: str
    defaults: Mapping[str, Any]  # bound values the statement carries itself (literals)
    binds: Sequence[tuple[str, Processor | None]]
    columns: Sequence[tuple[str, Processor | None]]


def _compile(statement: ClauseElement, keys: tuple[str, ...]) -> _Compiled:
    compiled = cast(SQLCompiler, statement.compile(dialect=_DIALECT, column_keys=list(keys)))
    if getattr(compiled, "insert_prefetch", None) or getattr(compiled, "update_prefetch", None):
        # A column default computed in Python would be silently left out here: pass every value.
        raise ValueError(f"statement needs Python-side column defaults; give them: {compiled}")
    if getattr(compiled, "escaped_bind_names", None) or "POSTCOMPILE" in compiled.string:
        raise ValueError(f"statement needs per-execution rendering (IN lists, odd bind names): {compiled}")
    binds = [(name, bp.type.dialect_impl(_DIALECT).bind_processor(_DIALECT)) for name, bp in compiled.binds.items()]
    exported = getattr(statement, "exported_columns", None) or ()
    columns = [(col.key, col.type.dialect_impl(_DIALECT).result_processor(_DIALECT, None)) for col in exported]
    defaults = {name: bp.value for name, bp in compiled.binds.items() if not bp.required}
    return _Compiled(compiled.string, defaults, binds, columns)


class SqliteStatements:
    """On a pysqlite connection inside a transaction its owner began; compiled forms are cached on
    the class (statements are module-level, built once)."""

    _cache: dict[tuple[int, tuple[str, ...]], tuple[ClauseElement, _Compiled]] = {}

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw

    def _compiled(self, statement: ClauseElement, keys: tuple[str, ...]) -> _Compiled:
        entry = self._cache.get((id(statement), keys))
        if entry is None or entry[0] is not statement:
            entry = (statement, _compile(statement, keys))
            self._cache[(id(statement), keys)] = entry  # the statement is kept: its id stays its own
        return entry[1]

    @staticmethod
    def _values(compiled: _Compiled, params: Mapping[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, process in compiled.binds:
            value = params[name] if name in params else compiled.defaults[name]  # KeyError: a value missing
            values[name] = process(value) if process is not None and value is not None else value
        return values

    def _execute(self, statement: ClauseElement, params: Mapping[str, Any]) -> tuple[sqlite3.Cursor, _Compiled]:
        compiled = self._compiled(statement, tuple(sorted(params)))
        return self._raw.execute(compiled.sql, self._values(compiled, params)), compiled

    def rows(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Row]:
        cursor, compiled = self._execute(statement, params)
        out = []
        for raw_row in cursor.fetchall():
            out.append({key: (process(value) if process is not None else value)
                        for (key, process), value in zip(compiled.columns, raw_row, strict=True)})
        return out

    def run(self, statement: ClauseElement, params: Mapping[str, Any]) -> None:
        self._execute(statement, params)[0].close()

    def run_many(self, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        compiled = self._compiled(statement, _same_keys(rows))
        self._raw.executemany(compiled.sql, [self._values(compiled, row) for row in rows]).close()
