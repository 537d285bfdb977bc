"""What one pipelined transaction costs the client, by the way it is sent (``python -m benchmarks.round_trip_client``;
figures in benchmarks/README.md, issue 23).

A transaction like a handling's: BEGIN, three INSERTs, an UPDATE, a SELECT whose answer is read, COMMIT, in one round
trip, 1,000 times each way, alternated three times, on a temporary table:

* ``cursors``: psycopg's pipeline mode through its cursors, as ``store/sql.py`` sends it (cursors kept, prepared).
* ``libpq``: libpq's own pipeline through ``psycopg.pq``, the same statements prepared once, parameters dumped and
  the row loaded by psycopg's ``Transformer``, no cursor; sent and read through psycopg's generators
  (``pipeline_communicate``, then ``fetch`` up to the sync) and its ``Connection.wait``, which lets the GIL go while
  it waits, as a worker with other threads needs. An error comes back as psycopg's exception
  (``errors.error_from_result``). Measured first as a sketch; ``store/sql.py``'s ``_round_trip`` now sends this way.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
from psycopg import errors, generators, pq
from psycopg.adapt import PyFormat, Transformer
from sqlalchemy import make_url

from benchmarks.common import PG_ADMIN

INSERT = "INSERT INTO rt (k, v, n) VALUES (%(k)s, %(v)s::jsonb, %(n)s)"
UPDATE = "UPDATE rt_u SET n = n + 1 WHERE k = %(k)s AND n >= %(n)s"
SELECT = "SELECT n FROM rt_u WHERE k = %(k)s"
PREPARED = {INSERT: (b"rt_ins", b"INSERT INTO rt (k, v, n) VALUES ($1, $2::jsonb, $3::int)", ("k", "v", "n")),
            UPDATE: (b"rt_upd", b"UPDATE rt_u SET n = n + 1 WHERE k = $1 AND n >= $2::int", ("k", "n")),
            SELECT: (b"rt_sel", b"SELECT n FROM rt_u WHERE k = $1", ("k",))}


def statements(i: int) -> list[tuple[str, dict[str, Any] | None]]:
    inserts = [(INSERT, {"k": k, "v": f'{{"{k}": 1}}', "n": i}) for k in "xyz"]
    return [("BEGIN", None), *inserts, (UPDATE, {"k": "a", "n": 0}), (SELECT, {"k": "a"}), ("COMMIT", None)]


def senders(conn: psycopg.Connection[Any]) -> dict[str, Callable[[int], object]]:
    shared, reading = conn.cursor(), conn.cursor()
    pg, tx = conn.pgconn, Transformer(conn)
    for name, text, _ in PREPARED.values():
        pg.prepare(name, text)

    def cursors(i: int) -> object:
        with conn.pipeline():
            for text, params in statements(i):
                (reading if text is SELECT else shared).execute(text, params, prepare=params is not None)
        return reading.fetchall()

    def libpq(i: int) -> object:
        commands: deque[Callable[[], object]] = deque()
        for text, params in statements(i):
            if params is None:
                commands.append(partial(pg.send_query_params, text.encode(), None))
                continue
            name, _, order = PREPARED[text]
            values = [params[k] for k in order]
            commands.append(partial(pg.send_query_prepared, name,
                                    tx.dump_sequence(values, [PyFormat.TEXT] * len(values))))
        commands.append(pg.pipeline_sync)
        pg.enter_pipeline_mode()
        try:  # sent (and what came back meanwhile read), then read up to the sync: psycopg's waits, the GIL let go
            results = [r for batch in conn.wait(generators.pipeline_communicate(pg, commands)) for r in batch]
            while not results or results[-1].status != pq.ExecStatus.PIPELINE_SYNC:
                if (result := conn.wait(generators.fetch(pg))) is not None:
                    results.append(result)
        finally:
            pg.exit_pipeline_mode()
        got: object = None
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise errors.error_from_result(result, encoding=conn.info.encoding)
            if result.status == pq.ExecStatus.TUPLES_OK:
                tx.set_pgresult(result)
                got = tx.load_rows(0, result.ntuples, tuple)
        return got

    return {"cursors": cursors, "libpq": libpq}


def main(n: int = 1000, rounds: int = 3) -> None:
    url = make_url(PG_ADMIN).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE rt (id bigserial PRIMARY KEY, k text, v jsonb, n int)")
        conn.execute("CREATE TEMP TABLE rt_u (k text PRIMARY KEY, n int)")
        conn.execute("INSERT INTO rt_u VALUES ('a', 0)")
        ways = senders(conn)
        for name, send in ways.items():  # each reads the SELECT's row back as Python values
            got = send(0)
            assert isinstance(got, list) and len(got) == 1 and isinstance(got[0][0], int), (name, got)
        for _ in range(rounds):
            for name, send in ways.items():
                for i in range(100):
                    send(i)
                wall, cpu = time.perf_counter(), time.thread_time()
                for i in range(n):
                    send(i)
                print(f"{name:8s} wall {(time.perf_counter() - wall) * 1e6 / n:6.1f} µs, "
                      f"client CPU {(time.thread_time() - cpu) * 1e6 / n:6.1f} µs a transaction")


if __name__ == "__main__":
    main()
