"""The transactional outbox of the run lifecycle: what a committed move must still cause (launch a granted run,
stop a job, the follow-ups of a finish) is stored as rows in the move's own transaction and done after the commit
by the drainer, exactly once per key (docs/execution.md, "After-commit effects")."""
