"""Page views, one module per area: auth (login/logout), settings (concurrency), dashboard (board, run, submit)."""
