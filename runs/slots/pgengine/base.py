"""Django's PostgreSQL backend, plus one rule of the grant lock: a transaction that took the lock runs the
grant catch-up once it has ended, whether it committed or rolled back.

On PostgreSQL a release commits without the lock and, when its try finds the lock taken, leaves the grant to
the holder (runs/slots/store.py, docs/slots.md). A holder that commits catches up through its `on_commit`
hook; one that rolls back (a refused submit, a cancel of a run that just finished, a settings change that fails
validation) would otherwise run nothing, and the freed slot would wait for the tick. Django has no rollback
hook, so this backend notes at rollback that the lock was held and runs the catch-up where Django runs commit
hooks: when autocommit is switched back on after the transaction, outside any atomic block.
"""

from __future__ import annotations

import logging

from django.db.backends.postgresql import base

logger = logging.getLogger(__name__)


class DatabaseWrapper(base.DatabaseWrapper):
    catch_up_due = False

    def rollback(self) -> None:
        from runs.slots import store  # the backend loads before the apps

        held = store.lock_held_on(self)
        super().rollback()
        if held:
            self.catch_up_due = True
            if self.get_autocommit():  # an explicit rollback outside an atomic block
                self._catch_up()

    def set_autocommit(self, autocommit: bool, force_begin_transaction_with_broken_autocommit: bool = False) -> None:
        super().set_autocommit(autocommit, force_begin_transaction_with_broken_autocommit)
        if autocommit and self.catch_up_due:
            self._catch_up()

    def close(self) -> None:
        self.catch_up_due = False  # a closed session holds no lock and a new one owes nothing
        super().close()

    def _catch_up(self) -> None:
        self.catch_up_due = False
        from runs.slots import store

        try:
            store.after_rollback()
        except Exception:  # noqa: BLE001 - as robust on_commit hooks: logged, and the tick catches up
            logger.exception("grant catch-up after a rollback failed; the tick grants")
