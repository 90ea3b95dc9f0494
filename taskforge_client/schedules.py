"""The cron schedules' calls of the SDK (admin): `TaskForge` has them from `Schedules`."""

from __future__ import annotations

from typing import Any

from taskforge_client.http import Http
from taskforge_client.http import segment as _q
from taskforge_client.models import Schedule

# An argument left out (as opposed to None, which some settings take as "remove").
UNSET: Any = object()


class Schedules(Http):
    def create_schedule(
        self,
        queue: str,
        name: str,
        cron: str,
        payload: Any,
        *,
        timezone: str | None = None,
        priority: int | None = None,
        max_retries: int | None = None,
        paused: bool | None = None,
    ) -> Schedule:
        """Enqueue `payload` into `queue` at each time `cron` names (in `timezone`, default UTC).

        `cron` is a 5-field expression or `@hourly`, `@daily`, ...; `Invalid` when it or
        the time zone does not parse, `Conflict` (`schedule_exists`) when the queue has a
        schedule of that name.
        """
        body: dict[str, Any] = {"name": name, "cron": cron, "payload": payload}
        optional = {
            "timezone": timezone,
            "priority": priority,
            "max_retries": max_retries,
            "paused": paused,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        return Schedule.from_dict(self.request("POST", f"/queues/{_q(queue)}/schedules", body))

    def list_schedules(self, queue: str, *, limit: int | None = None) -> list[Schedule]:
        """The queue's schedules by name (all, following pages, or the first `limit`)."""
        path = f"/queues/{_q(queue)}/schedules"
        return list(self._paginate(path, {}, Schedule.from_dict, limit))

    def get_schedule(self, queue: str, name: str) -> Schedule:
        """One schedule; `NotFound` when the queue has none of that name."""
        return Schedule.from_dict(self.request("GET", _schedule_path(queue, name)))

    def update_schedule(
        self,
        queue: str,
        name: str,
        *,
        cron: str | None = None,
        timezone: str | None = None,
        payload: Any = UNSET,
        priority: int | None = None,
        max_retries: int | None = UNSET,
        paused: bool | None = None,
    ) -> Schedule:
        """Change a schedule (not its name). `max_retries=None` falls back to the queue's."""
        body: dict[str, Any] = {}
        for key, value in {"cron": cron, "timezone": timezone, "priority": priority}.items():
            if value is not None:
                body[key] = value
        if payload is not UNSET:
            body["payload"] = payload
        if max_retries is not UNSET:
            body["max_retries"] = max_retries
        if paused is not None:
            body["paused"] = paused
        return Schedule.from_dict(self.request("PATCH", _schedule_path(queue, name), body))

    def pause_schedule(self, queue: str, name: str) -> Schedule:
        """Stop a schedule enqueueing; resumed, it enqueues the latest missed time once."""
        return self.update_schedule(queue, name, paused=True)

    def resume_schedule(self, queue: str, name: str) -> Schedule:
        """Resume a paused schedule."""
        return self.update_schedule(queue, name, paused=False)

    def delete_schedule(self, queue: str, name: str) -> None:
        """Delete a schedule; the tasks it enqueued stay."""
        self.request("DELETE", _schedule_path(queue, name))


def _schedule_path(queue: str, name: str) -> str:
    return f"/queues/{_q(queue)}/schedules/{_q(name)}"
