"""The operator dashboard under /admin/dashboard/: staff-only HTML pages.

Pages read through querysets shaped for the indexes of `tasks.models` (keyset
pages, no COUNT(*) over history); actions are POSTs that call the domain layer
(`queues.services`, `tasks.transitions`, `dlq.services`).
"""
