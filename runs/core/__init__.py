"""The run's state machine and its records: the lifecycle, its ORM/PostgreSQL writers, events, visibility."""
