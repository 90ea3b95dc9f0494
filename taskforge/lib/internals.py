"""Every place TaskForge leans on a dependency's private or undocumented behaviour.

Each lean is one small function here, so an upgrade that changes what it
relies on breaks in one module.  `taskforge/tests/test_internals.py` checks
every assumption below against the installed versions and fails with a
message naming this module.  Figures: `make test ARGS="bench/internals.py -s"`
(medians of 9 interleaved rounds, one core of the development machine); the
bar for keeping a lean for speed is ~50 us per request (2 % of a ~3 ms one).

prometheus_client: `values.ValueClass` (count_in_files, count_in_memory)
    What: replace the module attribute every metric reads when it creates a
    value.  Undocumented; MultiProcessValue's own docstring calls a custom
    process_identifier "at your own risk".
    Why: correctness, not speed.  In multiprocess mode the files are named
    host-pid, not pid, so containers sharing the directory (each its own pid
    1) never write the same file; a set but empty PROMETHEUS_MULTIPROC_DIR
    counts in memory instead of writing files into the working directory.
    Cost: none measurable: 0.80 against 0.74 us per counter inc with pid
    names in one run, 2.1 against 3.0 us in a noisier one (in memory: 0.24
    to 0.59 us); a request makes about a dozen increments.
    Guard: ValueClass, MutexValue and MultiProcessValue(process_identifier)
    exist, metrics made after the swap use the new class, and the files
    carry the identifier in their names.

psycopg: timestamptz with psycopg's C loader (load_timestamptz_in_c)
    What: register psycopg's own loader on one Django cursor in place of
    Django's Python subclass, relying on psycopg mapping the session time
    zone "UTC" (which Django sets) to `datetime.timezone.utc`, the tzinfo
    Django's loader pins, and on a Django cursor's `.cursor` being psycopg's.
    Saves: 2.6 us against 0.13 us per value (loader alone); 23.4 ms against
    1.8 ms to fetch 1000 rows of 8 (2.7 us a value).  A task row carries 8,
    so ~22 us per task moved: under the bar for a one-task claim or ack,
    over it from three tasks a request (the SDK's runtime claims as many as
    it has free slots, up to 100): ~0.2 ms for a claim of 10, ~21 ms for a
    batch enqueue of 1000.  A second run: 2.5/0.13 us, 22.8/2.2 ms.  Kept.
    Guard: the loader is psycopg's C one, and loads timestamps of the test
    Postgres exactly as Django's loader does, tzinfo included.

psycopg and Django: prepared hot statements (prepared_cursor)
    What: a Django cursor wrapper (`BaseDatabaseWrapper._prepare_cursor`,
    private) over a server-binding psycopg cursor that passes `prepare=True`
    on every execute, and a `prepare_threshold` set on connections where
    Django left it None (psycopg then ignores `prepare=True`).  Django's own
    cursors bind client side and never prepare.
    Saves: Postgres plans each `tasks.sql` statement once per connection
    instead of on every call.  Measured with pg_stat_statements during
    `make bench`'s e2e phases (batched calls included): planning took 0.47 ms
    an ack statement, 0.39 ms a hand-out and 0.12 ms a create, about 1 ms
    per task on the single path.  `bench/pg_cost.py`, 3 interleaved runs:
    single path 2.01 -> 1.21 ms of Postgres CPU per task, enqueue alone
    0.55 -> 0.38 ms; `make bench`'s e2e single 2.55 -> 2.02 ms (4 runs).
    Guard: the wrapper is Django's (errors translated to django.db's), the
    statement is prepared on the connection, and a second run reuses it.
    With DATABASE_PREPARED_STATEMENTS off (a transaction pooler) the same
    wrapper runs the statements unnamed: 1.23 against 1.71 ms of Postgres CPU
    per task on the single path (`bench/pg_cost.py`, 7 interleaved pairs).

Django: model instances from raw rows (instances_from_rows)
    What: `Model.from_db` plus the fields' converters, with the column layout
    worked out once per column list, instead of `Model.objects.raw`; relies
    on `from_db`'s signature and on converters of `get_col()` expressions.
    Saves: the per-query setup of `raw`, 60-70 us whatever the row count
    (query, fetch and build: 224 against 164 us for 1 row, 476 against 412
    us for 10, 3079 against 3023 us for 100; a second run: 191/128,
    435/362, 3339/2732); once per claim, ack and enqueue.  Kept, just
    over the bar.
    Guard: builds the same instances as `raw` for real rows, deferred fields
    and extra columns included.

psycopg_pool: a reset set on a pool already made (reset_returned_connections)
    What: set `ConnectionPool._reset`, the callable the pool runs on every
    connection given back, after Django made the pool (Django passes the
    constructor the settings' OPTIONS["pool"], once).  Private; read by
    `_putconn` at every return.
    Why: speed.  A pool with a reset never gives a connection back in the
    returning thread: it queues the return for its worker thread to run the
    reset (a thread hand-off per request, and the connection is not in the
    pool until the worker ran).  Only a loop made inside a pooled process
    (the tests make many) needs one (taskforge.lib.listen), so the pool gets
    its reset from the first Listener that listens on one of its connections,
    and the API's pool never has one.  Measured with the reset in the
    settings, py-spy during `make bench`'s e2e single: the return and the
    worker came to ~6 % of the API processes' Python time.
    Guard: a reset set so runs on the connections given back.

prometheus_client: a histogram's observations in one write a bucket (observe_many, observe)
    What: what `observe(amount)` does for each of many amounts, from a child's
    `_sum`, `_buckets` and `_upper_bounds` (private): the sum incremented by
    the amounts' total, and each bucket (non-cumulative inside the child: an
    amount counts in the first bucket whose bound it does not exceed) by its
    count.
    Why: speed.  An ack batch of 100 observed 100 claim-to-ack durations, two
    value writes each (a lock, the fork check and an mmap write each time,
    ~2.4 us an observation in multiprocess mode); now one write for the sum
    and one per bucket hit.  `observe` is the one-amount form: its bucket
    found by bisection, where `observe()` compares the amount with each
    bound in turn (a request size in django-prometheus's 32 byte buckets:
    5.8 against 3.4 us).
    Guard: the same bucket counts and sum as `observe()` one by one, in memory
    and in multiprocess files.

Django: a foreign key's object set through its field's cache (cache_related)
    What: `field.set_cached_value(instance, value)` (FieldCacheMixin,
    undocumented) instead of `instance.<fk> = value`, for an instance that
    already holds the value's id in its `<fk>_id`.
    Why: speed.  The descriptor checks the value's class and the database
    router and sets the id again: 1.43 against 0.19 us; transitions set the
    queue of every task they build, three times over a task's life, 100 or
    1000 a batch.
    Guard: `instance.<fk>` then reads the object without a query, the id
    unchanged.

opentelemetry-exporter-otlp-proto-http: sending bytes already encoded (otlp_export)
    What: `OTLPSpanExporter._client.export(data)`, the exporter's private HTTP
    client (endpoint, headers, compression, TLS and retries, all from the
    OTEL_EXPORTER_OTLP_* variables), given an ExportTraceServiceRequest that
    `taskforge.lib.otlp` wrote, instead of `export(spans)` with SDK spans.
    Why: speed.  The SDK's route made a `ReadableSpan` per task and encoded it
    through protobuf message objects; with three spans a task the batched path
    ran at ~0.7x of tracing off (bench/run.py's `tracing` rows); written
    by hand and sent here it stays within the target (>= 0.85x; the figures in
    docs/operations.md, Performance).
    Guard: the client exists with `export(bytes)`, and a receiver decodes what
    it sent as the spans written (taskforge/tests/test_internals.py).

Dropped: `logging._srcfile = None` (records skip the caller lookup).  It
saved 1 us a record (8.11 against 7.16 us, JSON formatter included; 10.1
against 8.9 in a second run); a request writes two or three records, so
~3 us (0.1 %).  Records now carry their caller's file and line again; the
JSON lines do not print them.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init
from prometheus_client import values
from psycopg.pq import Format

M = TypeVar("M", bound=Model)

# --- prometheus_client: the class every metric value is made of ------------------


def count_in_files(process_identifier: Callable[[], str]) -> None:
    """Metric values live in per-process files named by `process_identifier()`."""
    values.ValueClass = values.MultiProcessValue(process_identifier)


def count_in_memory() -> None:
    """Metric values live in this process's memory, whatever the environment says."""
    values.ValueClass = values.MutexValue


def observe(child: Any, amount: float) -> None:
    """`child.observe(amount)` (a histogram's child, no exemplars)."""
    child._sum.inc(amount)
    if amount == amount:  # NaN is in no bucket, as observe() counts it
        child._buckets[bisect.bisect_left(child._upper_bounds, amount)].inc(1)


def observe_many(child: Any, amounts: Sequence[float]) -> None:
    """`child.observe(amount)` for each amount (a histogram's child, no exemplars)."""
    if not amounts:
        return
    child._raise_if_not_observable()
    bounds = child._upper_bounds
    counts = [0] * len(bounds)
    total = 0.0
    for amount in amounts:
        total += amount
        if amount == amount:  # NaN is in no bucket, as observe() counts it
            counts[bisect.bisect_left(bounds, amount)] += 1
    child._sum.inc(total)
    for index, count in enumerate(counts):
        if count:
            child._buckets[index].inc(count)


# --- psycopg: timestamptz values loaded in C -----------------------------------------

TIMESTAMPTZ_OID = 1184
# psycopg's own loader: its C version when psycopg[binary] or [c] is installed.
TIMESTAMPTZ_LOADER = psycopg.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)


def load_timestamptz_in_c(cursor: Any) -> None:
    """This Django cursor loads timestamptz with psycopg's loader, not Django's."""
    cursor.cursor.adapters.register_loader("timestamptz", TIMESTAMPTZ_LOADER)


# --- psycopg and Django: a cursor whose statements Postgres plans once -------------

# The connection's threshold for automatic preparation, set where Django left
# it None (prepared statements off).  Django's own cursors bind parameters
# client side and never reach it; only `prepared_cursor` prepares, explicitly.
NEVER_AUTOMATICALLY = 2**31 - 1


class _PreparingCursor(psycopg.Cursor[Any]):
    """Server-side binding, and every statement it runs is prepared on the connection."""

    def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: Any = None
    ) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)


def prepared_cursor(connection: Any, *, prepare: bool = True) -> Any:
    """A Django cursor wrapper (errors translated, queries logged under DEBUG) over a
    psycopg cursor that binds parameters server side and prepares each statement
    (a named prepared statement per connection: parsed and planned once, not per call).

    With `prepare` False the statements go unnamed instead (parsed and planned on
    every call), which any pooler in transaction mode passes through.

    Leans on `BaseDatabaseWrapper._prepare_cursor` (what `connection.cursor()`
    does after creating its cursor) and on psycopg honouring `prepare=True` only
    when the connection's `prepare_threshold` is not None.
    """
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        cursor_class = _PreparingCursor if prepare else psycopg.Cursor
        raw = cursor_class(connection.connection)
        loader: Any = TIMESTAMPTZ_LOADER
        raw.adapters.register_loader("timestamptz", loader)
        if prepare and connection.connection.prepare_threshold is None:
            connection.connection.prepare_threshold = NEVER_AUTOMATICALLY
        return connection._prepare_cursor(raw)


# --- Django: a foreign key's object set through its field's cache ----------------------


def cache_related(field: Any, instance: Model, value: Model) -> None:
    """`instance.<field> = value`, for an instance whose `<field>_id` is already value's id."""
    field.set_cached_value(instance, value)


# --- psycopg_pool: a reset for a pool already made ------------------------------------


def reset_returned_connections(pool: Any, reset: Callable[[Any], None]) -> None:
    """From now on `pool` runs `reset` on each connection given back (in its worker)."""
    pool._reset = reset


# --- Django: model instances from raw rows ------------------------------------------


def instances_from_rows(
    model: type[M],
    names: Sequence[str],
    rows: Iterable[Sequence[Any]],
    using: str = DEFAULT_DB_ALIAS,
) -> list[M]:
    """`model` instances from cursor rows, as `model.objects.raw()` builds them.

    `names` are the rows' column names.  Columns of the model's fields are
    converted by the fields (`from_db_value`), fields without a column are
    deferred, and every other column is set as an attribute of that name.
    """
    attnames, positions, converters, extras = _row_layout(model, tuple(names), using)
    connection = connections[using]
    build = builder(model, attnames, using)
    instances = []
    for row in rows:
        row_values = [row[i] for i in positions]
        for k, convert, expression in converters:
            row_values[k] = convert(row_values[k], expression, connection)
        instance = build(row_values)
        for name, i in extras:
            setattr(instance, name, row[i])
        instances.append(instance)
    return instances


def builder(
    model: type[M], attnames: list[str], using: str = DEFAULT_DB_ALIAS
) -> Callable[[list[Any]], M]:
    """A function of a row's values (in `attnames` order, as the database gives
    them: converted) to what `model.from_db(using, attnames, values)` builds."""
    listened = pre_init.has_listeners(model) or post_init.has_listeners(model)
    if _plain_fields(model) and not listened:
        return _builder(model, attnames, using)
    return functools.partial(model.from_db, using, attnames)


def _builder(model: type[M], attnames: list[str], using: str) -> Callable[[list[Any]], M]:
    """What `model.from_db(using, attnames, values)` builds, for half its CPU.

    `Model.__init__` sets each value through its field's class attribute and
    sends pre_init and post_init; when every field's attribute is Django's
    plain DeferredAttribute (whose setting is a `__dict__` entry; a foreign
    key's also drops a cached related object, which a new instance has not)
    and nothing listens to those signals, the values go into `__dict__`
    directly.  ~5.3 us a Task of 19 columns, against ~2.4 (measured); a hand-
    out or an ack builds one per task.  Fields missing from `attnames` stay
    deferred, as from_db leaves them.  Guarded by
    taskforge/tests/test_internals.py (what raw() builds, attribute for attribute).
    """
    new = model.__new__

    def build(values: list[Any]) -> M:
        instance = new(model)
        instance.__dict__.update(zip(attnames, values, strict=True))
        instance._state = state = ModelState()
        state.adding = False
        state.db = using
        return instance

    return build


@functools.lru_cache(maxsize=64)
def _plain_fields(model: type[Model]) -> bool:
    """Every concrete field's class attribute is Django's plain DeferredAttribute."""
    plain = (DeferredAttribute, ForeignKeyDeferredAttribute)
    return all(
        type(model.__dict__.get(field.attname)) in plain for field in model._meta.concrete_fields
    )


@functools.lru_cache(maxsize=64)
def _row_layout(
    model: type[Model], names: tuple[str, ...], using: str
) -> tuple[list[str], list[int], list[tuple[int, Any, Any]], list[tuple[str, int]]]:
    """For rows with these columns: the attnames of the fields present, the row
    index of each, their converters (with the column they convert), and the
    extra columns.  Worked out once per model and column list."""
    index = {name: i for i, name in enumerate(names)}
    meta = model._meta
    placed = [
        (field, index[field.column])
        for field in meta.concrete_fields
        if field.column is not None and field.column in index
    ]
    fields = [field for field, _ in placed]
    if meta.pk.column not in index:
        raise ValueError(f"rows of {meta.label} need its primary key column {meta.pk.column!r}")
    connection = connections[using]
    converters = []
    for k, field in enumerate(fields):
        column = field.get_col(meta.db_table)
        for convert in [
            *connection.ops.get_db_converters(column),
            *column.get_db_converters(connection),
        ]:
            converters.append((k, convert, column))
    known = {field.column for field in fields}
    extras = [(name, i) for name, i in index.items() if name not in known]
    return (
        [field.attname for field in fields],
        [position for _, position in placed],
        converters,
        extras,
    )


# --- opentelemetry-exporter-otlp-proto-http: an encoded request sent ------------------


def otlp_export(exporter: Any, data: bytes) -> bool:
    """Send an ExportTraceServiceRequest's bytes with an OTLPSpanExporter's own client
    (its endpoint, headers, compression, TLS and retries); True when it was taken."""
    result = exporter._client.export(data)
    return bool(result.success)
