"""How the scheduler calls `generate_group` on its workers: Ray actor handles (ObjectRefs, ray.wait) or local objects.

Both invokers expose submit / wait / outcome / cancel / close so the scheduler loop is the same for both.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from typing import Any, Protocol

from rollout.errors import WorkerLostError
from rollout.invoke import is_ray_actor

log = logging.getLogger(__name__)

OK, LOST, ERROR = "ok", "lost", "error"


class WorkerInvoker(Protocol):
    """What the scheduler needs from its workers. A token stands for one dispatched call and is opaque to the
    scheduler: a concurrent Future for local workers, an ObjectRef for Ray actors."""

    def submit(self, worker: int, group: Any, batch_id: Any) -> Any: ...

    def wait(self, tokens: list[Any], timeout: float) -> list[Any]: ...

    def outcome(self, token: Any) -> tuple[str, Any]: ...

    def finished(self, token: Any) -> bool: ...

    def cancel(self, token: Any) -> None: ...

    def kill(self, worker: int) -> None: ...

    def close(self, deadline: float, alive: list[int]) -> None: ...


class LocalInvoker:
    """In-process workers: `generate_group` returns a GroupResult, a concurrent.futures.Future, or raises."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers

    def submit(self, worker: int, group: Any, batch_id: Any) -> cf.Future[Any]:
        try:
            out = self.workers[worker].generate_group(group, batch_id)
        except BaseException as exc:  # noqa: BLE001 - becomes the call's outcome
            failed: cf.Future[Any] = cf.Future()
            failed.set_exception(exc)
            return failed
        if isinstance(out, cf.Future):
            return out
        fut: cf.Future[Any] = cf.Future()
        fut.set_result(out)
        return fut

    def wait(self, tokens: list[cf.Future[Any]], timeout: float) -> list[cf.Future[Any]]:
        done, _ = cf.wait(tokens, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        # Keep dispatch order so outcomes are processed deterministically.
        return [t for t in tokens if t in done]

    def outcome(self, token: cf.Future[Any]) -> tuple[str, Any]:
        try:
            return OK, token.result(timeout=0)
        except WorkerLostError as exc:
            return LOST, exc
        except cf.CancelledError as exc:
            return LOST, exc
        except Exception as exc:  # noqa: BLE001
            return ERROR, exc

    def finished(self, token: cf.Future[Any]) -> bool:
        return token.done()

    def cancel(self, token: cf.Future[Any]) -> None:
        token.cancel()

    def kill(self, worker: int) -> None:
        pass

    def close(self, deadline: float, alive: list[int]) -> None:
        for handle in (self.workers[i] for i in alive):
            if hasattr(handle, "close"):
                try:
                    handle.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    log.warning("rollout worker close failed", exc_info=True)


class RayInvoker:
    """Ray actor workers: one ObjectRef per dispatched group; a RayActorError means the worker is gone."""

    def __init__(self, workers: list[Any]) -> None:
        import ray

        self.ray = ray
        self.workers = workers

    def submit(self, worker: int, group: Any, batch_id: Any) -> Any:
        return self.workers[worker].generate_group.remote(group, batch_id)

    def wait(self, tokens: list[Any], timeout: float) -> list[Any]:
        done, _ = self.ray.wait(tokens, num_returns=1, timeout=timeout, fetch_local=False)
        if done:
            # Everything that is ready now, not only the first one.
            done, _ = self.ray.wait(tokens, num_returns=len(tokens), timeout=0, fetch_local=False)
        ready = set(done)
        return [t for t in tokens if t in ready]

    def outcome(self, token: Any) -> tuple[str, Any]:
        from ray.exceptions import RayActorError, TaskCancelledError

        try:
            return OK, self.ray.get(token)
        except (RayActorError, TaskCancelledError) as exc:
            return LOST, exc
        except Exception as exc:  # noqa: BLE001
            return ERROR, exc

    def finished(self, token: Any) -> bool:
        done, _ = self.ray.wait([token], num_returns=1, timeout=0, fetch_local=False)
        return bool(done)

    def cancel(self, token: Any) -> None:
        try:
            self.ray.cancel(token)
        except Exception:  # noqa: BLE001 - the task may already be gone with its actor
            pass

    def kill(self, worker: int) -> None:
        try:
            self.ray.kill(self.workers[worker], no_restart=True)
        except Exception:  # noqa: BLE001
            pass

    def close(self, deadline: float, alive: list[int]) -> None:
        refs = []
        for handle in (self.workers[i] for i in alive):
            try:
                refs.append(handle.close.remote())
            except Exception:  # noqa: BLE001 - no close method, or the actor is gone
                pass
        for ref in refs:
            try:
                self.ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001
                log.warning("rollout worker close did not finish before the deadline", exc_info=True)


def make_invoker(workers: list[Any]) -> WorkerInvoker:
    kinds = {is_ray_actor(w) for w in workers}
    if kinds == {True}:
        return RayInvoker(workers)
    if kinds == {False}:
        return LocalInvoker(workers)
    raise ValueError("workers must be all Ray actor handles or all local objects, not a mix")
