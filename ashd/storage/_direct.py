"""Prebuilt Core statements run without SQLAlchemy's per-execution work, on SQLite.

A hot transaction (a session's transition, a turn's first write) is a few statements built once as
Core. Executed through a SQLAlchemy connection, each costs 60-100 us of Python around 10-30 us of
SQLite (compile-cache lookup, parameter and result processing, events, an ORM session around them):
a transition took 240 us in process, 45 us on the driver (docs/performance.md, sixth pass). Here each
statement is compiled once for SQLite, and then runs on the pysqlite connection with the same type
conversions SQLAlchemy would apply (its own bind and result processors, looked up once). On
PostgreSQL the same transaction function runs on the asyncpg connection (`PgStatements`), each
statement compiled once for asyncpg; `CoreStatements` runs it through a SQLAlchemy connection where
neither driver connection is at hand. Each statement has one definition.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Connection, Table
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.schema import CallableColumnDefault, ScalarElementColumnDefault
from sqlalchemy.util import await_only

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

    @property
    def combines_writes(self) -> bool:
        """Whether the function should write with one statement where it can (PostgreSQL's
        data-modifying CTEs): it runs outside a transaction then (`Database.run_direct`'s
        `one_write`), so it must not write with a second one."""
        ...


class CoreStatements:
    """Through a SQLAlchemy connection: PostgreSQL, or SQLite where no direct connection is at hand."""

    combines_writes = False

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


def _compile(statement: ClauseElement, keys: tuple[str, ...], dialect: Dialect = _DIALECT) -> _Compiled:
    """`statement` for `dialect`; a positional dialect's binds in the order its placeholders number them."""
    compiled = cast(SQLCompiler, statement.compile(dialect=dialect, column_keys=list(keys)))
    if getattr(compiled, "insert_prefetch", None) or getattr(compiled, "update_prefetch", None):
        # A column default computed in Python would be silently left out here: pass every value.
        raise ValueError(f"statement needs Python-side column defaults; give them: {compiled}")
    if getattr(compiled, "escaped_bind_names", None) or "POSTCOMPILE" in compiled.string:
        raise ValueError(f"statement needs per-execution rendering (IN lists, odd bind names): {compiled}")
    names = list(compiled.positiontup or ()) if dialect.positional else list(compiled.binds)
    binds = [(name, compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)) for name in names]
    exported = getattr(statement, "exported_columns", None) or ()
    columns = [(col.key, col.type.dialect_impl(dialect).result_processor(dialect, None)) for col in exported]
    defaults = {name: bp.value for name, bp in compiled.binds.items() if not bp.required}
    return _Compiled(compiled.string, defaults, binds, columns)


def _bound(compiled: _Compiled, params: Mapping[str, Any]) -> list[Any]:
    """The values of `compiled`'s binds in its order, each through its type's bind processor."""
    values: list[Any] = []
    for name, process in compiled.binds:
        value = params[name] if name in params else compiled.defaults[name]  # KeyError: a value missing
        values.append(process(value) if process is not None and value is not None else value)
    return values


def _row(compiled: _Compiled, raw_row: Sequence[Any]) -> Row:
    return {key: (process(value) if process is not None else value)
            for (key, process), value in zip(compiled.columns, raw_row, strict=True)}


class _CompiledCache:
    """Compiled forms per statement object and set of keys. Statements are module-level, built once;
    each entry keeps its statement, so the id it is found by stays that statement's."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._entries: dict[tuple[int, tuple[str, ...]], tuple[ClauseElement, _Compiled]] = {}

    def get(self, statement: ClauseElement, keys: tuple[str, ...]) -> _Compiled:
        entry = self._entries.get((id(statement), keys))
        if entry is None or entry[0] is not statement:
            entry = (statement, _compile(statement, keys, self.dialect))
            self._entries[(id(statement), keys)] = entry
        return entry[1]


class SqliteStatements:
    """On a pysqlite connection inside a transaction its owner began."""

    _cache = _CompiledCache(_DIALECT)
    combines_writes = False

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._raw = raw

    @staticmethod
    def _values(compiled: _Compiled, params: Mapping[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, process in compiled.binds:
            value = params[name] if name in params else compiled.defaults[name]  # KeyError: a value missing
            values[name] = process(value) if process is not None and value is not None else value
        return values

    def _execute(self, statement: ClauseElement, params: Mapping[str, Any]) -> tuple[sqlite3.Cursor, _Compiled]:
        compiled = self._cache.get(statement, tuple(sorted(params)))
        return self._raw.execute(compiled.sql, self._values(compiled, params)), compiled

    def rows(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Row]:
        cursor, compiled = self._execute(statement, params)
        return [_row(compiled, raw_row) for raw_row in cursor.fetchall()]

    def run(self, statement: ClauseElement, params: Mapping[str, Any]) -> None:
        self._execute(statement, params)[0].close()

    def run_many(self, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        compiled = self._cache.get(statement, _same_keys(rows))
        self._raw.executemany(compiled.sql, [self._values(compiled, row) for row in rows]).close()


class PgStatements:
    """On an asyncpg connection, from code running in a greenlet of SQLAlchemy's (`greenlet_spawn`):
    each statement waits for its result there, as SQLAlchemy's own asyncpg adapter does, without
    the compile-cache lookup, ORM session, events and parameter handling around it (a pause's
    transaction on PostgreSQL: docs/performance.md, thirty-first pass). asyncpg prepares each SQL
    text once per connection (its statement cache), so a statement is one round trip after that."""

    _cache = _CompiledCache(PGDialect_asyncpg())  # type: ignore[no-untyped-call]

    def __init__(self, raw: Any, *, combines_writes: bool = False) -> None:  # an asyncpg.Connection
        self._raw = raw
        self.combines_writes = combines_writes

    def rows(self, statement: ClauseElement, params: Mapping[str, Any]) -> list[Row]:
        compiled = self._cache.get(statement, tuple(sorted(params)))
        records = await_only(self._raw.fetch(compiled.sql, *_bound(compiled, params)))
        return [_row(compiled, record) for record in records]

    def run(self, statement: ClauseElement, params: Mapping[str, Any]) -> None:
        compiled = self._cache.get(statement, tuple(sorted(params)))
        await_only(self._raw.execute(compiled.sql, *_bound(compiled, params)))

    def run_many(self, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        compiled = self._cache.get(statement, _same_keys(rows))
        await_only(self._raw.executemany(compiled.sql, [_bound(compiled, row) for row in rows]))
