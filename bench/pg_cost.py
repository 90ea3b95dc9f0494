"""Postgres CPU per task of the lifecycle's statements alone, without HTTP in between.

    DATABASE_URL=... REDIS_URL=... SECRET_KEY=x python bench/pg_cost.py [--tasks 3000]

Runs the statements the API runs, through `tasks.transitions` (so with its cursors and
prepared statements), from `--threads` threads each on its own connection, and reads
the CPU time of those Postgres backends from /proc (the server must be on this
machine): the single path (create one task buffered, hand it out, ack it: three
commits a task), the batched path (create 1000, then hand out and ack 100 at a
time), enqueue alone, and heartbeats (each thread a worker holding 20 tasks that
heartbeats them in one call, as the SDK's Worker does; per task heartbeat, with
the share of them Postgres wrote as HOT updates).  Much less noisy than
`bench/run.py`'s CPU split when the machine is shared, since nothing but Postgres
is measured; it misses what the API adds around the statements (its queue lookups
and the like).  It migrates the database of DATABASE_URL and leaves its rows there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAYLOAD = {"job": "bench", "args": [1, 2, 3], "note": "x" * 40}
TICKS = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per path and round")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")
    os.environ.setdefault("DATABASE_POOL_MAX", "0")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections, transaction
    from django.utils import timezone

    from queues.models import Queue
    from tasks import transitions
    from workers import protocol

    call_command("migrate", verbosity=0)
    queue = Queue.objects.create(name=f"pg-cost-{uuid.uuid4().hex[:6]}", max_retries=3)

    def single(count: int, pids: list[int]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])
        barrier.wait()
        worker = f"w-{threading.get_ident()}"
        for _ in range(count):
            now = timezone.now()
            [task] = transitions.create(
                [transitions.NewTask(queue, PAYLOAD, 5, now, 3)], buffer=True
            )
            [held] = transitions.hand_out([str(task.pk)], worker_id=worker)
            transitions.ack([(str(held.pk), held.attempts, None)], worker_id=worker)
        connections.close_all()

    def enqueue(count: int, pids: list[int]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])
        barrier.wait()
        for _ in range(count):
            transitions.create(
                [transitions.NewTask(queue, PAYLOAD, 5, timezone.now(), 3)], buffer=True
            )
        connections.close_all()

    def batched(count: int, pids: list[int]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])
        barrier.wait()
        worker = f"w-{threading.get_ident()}"
        done = 0
        while done < count:
            now = timezone.now()
            n = min(1000, count - done)
            with transaction.atomic():
                tasks = transitions.create(
                    [transitions.NewTask(queue, PAYLOAD, 5, now, 3) for _ in range(n)],
                    buffer=True,
                )
            for lo in range(0, n, 100):
                ids = [str(t.pk) for t in tasks[lo : lo + 100]]
                held = transitions.hand_out(ids, worker_id=worker)
                transitions.ack([(str(t.pk), t.attempts, None) for t in held], worker_id=worker)
            done += n
        connections.close_all()

    HELD = 20

    def heartbeat(count: int, pids: list[int]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])
        worker = f"w-{threading.get_ident()}"
        now = timezone.now()
        tasks = transitions.create(
            [transitions.NewTask(queue, PAYLOAD, 5, now, 3) for _ in range(HELD)], buffer=True
        )
        held = transitions.hand_out([str(t.pk) for t in tasks], worker_id=worker)
        items = [protocol.Item(str(t.pk)) for t in held]
        barrier.wait()
        for _ in range(count // HELD):
            protocol.heartbeat(worker, items)
        connections.close_all()

    def hot_updates() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tasks_task'"
            )
            return int(cursor.fetchone()[0])

    results: dict[str, list[float]] = {"single": [], "batched": [], "enqueue": [], "heartbeat": []}
    hot_shares: list[float] = []
    for _ in range(args.rounds):
        for name, run, threads in (
            ("single", single, args.threads),
            ("batched", batched, 2),
            ("enqueue", enqueue, args.threads),
            ("heartbeat", heartbeat, args.threads),
        ):
            per_thread = args.tasks // threads
            barrier = threading.Barrier(threads + 1)
            pids: list[int] = []
            workers = [
                threading.Thread(target=run, args=(per_thread, pids)) for _ in range(threads)
            ]
            for w in workers:
                w.start()
            while len(pids) < threads:
                time.sleep(0.01)
            before = {pid: backend_cpu(pid) for pid in pids}
            hot_before = hot_updates() if name == "heartbeat" else 0
            barrier.wait()
            # Read each backend just before its connection closes: poll until all end.
            last = dict(before)
            while any(w.is_alive() for w in workers):
                for pid in pids:
                    try:
                        last[pid] = backend_cpu(pid)
                    except (FileNotFoundError, ProcessLookupError):
                        pass
                time.sleep(0.02)
            cpu = sum(last[pid] - before[pid] for pid in pids)
            moved = per_thread * threads
            if name == "heartbeat":
                moved = per_thread // HELD * HELD * threads
                time.sleep(0.6)  # the backends' statistics reach the shared counts
                hot_shares.append((hot_updates() - hot_before) / moved)
            results[name].append(cpu / moved * 1000)
    for name, values in results.items():
        print(
            f"{name:8s} Postgres CPU per task: median {statistics.median(values):.3f} ms "
            f"({', '.join(f'{v:.3f}' for v in values)})"
        )
    print(
        "heartbeat HOT updates: "
        + ", ".join(f"{share:.0%}" for share in hot_shares)
        + " of the task heartbeats"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
