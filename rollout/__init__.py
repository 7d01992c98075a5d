"""Django-free machinery for publishing weights under live traffic: gate, router, scheduler, channel."""

import sys

# asyncio.timeout and ExceptionGroup are used on purpose; fail here with a clear message rather than with an
# AttributeError in the middle of a drain on an older interpreter.
if sys.version_info < (3, 11):  # noqa: UP036  # pragma: no cover - the project pins 3.11
    raise ImportError("rollout requires Python 3.11 or newer (asyncio.timeout)")
