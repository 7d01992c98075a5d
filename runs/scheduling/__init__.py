"""How runs enter and wait: enqueue, limits, concurrency settings, queue positions and ETAs."""
