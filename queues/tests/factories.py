from __future__ import annotations

import factory

from queues.models import Queue


class QueueFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Queue

    name = factory.Sequence(lambda n: f"queue-{n}")
